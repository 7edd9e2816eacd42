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
}

impl Class {
    fn matches(&self, c: char) -> bool {
        self.ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != self.negated
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
            '.' => Ast::Class(Class {
                // ECMA-262 `.` without the `s` flag: anything but a line terminator.
                ranges: vec![('\n', '\n'), ('\r', '\r'), ('\u{2028}', '\u{2029}')],
                negated: true,
            }),
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
                Ast::Class(Class {
                    ranges: vec![(e, e)],
                    negated: false,
                })
            }
            '*' | '+' | '?' | '{' => return self.fail("a quantifier with nothing to repeat"),
            ']' | '}' => return self.fail("a bare ] or } (escape it)"),
            lit => Ast::Class(Class {
                ranges: vec![(lit, lit)],
                negated: false,
            }),
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
        Ok(Class { ranges, negated })
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
    program: Vec<Inst>,
    /// Begins with `^` outside any group or alternation: only position 0 can start a match.
    anchored: bool,
}

impl Pattern {
    /// Compiles `source`, refusing anything outside the supported subset.
    pub fn new(source: &str) -> Result<Pattern, PatternError> {
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
        Ok(Pattern {
            source: source.to_string(),
            simple: segments(&ast),
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
        if let Some(segments) = &self.simple {
            let mut chars = subject.chars().peekable();
            for (class, min, max) in segments {
                let mut taken = 0;
                while taken < *max && chars.peek().is_some_and(|&c| class.matches(c)) {
                    chars.next();
                    taken += 1;
                }
                if taken < *min {
                    return false;
                }
            }
            return chars.next().is_none();
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
            let slow = Pattern {
                simple: None,
                ..fast.clone()
            };
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
    fn no_subject_is_slow() {
        // A backtracking engine would take exponential time on this; the NFA is linear.
        let p = Pattern::new("^(a|a?){0,30}b$").unwrap();
        assert!(!p.is_match(&"a".repeat(30)));
        assert!(p.is_match(&format!("{}b", "a".repeat(30))));
    }
}
