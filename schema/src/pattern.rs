//! The `pattern` keyword of the schema profile: a small regular-expression engine for the subset
//! of ECMA-262 the canonical schema uses (docs/schema.md, "Patterns"), so the runtime validator
//! needs no general regex engine and its Unicode tables.
//!
//! Supported: literals, `\`-escaped punctuation, `.`, classes `[a-z0-9_.-]` (ranges, escapes,
//! `^` negation), groups `(…)` / `(?:…)`, alternation `|`, the greedy quantifiers `? * + {n}
//! {n,} {n,m}` (bounded at 1,000), and the anchors `^` / `$`. Anything else (`\d`, look-arounds,
//! back-references, lazy quantifiers, flags) is refused when the schema is compiled, so a schema
//! change that needs more fails every test instead of matching differently.
//!
//! Matching is a Thompson NFA simulation: linear in the subject's length times the program's,
//! never backtracking, so no subject can make a pattern slow. Like ECMA-262 `RegExp.test`, a
//! pattern matches anywhere unless anchored; `$` matches only at the very end (no final-newline
//! exception, unlike Python's `re`); code points, not UTF-16 units, are the unit.

use std::fmt;

/// The most a counted quantifier may repeat (`{0,1000}`): the program grows with the count.
const MAX_COUNT: u32 = 1_000;
/// The most instructions one compiled pattern may have.
const MAX_PROGRAM: usize = 20_000;

/// Why a pattern is outside the supported subset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternError {
    pub pattern: String,
    pub at: usize,
    pub reason: &'static str,
}

impl fmt::Display for PatternError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pattern {:?} at character {}: {}",
            self.pattern, self.at, self.reason
        )
    }
}

impl std::error::Error for PatternError {}

#[derive(Debug, Clone)]
struct Class {
    ranges: Vec<(char, char)>,
    negated: bool,
    /// The answer for every ASCII character, as a bit set (the schema's classes are ASCII); the
    /// upper half, for bytes 128–255, stays empty so a byte test never answers for a non-ASCII one.
    ascii: [u64; 4],
}

impl Class {
    fn new(ranges: Vec<(char, char)>, negated: bool) -> Class {
        let mut class = Class {
            ranges,
            negated,
            ascii: [0; 4],
        };
        for b in 0..128u8 {
            if class.slow_matches(char::from(b)) {
                class.ascii[usize::from(b >> 6)] |= 1 << (b & 63);
            }
        }
        class
    }

    fn slow_matches(&self, c: char) -> bool {
        self.ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != self.negated
    }

    fn matches(&self, c: char) -> bool {
        if c.is_ascii() {
            self.matches_byte(c as u8)
        } else {
            self.slow_matches(c)
        }
    }

    /// For an ASCII byte (false for any other byte).
    fn matches_byte(&self, b: u8) -> bool {
        self.ascii[usize::from(b >> 6)] & (1 << (b & 63)) != 0
    }
}

#[derive(Debug, Clone)]
enum Ast {
    Class(Class),
    Start,
    End,
    Concat(Vec<Ast>),
    Alt(Vec<Ast>),
    Repeat {
        inner: Box<Ast>,
        min: u32,
        max: Option<u32>,
    },
}

struct Parser<'a> {
    src: &'a str,
    chars: Vec<char>,
    pos: usize,
}

impl Parser<'_> {
    fn fail<T>(&self, reason: &'static str) -> Result<T, PatternError> {
        Err(PatternError {
            pattern: self.src.to_string(),
            at: self.pos,
            reason,
        })
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn alternation(&mut self) -> Result<Ast, PatternError> {
        let mut branches = vec![self.concat()?];
        while self.eat('|') {
            branches.push(self.concat()?);
        }
        Ok(if branches.len() == 1 {
            branches.pop().expect("one branch")
        } else {
            Ast::Alt(branches)
        })
    }

    fn concat(&mut self) -> Result<Ast, PatternError> {
        let mut items = Vec::new();
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' {
                break;
            }
            let atom = self.atom()?;
            let atom = self.quantified(atom)?;
            items.push(atom);
        }
        Ok(Ast::Concat(items))
    }

    fn atom(&mut self) -> Result<Ast, PatternError> {
        let c = self.peek().expect("concat checked");
        self.pos += 1;
        Ok(match c {
            '^' => Ast::Start,
            '$' => Ast::End,
            // ECMA-262 `.` without the `s` flag: anything but a line terminator.
            '.' => Ast::Class(Class::new(
                vec![('\n', '\n'), ('\r', '\r'), ('\u{2028}', '\u{2029}')],
                true,
            )),
            '(' => {
                if self.eat('?') && !self.eat(':') {
                    return self.fail("only the non-capturing group (?:…) is supported");
                }
                let inner = self.alternation()?;
                if !self.eat(')') {
                    return self.fail("unclosed group");
                }
                inner
            }
            ')' => return self.fail("unmatched )"),
            '[' => Ast::Class(self.class()?),
            '\\' => {
                let e = self.escape()?;
                Ast::Class(Class::new(vec![(e, e)], false))
            }
            '*' | '+' | '?' | '{' => return self.fail("a quantifier with nothing to repeat"),
            ']' | '}' => return self.fail("a bare ] or } (escape it)"),
            lit => Ast::Class(Class::new(vec![(lit, lit)], false)),
        })
    }

    /// After a `\`: only punctuation escapes are supported (they stand for themselves).
    fn escape(&mut self) -> Result<char, PatternError> {
        match self.peek() {
            Some(c) if c.is_ascii_punctuation() => {
                self.pos += 1;
                Ok(c)
            }
            Some(_) => {
                self.fail("only escaped punctuation is supported (no \\d, \\w, \\s, \\b, \\u…)")
            }
            None => self.fail("a trailing backslash"),
        }
    }

    fn class(&mut self) -> Result<Class, PatternError> {
        let negated = self.eat('^');
        let mut ranges = Vec::new();
        let mut first = true;
        loop {
            let Some(c) = self.peek() else {
                return self.fail("unclosed character class");
            };
            if c == ']' && !first {
                self.pos += 1;
                break;
            }
            if c == '[' {
                return self.fail("a [ inside a class (escape it)");
            }
            first = false;
            let lo = self.class_char()?;
            // `a-z` is a range; a `-` first, last or after a range is a literal.
            if self.peek() == Some('-') && self.chars.get(self.pos + 1).is_some_and(|&n| n != ']') {
                self.pos += 1;
                let hi = self.class_char()?;
                if hi < lo {
                    return self.fail("a range out of order");
                }
                ranges.push((lo, hi));
            } else {
                ranges.push((lo, lo));
            }
        }
        Ok(Class::new(ranges, negated))
    }

    fn class_char(&mut self) -> Result<char, PatternError> {
        let c = self.peek().expect("class checked");
        self.pos += 1;
        if c == '\\' {
            self.escape()
        } else {
            Ok(c)
        }
    }

    fn quantified(&mut self, atom: Ast) -> Result<Ast, PatternError> {
        let (min, max) = match self.peek() {
            Some('?') => (0, Some(1)),
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('{') => {
                self.pos += 1;
                let min = self.number()?;
                let max = if self.eat(',') {
                    if self.peek() == Some('}') {
                        None
                    } else {
                        Some(self.number()?)
                    }
                } else {
                    Some(min)
                };
                if self.peek() != Some('}') {
                    return self.fail("a counted quantifier is {n}, {n,} or {n,m}");
                }
                if max.is_some_and(|m| m < min) {
                    return self.fail("a counted quantifier {n,m} with m < n");
                }
                (min, max)
            }
            _ => return Ok(atom),
        };
        self.pos += 1;
        if matches!(atom, Ast::Start | Ast::End) {
            return self.fail("a quantified anchor");
        }
        if matches!(self.peek(), Some('?' | '*' | '+' | '{')) {
            return self.fail("lazy or stacked quantifiers are not supported");
        }
        Ok(Ast::Repeat {
            inner: Box::new(atom),
            min,
            max,
        })
    }

    fn number(&mut self) -> Result<u32, PatternError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let digits: String = self.chars[start..self.pos].iter().collect();
        match digits.parse::<u32>() {
            Ok(n) if n <= MAX_COUNT => Ok(n),
            Ok(_) => self.fail("a count above 1000"),
            Err(_) => self.fail("a counted quantifier needs a number"),
        }
    }
}

#[derive(Debug, Clone)]
enum Inst {
    Class(Class),
    Split(usize, usize),
    Jump(usize),
    Start,
    End,
    Match,
}

/// A compiled pattern.
#[derive(Debug, Clone)]
pub struct Pattern {
    source: String,
    /// `^` (class{min,max})* `$` where greedy matching is exact (see [`segments`]): matched in
    /// one pass with no NFA. Most identifiers and digests of the schema have this shape.
    simple: Option<Vec<(Class, u32, u32)>>,
    /// The program as a DFA over ASCII, when it is anchored and small enough (see [`Dfa`]).
    dfa: Option<Dfa>,
    program: Vec<Inst>,
    /// Begins with `^` outside any group or alternation: only position 0 can start a match.
    anchored: bool,
}

impl Pattern {
    /// Compiles `source`, refusing anything outside the supported subset.
    pub fn new(source: &str) -> Result<Pattern, PatternError> {
        Pattern::compile(source, false)
    }

    /// `new`; `general` leaves out the one-pass shape (tests hold the other matchers to it).
    fn compile(source: &str, general: bool) -> Result<Pattern, PatternError> {
        let mut parser = Parser {
            src: source,
            chars: source.chars().collect(),
            pos: 0,
        };
        let ast = parser.alternation()?;
        if parser.pos != parser.chars.len() {
            return parser.fail("unmatched )");
        }
        let anchored =
            matches!(&ast, Ast::Concat(items) if matches!(items.first(), Some(Ast::Start)));
        let mut program = Vec::new();
        emit(&ast, &mut program);
        program.push(Inst::Match);
        if program.len() > MAX_PROGRAM {
            parser.pos = 0;
            return parser.fail("the pattern expands past 20,000 instructions");
        }
        let simple = if general { None } else { segments(&ast) };
        // A one-pass shape answers every subject itself: neither the DFA nor the program would
        // ever run, and for counted classes (`{0,700}`) they are most of a pattern's memory.
        let (dfa, program) = match simple {
            Some(_) => (None, Vec::new()),
            None if anchored => (Dfa::build(&program), program),
            None => (None, program),
        };
        Ok(Pattern {
            source: source.to_string(),
            simple,
            dfa,
            program,
            anchored,
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// True if the pattern matches anywhere in `subject` (ECMA-262 `RegExp.prototype.test`).
    pub fn is_match(&self, subject: &str) -> bool {
        // Fastest first: one pass over segments, the DFA (ASCII subjects), the bounded
        // backtracker (short subjects), and the NFA, which takes anything.
        if let Some(segments) = &self.simple {
            let bytes = subject.as_bytes();
            let mut at = 0;
            for (class, min, max) in segments {
                let max = *max as usize;
                // A run of matching ASCII bytes (the common case), then character by character
                // only if a non-ASCII byte stopped it.
                let limit = max.min(bytes.len() - at);
                let mut taken = bytes[at..at + limit]
                    .iter()
                    .position(|&b| !class.matches_byte(b))
                    .unwrap_or(limit);
                at += taken;
                while taken < max && at < bytes.len() && !bytes[at].is_ascii() {
                    match subject[at..].chars().next() {
                        Some(c) if class.matches(c) => {
                            at += c.len_utf8();
                            taken += 1;
                        }
                        _ => break,
                    }
                    // Back to bytes: ASCII characters after it.
                    while taken < max && at < bytes.len() && class.matches_byte(bytes[at]) {
                        at += 1;
                        taken += 1;
                    }
                }
                if taken < *min as usize {
                    return false;
                }
            }
            return at == bytes.len();
        }
        if let Some(answer) = self.dfa.as_ref().and_then(|d| d.run(subject.as_bytes())) {
            return answer;
        }
        if let Some(answer) = self.bounded_backtrack(subject) {
            return answer;
        }
        let n = self.program.len();
        let mut current = Threads::new(n);
        let mut next = Threads::new(n);
        let mut stack = Vec::new();
        let end = subject.len();
        let mut chars = subject.char_indices();
        let mut at = 0;
        loop {
            // An unanchored search starts a thread at every position; an anchored one only at 0.
            if (at == 0 || !self.anchored) && self.add(&mut current, &mut stack, 0, at, end) {
                return true;
            }
            let Some((_, c)) = chars.next() else {
                return false;
            };
            let after = at + c.len_utf8();
            next.clear();
            for i in 0..current.len() {
                let pc = current.dense[i];
                if let Inst::Class(class) = &self.program[pc] {
                    if class.matches(c) && self.add(&mut next, &mut stack, pc + 1, after, end) {
                        return true;
                    }
                }
            }
            if next.len() == 0 && self.anchored {
                return false;
            }
            std::mem::swap(&mut current, &mut next);
            at = after;
        }
    }

    /// An anchored pattern on a short subject: a depth-first walk of the program that never visits
    /// one (instruction, position) pair twice, so it is linear like the NFA but runs straight
    /// through a pattern whose choices the next character decides (timestamps, scopes). `None`
    /// when the visited set would exceed 32 KiB (long subjects take the NFA).
    fn bounded_backtrack(&self, subject: &str) -> Option<bool> {
        const MAX_BITS: usize = 256 * 1024;
        if !self.anchored {
            return None;
        }
        let width = subject.len() + 1;
        let bits = self.program.len().checked_mul(width)?;
        if bits > MAX_BITS {
            return None;
        }
        let mut visited = vec![0u64; bits.div_ceil(64)];
        let mut stack = vec![(0usize, 0usize)];
        while let Some((mut pc, mut at)) = stack.pop() {
            loop {
                let bit = pc * width + at;
                if visited[bit / 64] & (1 << (bit % 64)) != 0 {
                    break;
                }
                visited[bit / 64] |= 1 << (bit % 64);
                match &self.program[pc] {
                    Inst::Match => return Some(true),
                    Inst::Jump(to) => pc = *to,
                    Inst::Split(a, b) => {
                        stack.push((*b, at));
                        pc = *a;
                    }
                    Inst::Start if at == 0 => pc += 1,
                    Inst::End if at == subject.len() => pc += 1,
                    Inst::Start | Inst::End => break,
                    Inst::Class(class) => match subject[at..].chars().next() {
                        Some(c) if class.matches(c) => {
                            at += c.len_utf8();
                            pc += 1;
                        }
                        _ => break,
                    },
                }
            }
        }
        Some(false)
    }

    /// Follows the empty moves from `pc` at byte offset `at`; true when one reaches `Match`.
    fn add(
        &self,
        set: &mut Threads,
        stack: &mut Vec<usize>,
        pc: usize,
        at: usize,
        end: usize,
    ) -> bool {
        stack.clear();
        stack.push(pc);
        while let Some(pc) = stack.pop() {
            if !set.insert(pc) {
                continue;
            }
            match &self.program[pc] {
                Inst::Match => return true,
                Inst::Jump(to) => stack.push(*to),
                Inst::Split(a, b) => {
                    // Preference order does not matter for a yes/no answer.
                    stack.push(*b);
                    stack.push(*a);
                }
                Inst::Start => {
                    if at == 0 {
                        stack.push(pc + 1);
                    }
                }
                Inst::End => {
                    if at == end {
                        stack.push(pc + 1);
                    }
                }
                Inst::Class(_) => {}
            }
        }
        false
    }
}

/// An anchored program compiled to a deterministic automaton over ASCII bytes by subset
/// construction: one table lookup per byte. ASCII bytes are grouped into classes the program
/// cannot tell apart, so the table is states × classes. A subject with a non-ASCII byte is left
/// to the other matchers. Built only up to `MAX_STATES` states.
#[derive(Debug, Clone)]
struct Dfa {
    byte_class: [u8; 128],
    classes: usize,
    /// `state * classes + class` → the next state's row (`next_state * classes`); `DEAD` when
    /// nothing can match any more.
    next: Vec<u32>,
    /// A match is complete here whatever follows (the search stops).
    matched: Vec<bool>,
    /// A match is complete if the subject ends here (`$` satisfied).
    at_end: Vec<bool>,
}

const DEAD: u32 = u32::MAX;
const MAX_STATES: usize = 2_048;

impl Dfa {
    /// The instructions waiting on a character or on the end, reached from `from` by empty
    /// moves, and whether `Match` was reached.
    fn closure(
        program: &[Inst],
        from: &[usize],
        at_start: bool,
        at_end: bool,
    ) -> (Vec<usize>, bool) {
        let mut seen = vec![false; program.len()];
        let mut stack: Vec<usize> = from.to_vec();
        let mut out = Vec::new();
        let mut matched = false;
        while let Some(pc) = stack.pop() {
            if std::mem::replace(&mut seen[pc], true) {
                continue;
            }
            match &program[pc] {
                Inst::Match => matched = true,
                Inst::Jump(to) => stack.push(*to),
                Inst::Split(a, b) => {
                    stack.push(*b);
                    stack.push(*a);
                }
                Inst::Start if at_start => stack.push(pc + 1),
                Inst::End if at_end => stack.push(pc + 1),
                Inst::End => out.push(pc),
                Inst::Start => {}
                Inst::Class(_) => out.push(pc),
            }
        }
        out.sort_unstable();
        (out, matched)
    }

    fn build(program: &[Inst]) -> Option<Dfa> {
        // Bytes that every class instruction treats alike share a column.
        let mut byte_class = [0u8; 128];
        let mut signatures: Vec<Vec<bool>> = Vec::new();
        for b in 0..128u8 {
            let sig: Vec<bool> = program
                .iter()
                .filter_map(|i| match i {
                    Inst::Class(c) => Some(c.matches_byte(b)),
                    _ => None,
                })
                .collect();
            let id = match signatures.iter().position(|s| *s == sig) {
                Some(id) => id,
                None => {
                    signatures.push(sig);
                    signatures.len() - 1
                }
            };
            byte_class[usize::from(b)] = u8::try_from(id).ok()?;
        }
        let classes = signatures.len();
        let representative: Vec<u8> = (0..classes)
            .map(|c| {
                (0..128u8)
                    .find(|&b| usize::from(byte_class[usize::from(b)]) == c)
                    .expect("a member")
            })
            .collect();
        let mut dfa = Dfa {
            byte_class,
            classes,
            next: Vec::new(),
            matched: Vec::new(),
            at_end: Vec::new(),
        };
        let mut states: Vec<Vec<usize>> = Vec::new();
        // Keyed on the flags too: the start state's closure is taken where `^` holds, so the
        // same frontier reached later can differ in what it accepts.
        let mut index: std::collections::HashMap<(Vec<usize>, bool, bool), u32> =
            std::collections::HashMap::new();
        let (start, start_matched) = Self::closure(program, &[0], true, false);
        // Position 0 is also where `^` holds: the empty subject is judged with both anchors.
        let empty_ok = Self::closure(program, &[0], true, true).1;
        let mut add = |set: Vec<usize>,
                       matched: bool,
                       end_ok: bool,
                       dfa: &mut Dfa,
                       states: &mut Vec<Vec<usize>>|
         -> Option<u32> {
            let key = (set, matched, end_ok);
            if let Some(&id) = index.get(&key) {
                return Some(id);
            }
            if states.len() >= MAX_STATES {
                return None;
            }
            let id = u32::try_from(states.len()).ok()?;
            states.push(key.0.clone());
            index.insert(key, id);
            dfa.matched.push(matched);
            dfa.at_end.push(end_ok || matched);
            dfa.next.extend(std::iter::repeat_n(DEAD, classes));
            Some(id)
        };
        add(start, start_matched, empty_ok, &mut dfa, &mut states)?;
        let mut todo = 0;
        while todo < states.len() {
            let set = states[todo].clone();
            if dfa.matched[todo] {
                // Matched: the search is over whatever follows.
                for class in 0..classes {
                    dfa.next[todo * classes + class] = u32::try_from(todo * classes).ok()?;
                }
                todo += 1;
                continue;
            }
            for (class, &b) in representative.iter().enumerate() {
                let moved: Vec<usize> = set
                    .iter()
                    .filter(|&&pc| matches!(&program[pc], Inst::Class(c) if c.matches_byte(b)))
                    .map(|&pc| pc + 1)
                    .collect();
                if moved.is_empty() {
                    continue;
                }
                let (next, matched) = Self::closure(program, &moved, false, false);
                if next.is_empty() && !matched {
                    continue;
                }
                let ends: Vec<usize> = next
                    .iter()
                    .filter(|&&pc| matches!(program[pc], Inst::End))
                    .map(|&pc| pc + 1)
                    .collect();
                let end_ok = !ends.is_empty() && Self::closure(program, &ends, false, true).1;
                let id = add(next, matched, end_ok, &mut dfa, &mut states)?;
                dfa.next[todo * classes + class] = id.checked_mul(u32::try_from(classes).ok()?)?;
            }
            todo += 1;
        }
        Some(dfa)
    }

    /// The answer, or `None` for a subject with a non-ASCII byte.
    fn run(&self, subject: &[u8]) -> Option<bool> {
        // A matched state only loops to itself (see `build`), so it is checked once, at the end.
        let mut at = 0usize;
        for &b in subject {
            if !b.is_ascii() {
                return None;
            }
            let next = self.next[at + usize::from(self.byte_class[usize::from(b)])];
            if next == DEAD {
                return Some(false);
            }
            at = next as usize;
        }
        Some(self.at_end[at / self.classes])
    }
}

/// The segments of a pattern `^ s1 s2 … $` whose every item is a class, once or counted, when
/// taking as many characters as possible at each segment is exact: every segment of variable
/// length shares no character with any later segment (so no character it takes could have been
/// needed later, and one it leaves could not be taken later). `None` for anything else.
fn segments(ast: &Ast) -> Option<Vec<(Class, u32, u32)>> {
    let Ast::Concat(items) = ast else { return None };
    let (Some(Ast::Start), Some(Ast::End)) = (items.first(), items.last()) else {
        return None;
    };
    let mut out: Vec<(Class, u32, u32)> = Vec::new();
    for item in &items[1..items.len() - 1] {
        let seg = match item {
            Ast::Class(c) => (c.clone(), 1, 1),
            Ast::Repeat {
                inner,
                min,
                max: Some(max),
            } => match inner.as_ref() {
                Ast::Class(c) => (c.clone(), *min, *max),
                _ => return None,
            },
            _ => return None,
        };
        if seg.0.negated {
            return None;
        }
        out.push(seg);
    }
    let disjoint = |a: &Class, b: &Class| {
        !a.ranges
            .iter()
            .any(|&(alo, ahi)| b.ranges.iter().any(|&(blo, bhi)| alo <= bhi && blo <= ahi))
    };
    for (i, (a, min, max)) in out.iter().enumerate() {
        if min != max && !out[i + 1..].iter().all(|(b, _, _)| disjoint(a, b)) {
            return None;
        }
    }
    Some(out)
}

fn emit(ast: &Ast, out: &mut Vec<Inst>) {
    match ast {
        Ast::Class(c) => out.push(Inst::Class(c.clone())),
        Ast::Start => out.push(Inst::Start),
        Ast::End => out.push(Inst::End),
        Ast::Concat(items) => items.iter().for_each(|a| emit(a, out)),
        Ast::Alt(branches) => {
            // split L1, next; L1: a; jump end; next: split …
            let mut jumps = Vec::new();
            for (i, b) in branches.iter().enumerate() {
                if i + 1 < branches.len() {
                    let split = out.len();
                    out.push(Inst::Split(split + 1, 0));
                    emit(b, out);
                    jumps.push(out.len());
                    out.push(Inst::Jump(0));
                    let here = out.len();
                    out[split] = Inst::Split(split + 1, here);
                } else {
                    emit(b, out);
                }
            }
            let end = out.len();
            for j in jumps {
                out[j] = Inst::Jump(end);
            }
        }
        Ast::Repeat { inner, min, max } => {
            for _ in 0..*min {
                emit(inner, out);
            }
            match max {
                None => {
                    // L: split body, end; body; jump L
                    let split = out.len();
                    out.push(Inst::Split(split + 1, 0));
                    emit(inner, out);
                    out.push(Inst::Jump(split));
                    let end = out.len();
                    out[split] = Inst::Split(split + 1, end);
                }
                Some(max) => {
                    // Each optional copy: split body, end.
                    let mut splits = Vec::new();
                    for _ in *min..*max {
                        splits.push(out.len());
                        out.push(Inst::Split(0, 0));
                        emit(inner, out);
                    }
                    let end = out.len();
                    for s in splits {
                        out[s] = Inst::Split(s + 1, end);
                    }
                }
            }
        }
    }
}

/// A sparse set of program counters (one NFA state per instruction).
struct Threads {
    dense: Vec<usize>,
    sparse: Vec<usize>,
}

impl Threads {
    fn new(n: usize) -> Threads {
        Threads {
            dense: Vec::with_capacity(n),
            sparse: vec![usize::MAX; n],
        }
    }

    fn len(&self) -> usize {
        self.dense.len()
    }

    fn insert(&mut self, pc: usize) -> bool {
        let i = self.sparse[pc];
        if i < self.dense.len() && self.dense[i] == pc {
            return false;
        }
        self.sparse[pc] = self.dense.len();
        self.dense.push(pc);
        true
    }

    fn clear(&mut self) {
        self.dense.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, s: &str) -> bool {
        Pattern::new(p).unwrap().is_match(s)
    }

    #[test]
    fn anchored_classes_and_counts() {
        let id = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$";
        assert!(m(id, "thr_01"));
        assert!(m(id, &"a".repeat(64)));
        assert!(!m(id, &"a".repeat(65)));
        assert!(!m(id, "_a"));
        assert!(!m(id, ""));
        assert!(
            !m(id, "thr_01\n"),
            "$ is the very end, never before a final newline"
        );
        assert!(!m(id, "a/b"));
        assert!(!m(id, "é"));
    }

    #[test]
    fn groups_alternation_and_optional_parts() {
        let scope = r"^(\*|[a-z][a-z0-9_-]{0,31}(:[A-Za-z0-9*][A-Za-z0-9_.:*-]{0,127})?)$";
        for ok in ["*", "fs", "fs:read", "net:*.example.com", "a-b_c:x"] {
            assert!(m(scope, ok), "{ok}");
        }
        for bad in ["**", "Fs", "fs:", "fs:-x", "*:x", ""] {
            assert!(!m(scope, bad), "{bad}");
        }
        let ts = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})$";
        assert!(m(ts, "2026-01-01T00:00:00Z"));
        assert!(m(ts, "2026-01-01T00:00:00.123456789+01:00"));
        assert!(!m(ts, "2026-01-01T00:00:00.1234567890Z"));
        assert!(!m(ts, "2026-01-01 00:00:00Z"));
    }

    #[test]
    fn unanchored_patterns_search() {
        assert!(m("b+", "abbbc"));
        assert!(!m("^b+", "abbbc"));
        assert!(m("a|^z", "xa"));
        assert!(m("", "anything"));
        assert!(m("x*", ""));
        assert!(m("^a.c$", "abc") && !m("^a.c$", "a\nc"));
        assert!(m("^[^a-c]$", "d") && !m("^[^a-c]$", "b"));
        assert!(m("^[-a]$", "-") && m("^[a-]$", "-") && !m("^[a-]$", "b"));
    }

    #[test]
    fn outside_the_subset_is_refused() {
        for bad in [
            r"\d", r"\w+", "(?=a)", "(?<n>a)", "a*?", "a{2,1}", "a{1001}", "(a", "a)", "[a", "*a",
            "^*", r"a\", "[z-a]", "a{,3}",
        ] {
            assert!(Pattern::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_one_pass_shape_agrees_with_the_nfa() {
        for p in [
            "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$",
            "^sha256:[0-9a-f]{64}$",
            "^[0-9a-f]{32,64}$",
            "^[a-z]{1,3}[0-9]{2}$",
        ] {
            let fast = Pattern::new(p).unwrap();
            assert!(fast.simple.is_some(), "{p}");
            assert!(fast.program.is_empty() && fast.dfa.is_none(), "{p}");
            let slow = Pattern::compile(p, true).unwrap();
            assert!(slow.simple.is_none() && !slow.program.is_empty(), "{p}");
            for s in [
                "",
                "a",
                "a1",
                "ab12",
                "abc12",
                "abcd12",
                "a-b",
                "_a",
                &"f".repeat(64),
                &"f".repeat(65),
                &format!("sha256:{}", "0".repeat(64)),
                "ab1",
                "a12\n",
            ] {
                assert_eq!(fast.is_match(s), slow.is_match(s), "{p} on {s:?}");
            }
        }
        // Overlapping variable segments are left to the NFA: greedy would be wrong here.
        let overlap = Pattern::new("^[a-z]{0,3}[a-c]$").unwrap();
        assert!(overlap.simple.is_none());
        assert!(overlap.is_match("abc"));
        let later = Pattern::new("^a{0,3}b?a$").unwrap();
        assert!(later.simple.is_none());
        assert!(later.is_match("aaa"));
    }

    #[test]
    fn the_three_matchers_agree() {
        let ts = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})$";
        let scope = r"^(\*|[a-z][a-z0-9_-]{0,31}(:[A-Za-z0-9*][A-Za-z0-9_.:*-]{0,127})?)$";
        for p in [ts, scope, "^(a|a?){0,30}b$", "^a{0,3}b?a$"] {
            let full = Pattern::new(p).unwrap();
            assert!(full.dfa.is_some(), "{p}");
            let nfa_only = Pattern {
                anchored: false,
                dfa: None,
                ..Pattern::compile(p, true).unwrap()
            };
            for s in [
                "",
                "a",
                "aaa",
                "aab",
                "ab",
                "b",
                "*",
                "fs:read",
                "fs:",
                "2026-01-01T00:00:00Z",
                "2026-01-01T00:00:00.5+01:00",
                "2026-01-01T00:00:00.Z",
                &"a".repeat(31),
                &format!("{}b", "a".repeat(30)),
            ] {
                assert_eq!(
                    full.bounded_backtrack(s),
                    Some(nfa_only.is_match(s)),
                    "{p} on {s:?}"
                );
                if let Some(dfa) = &full.dfa {
                    assert_eq!(
                        dfa.run(s.as_bytes()).unwrap_or(nfa_only.is_match(s)),
                        nfa_only.is_match(s),
                        "dfa: {p} on {s:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_dfa_agrees_where_anchors_sit_inside_alternatives() {
        // The start state is closed where `^` holds; a frontier reached later can be the same
        // instructions yet accept differently, so the DFA must not merge the two.
        for p in [
            "^x*$^",
            "^(x|$^)*$",
            "(^|x)ab",
            "a|^$",
            "^$|b*c",
            "x?^a",
            "(^a|b)*$",
            "^(|a)$|a$",
            "b|^a*$",
        ] {
            let full = Pattern::new(p).unwrap();
            let nfa_only = Pattern {
                anchored: false,
                dfa: None,
                ..Pattern::compile(p, true).unwrap()
            };
            for s in [
                "", "x", "xx", "a", "aa", "ab", "xab", "xxab", "b", "ba", "bc", "c", "xa", "aab",
            ] {
                let want = nfa_only.is_match(s);
                assert_eq!(full.is_match(s), want, "{p} on {s:?}");
                if let Some(dfa) = &full.dfa {
                    assert_eq!(dfa.run(s.as_bytes()), Some(want), "dfa: {p} on {s:?}");
                }
            }
        }
    }

    #[test]
    fn no_subject_is_slow() {
        // A backtracking engine would take exponential time on this; the NFA is linear.
        let p = Pattern::new("^(a|a?){0,30}b$").unwrap();
        assert!(!p.is_match(&"a".repeat(30)));
        assert!(p.is_match(&format!("{}b", "a".repeat(30))));
    }
}
