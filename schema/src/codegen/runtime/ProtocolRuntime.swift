import Foundation

/// How strictly to decode. `.receive` is what a host's event pump uses: display unions and enums
/// keep a value this version does not know as `.unknown`, so a newer server never breaks an older
/// client. `.conformance` refuses everything the schema refuses (what the Rust validator and the
/// shared fixtures mean). Security-sensitive unions and enums refuse unknown values in both modes.
public enum DecodeMode: Equatable, Sendable {
    case receive
    case conformance
}

/// A refusal: where (a JSON pointer into the decoded value, "" for the whole value) and why.
public struct ProtocolDecodeError: Error, Hashable, Sendable, CustomStringConvertible {
    public let pointer: String
    public let reason: String

    public init(pointer: String, reason: String) {
        self.pointer = pointer
        self.reason = reason
    }

    public var description: String {
        "at \(pointer.isEmpty ? "(root)" : pointer): \(reason)"
    }
}

/// An optional member that may also be `null`: missing, present as `null`, and present with a
/// value are three different things on the wire and stay three different things here.
public enum JsonField<Wrapped> {
    /// The member is not on the wire.
    case absent
    /// The member is on the wire as `null`.
    case null
    /// The member is on the wire with a value.
    case value(Wrapped)

    /// The value, or nil when absent or null.
    public var orNil: Wrapped? {
        if case .value(let v) = self { return v }
        return nil
    }
}

extension JsonField: Equatable where Wrapped: Equatable {}
extension JsonField: Hashable where Wrapped: Hashable {}
extension JsonField: Sendable where Wrapped: Sendable {}

/// One JSON value. Numbers keep their literal text so nothing is rounded on the way through;
/// objects compare without regard to member order.
public enum JSONValue: Hashable, Sendable {
    case null
    case bool(Bool)
    case number(String)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    /// Strict RFC 8259 parsing of UTF-8 bytes, with the Rust core's limits (at most
    /// `JSONValue.maxDepth` nested arrays/objects, no lone surrogate escapes, no trailing commas).
    public static func parse(_ data: Data) throws -> JSONValue {
        guard let text = String(data: data, encoding: .utf8) else {
            throw ProtocolDecodeError(pointer: "", reason: "parse error: not UTF-8")
        }
        var parser = StrictParser(Array(text.utf8))
        return try parser.document()
    }

    public static func parse(_ text: String) throws -> JSONValue {
        var parser = StrictParser(Array(text.utf8))
        return try parser.document()
    }

    public static let maxDepth = 127

    /// Compact JSON text, members sorted by name (deterministic).
    public var encoded: String {
        var out = ""
        write(to: &out)
        return out
    }

    private func write(to out: inout String) {
        switch self {
        case .null: out += "null"
        case .bool(let b): out += b ? "true" : "false"
        case .number(let n): out += n
        case .string(let s): JSONValue.quote(s, into: &out)
        case .array(let a):
            out += "["
            for (i, x) in a.enumerated() {
                if i > 0 { out += "," }
                x.write(to: &out)
            }
            out += "]"
        case .object(let o):
            out += "{"
            for (i, k) in o.keys.sorted().enumerated() {
                if i > 0 { out += "," }
                JSONValue.quote(k, into: &out)
                out += ":"
                o[k]!.write(to: &out)
            }
            out += "}"
        }
    }

    static func quote(_ s: String, into out: inout String) {
        out += "\""
        for u in s.unicodeScalars {
            switch u {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            default:
                if u.value < 0x20 {
                    out += String(format: "\\u%04x", u.value)
                } else {
                    out.unicodeScalars.append(u)
                }
            }
        }
        out += "\""
    }

    /// JSON equality: member order ignored, numbers compared by value (3 equals 3.0).
    public static func == (a: JSONValue, b: JSONValue) -> Bool {
        switch (a, b) {
        case (.null, .null): return true
        case (.bool(let x), .bool(let y)): return x == y
        case (.string(let x), .string(let y)): return x == y
        case (.number(let x), .number(let y)):
            if x == y { return true }
            guard let dx = Decimal(string: x, locale: Locale(identifier: "en_US_POSIX")),
                  let dy = Decimal(string: y, locale: Locale(identifier: "en_US_POSIX")) else { return false }
            return dx == dy
        case (.array(let x), .array(let y)): return x == y
        case (.object(let x), .object(let y)): return x == y
        default: return false
        }
    }
    /// Consistent with `==`: a number hashes by its value, so `3` and `3.0` hash alike.
    public func hash(into h: inout Hasher) {
        switch self {
        case .null: h.combine(0)
        case .bool(let b): h.combine(1); h.combine(b)
        case .number(let n):
            h.combine(2)
            if let d = Decimal(string: n, locale: Locale(identifier: "en_US_POSIX")) {
                h.combine(NSDecimalNumber(decimal: d).doubleValue)
            } else {
                h.combine(n)
            }
        case .string(let s): h.combine(3); h.combine(s)
        case .array(let a): h.combine(4); h.combine(a)
        case .object(let o): h.combine(5); h.combine(o)
        }
    }
}

/// A compiled schema `pattern`. Most of the schema's patterns are anchored runs of ASCII
/// literals and character classes with counts (`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\z`, the id
/// patterns every notification carries); those are matched over the UTF-8 bytes by
/// `SimplePattern`, without bridging to `NSString`. Anything else (groups, alternation, optional
/// parts) goes to `NSRegularExpression`, which is immutable and safe to match from any thread
/// (Apple's documentation says so) but not declared `Sendable`; this wrapper says it once, so the
/// generated pattern constants are concurrency-safe globals.
final class CompiledPattern: @unchecked Sendable {
    let pattern: String
    let simple: SimplePattern?
    private let regex: NSRegularExpression?

    init(_ pattern: String) {
        self.pattern = pattern
        simple = SimplePattern(pattern)
        regex = simple == nil ? try! NSRegularExpression(pattern: pattern) : nil
    }

    func matches(_ s: String) -> Bool {
        if let simple { return simple.matches(s) }
        return regex!.firstMatch(in: s, options: [], range: NSRange(s.startIndex..., in: s)) != nil
    }
}

/// `^atom atom … \z` where each atom is an ASCII literal (or `\` + punctuation) or a
/// bracket class of ASCII characters and ranges, optionally counted `{n}` or `{m,n}`. `init`
/// returns nil for anything else, so the caller falls back to a full regex engine.
struct SimplePattern: Sendable {
    struct Atom: Sendable {
        var low: UInt64 = 0
        var high: UInt64 = 0
        var min = 1
        var max = 1

        mutating func insert(_ b: UInt8) {
            if b < 64 { low |= 1 << UInt64(b) } else { high |= 1 << UInt64(b - 64) }
        }

        func contains(_ b: UInt8) -> Bool {
            b < 64 ? low & (1 << UInt64(b)) != 0 : b < 128 && high & (1 << UInt64(b - 64)) != 0
        }
    }

    let atoms: [Atom]

    init?(_ pattern: String) {
        let p = Array(pattern.utf8)
        guard p.count >= 3, p.allSatisfy({ $0 < 128 }), p[0] == UInt8(ascii: "^"),
              p[p.count - 2] == UInt8(ascii: "\\"), p[p.count - 1] == UInt8(ascii: "z") else { return nil }
        let end = p.count - 2
        var atoms: [Atom] = []
        var i = 1
        func isPunct(_ b: UInt8) -> Bool {
            !(b >= 48 && b <= 57) && !(b >= 65 && b <= 90) && !(b >= 97 && b <= 122) && b > 32
        }
        while i < end {
            var atom = Atom()
            let b = p[i]
            if b == UInt8(ascii: "[") {
                i += 1
                guard i < end, p[i] != UInt8(ascii: "^") else { return nil }
                var members: [UInt8] = []
                while i < end && p[i] != UInt8(ascii: "]") {
                    var c = p[i]
                    if c == UInt8(ascii: "\\") {
                        guard i + 1 < end, isPunct(p[i + 1]) else { return nil }
                        i += 1
                        c = p[i]
                    } else if c == UInt8(ascii: "[") {
                        return nil
                    }
                    members.append(c)
                    i += 1
                    // A range `a-b`; a `-` first or last in the class is literal.
                    if i + 1 < end, p[i] == UInt8(ascii: "-"), p[i + 1] != UInt8(ascii: "]") {
                        var hi = p[i + 1]
                        i += 2
                        if hi == UInt8(ascii: "\\") {
                            guard i < end, isPunct(p[i]) else { return nil }
                            hi = p[i]
                            i += 1
                        }
                        guard hi >= c else { return nil }
                        members.append(contentsOf: c...hi)
                    }
                }
                guard i < end, !members.isEmpty else { return nil }
                i += 1
                for m in members { atom.insert(m) }
            } else if b == UInt8(ascii: "\\") {
                guard i + 1 < end, isPunct(p[i + 1]) else { return nil }
                atom.insert(p[i + 1])
                i += 2
            } else if "()|?*+.{}$^]".utf8.contains(b) {
                return nil
            } else {
                atom.insert(b)
                i += 1
            }
            if i < end && p[i] == UInt8(ascii: "{") {
                var j = i + 1
                func number() -> Int? {
                    var v = 0, digits = 0
                    while j < end, p[j] >= 48, p[j] <= 57, digits < 6 {
                        v = v * 10 + Int(p[j] - 48)
                        j += 1
                        digits += 1
                    }
                    return digits > 0 ? v : nil
                }
                guard let lo = number() else { return nil }
                var hi = lo
                if j < end && p[j] == UInt8(ascii: ",") {
                    j += 1
                    guard let h = number() else { return nil }
                    hi = h
                }
                guard j < end, p[j] == UInt8(ascii: "}"), hi >= lo else { return nil }
                atom.min = lo
                atom.max = hi
                i = j + 1
            }
            atoms.append(atom)
        }
        self.atoms = atoms
    }

    /// Whole-string match: the positions each atom can end at, atom by atom.
    func matches(_ s: String) -> Bool {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(s.utf8.count)
        for b in s.utf8 {
            // Every class is ASCII: a string with any other character cannot match.
            if b >= 128 { return false }
            bytes.append(b)
        }
        let n = bytes.count
        var reach = [Bool](repeating: false, count: n + 1)
        reach[0] = true
        for atom in atoms {
            var next = [Bool](repeating: false, count: n + 1)
            var any = false
            for p in 0...n where reach[p] {
                var q = p
                while q < n && q - p < atom.max && atom.contains(bytes[q]) { q += 1 }
                if q - p >= atom.min {
                    for e in (p + atom.min)...q { next[e] = true }
                    any = true
                }
            }
            if !any { return false }
            reach = next
        }
        return reach[n]
    }
}

extension JSONValue: Codable {
    public init(from decoder: Decoder) throws {
        let c = try decoder.singleValueContainer()
        if c.decodeNil() {
            self = .null
        } else if let b = try? c.decode(Bool.self) {
            self = .bool(b)
        } else if let i = try? c.decode(Int64.self) {
            self = .number(String(i))
        } else if let d = try? c.decode(Double.self) {
            self = .number(String(d))
        } else if let s = try? c.decode(String.self) {
            self = .string(s)
        } else if let a = try? c.decode([JSONValue].self) {
            self = .array(a)
        } else {
            self = .object(try c.decode([String: JSONValue].self))
        }
    }

    public func encode(to encoder: Encoder) throws {
        var c = encoder.singleValueContainer()
        switch self {
        case .null: try c.encodeNil()
        case .bool(let b): try c.encode(b)
        case .number(let n):
            if let i = Int64(n) {
                try c.encode(i)
            } else {
                try c.encode(Double(n) ?? 0)
            }
        case .string(let s): try c.encode(s)
        case .array(let a): try c.encode(a)
        case .object(let o): try c.encode(o)
        }
    }
}

/// Over the UTF-8 bytes of a valid Swift string (every delimiter is ASCII; a byte of a multi-byte
/// character is never below 0x80, so it is never taken for one). Offsets in errors are byte offsets.
struct StrictParser {
    private let s: [UInt8]
    private var i = 0

    init(_ s: [UInt8]) {
        self.s = s
    }

    private func err(_ reason: String) -> ProtocolDecodeError {
        ProtocolDecodeError(pointer: "", reason: "parse error at offset \(i): \(reason)")
    }

    private func peek() -> UInt8 {
        i < s.count ? s[i] : 0
    }

    private mutating func ws() {
        while i < s.count && (s[i] == 0x20 || s[i] == 0x09 || s[i] == 0x0A || s[i] == 0x0D) { i += 1 }
    }

    mutating func document() throws -> JSONValue {
        ws()
        let v = try value(0)
        ws()
        if i != s.count { throw err("unexpected trailing characters") }
        return v
    }

    private mutating func value(_ depth: Int) throws -> JSONValue {
        if i >= s.count { throw err("unexpected end of input") }
        switch s[i] {
        case 0x7B: return try object(depth + 1)
        case 0x5B: return try array(depth + 1)
        case 0x22: return .string(try string())
        case 0x74: return try word("true", .bool(true))
        case 0x66: return try word("false", .bool(false))
        case 0x6E: return try word("null", .null)
        default: return try number()
        }
    }

    private mutating func word(_ w: String, _ v: JSONValue) throws -> JSONValue {
        let units = Array(w.utf8)
        if i + units.count > s.count || Array(s[i..<(i + units.count)]) != units { throw err("invalid literal") }
        i += units.count
        return v
    }

    private mutating func object(_ depth: Int) throws -> JSONValue {
        if depth > JSONValue.maxDepth { throw err("nesting deeper than \(JSONValue.maxDepth) levels") }
        i += 1
        var o: [String: JSONValue] = [:]
        ws()
        if peek() == 0x7D {
            i += 1
            return .object(o)
        }
        while true {
            ws()
            if peek() != 0x22 { throw err("expected a member name") }
            let k = try string()
            ws()
            if peek() != 0x3A { throw err("expected ':'") }
            i += 1
            ws()
            o[k] = try value(depth)
            ws()
            switch peek() {
            case 0x2C: i += 1
            case 0x7D:
                i += 1
                return .object(o)
            default: throw err("expected ',' or '}'")
            }
        }
    }

    private mutating func array(_ depth: Int) throws -> JSONValue {
        if depth > JSONValue.maxDepth { throw err("nesting deeper than \(JSONValue.maxDepth) levels") }
        i += 1
        var a: [JSONValue] = []
        ws()
        if peek() == 0x5D {
            i += 1
            return .array(a)
        }
        while true {
            ws()
            a.append(try value(depth))
            ws()
            switch peek() {
            case 0x2C: i += 1
            case 0x5D:
                i += 1
                return .array(a)
            default: throw err("expected ',' or ']'")
            }
        }
    }

    private mutating func hex4() throws -> UInt16 {
        if i + 4 > s.count { throw err("short \\u escape") }
        var v: UInt16 = 0
        for k in 0..<4 {
            let c = UInt16(s[i + k])
            let d: UInt16
            switch c {
            case 0x30...0x39: d = c - 0x30
            case 0x41...0x46: d = c - 0x41 + 10
            case 0x61...0x66: d = c - 0x61 + 10
            default: throw err("bad \\u escape")
            }
            v = v * 16 + d
        }
        i += 4
        return v
    }

    private mutating func string() throws -> String {
        i += 1
        let start = i
        // Most strings hold no escape: one scan, one validating copy.
        while i < s.count {
            let c = s[i]
            if c == 0x22 {
                let out = String(decoding: s[start..<i], as: UTF8.self)
                i += 1
                return out
            }
            if c == 0x5C { break }
            if c < 0x20 { throw err("control character in string") }
            i += 1
        }
        var bytes = Array(s[start..<i])
        while true {
            if i >= s.count { throw err("unterminated string") }
            let c = s[i]
            i += 1
            if c == 0x22 { return String(decoding: bytes, as: UTF8.self) }
            if c < 0x20 { throw err("control character in string") }
            if c != 0x5C {
                bytes.append(c)
                continue
            }
            if i >= s.count { throw err("unterminated escape") }
            let e = s[i]
            i += 1
            switch e {
            case 0x22, 0x5C, 0x2F: bytes.append(e)
            case 0x62: bytes.append(0x08)
            case 0x66: bytes.append(0x0C)
            case 0x6E: bytes.append(0x0A)
            case 0x72: bytes.append(0x0D)
            case 0x74: bytes.append(0x09)
            case 0x75:
                let u = try hex4()
                let scalar: UInt32
                if UTF16.isLeadSurrogate(u) {
                    if i + 2 > s.count || s[i] != 0x5C || s[i + 1] != 0x75 { throw err("lone surrogate escape") }
                    i += 2
                    let low = try hex4()
                    if !UTF16.isTrailSurrogate(low) { throw err("lone surrogate escape") }
                    scalar = 0x10000 + ((UInt32(u) - 0xD800) << 10) + (UInt32(low) - 0xDC00)
                } else if UTF16.isTrailSurrogate(u) {
                    throw err("lone surrogate escape")
                } else {
                    scalar = UInt32(u)
                }
                UTF8.encode(Unicode.Scalar(scalar)!) { bytes.append($0) }
            default: throw err("invalid escape")
            }
        }
    }

    private mutating func digits() -> Int {
        let start = i
        while i < s.count && s[i] >= 0x30 && s[i] <= 0x39 { i += 1 }
        return i - start
    }

    private mutating func number() throws -> JSONValue {
        let start = i
        if peek() == 0x2D { i += 1 }
        if peek() == 0x30 {
            i += 1
        } else if digits() == 0 {
            throw err("invalid value")
        }
        if peek() == 0x2E {
            i += 1
            if digits() == 0 { throw err("invalid number") }
        }
        if peek() == 0x65 || peek() == 0x45 {
            i += 1
            if peek() == 0x2B || peek() == 0x2D { i += 1 }
            if digits() == 0 { throw err("invalid number") }
        }
        return .number(String(decoding: s[start..<i], as: UTF8.self))
    }
}

func ptr(_ at: String, _ key: String) -> String {
    // Member names almost never hold `~` or `/`: skip Foundation's replacing for those.
    if !key.utf8.contains(where: { $0 == 0x7E || $0 == 0x2F }) { return at + "/" + key }
    return at + "/" + key.replacingOccurrences(of: "~", with: "~0").replacingOccurrences(of: "/", with: "~1")
}

func ptr(_ at: String, _ index: Int) -> String {
    at + "/" + String(index)
}

func fail(_ at: String, _ reason: String) -> ProtocolDecodeError {
    ProtocolDecodeError(pointer: at, reason: reason)
}

func describeValue(_ j: JSONValue) -> String {
    switch j {
    case .object: return "an object"
    case .array: return "an array"
    default:
        let text = j.encoded
        return text.count > 80 ? String(text.prefix(80)) + "…" : text
    }
}

func readObject(_ j: JSONValue, _ at: String) throws -> [String: JSONValue] {
    guard case .object(let o) = j else { throw fail(at, "expected an object, found " + describeValue(j)) }
    return o
}

func requireMember(_ o: [String: JSONValue], _ key: String, _ at: String) throws -> JSONValue {
    guard let v = o[key] else { throw fail(at, "missing required member \"" + key + "\"") }
    return v
}

func refuseUnknownMembers(_ o: [String: JSONValue], _ at: String, _ known: Set<String>) throws {
    for k in o.keys.sorted() where !known.contains(k) {
        throw fail(ptr(at, k), "unknown member \"" + k + "\" (this object is strict)")
    }
}

func extraMembers(_ o: [String: JSONValue], _ known: Set<String>) -> [String: JSONValue] {
    o.filter { !known.contains($0.key) }
}

func requireExactlyOne(_ o: [String: JSONValue], _ at: String, _ alternatives: [[String]]) throws {
    let matched = alternatives.filter { set in set.allSatisfy { o[$0] != nil } }.count
    if matched != 1 {
        throw fail(at, "expected exactly one of " + alternatives.map { $0.joined(separator: "+") }.joined(separator: ", ") + ", found \(matched)")
    }
}

@discardableResult
func checkConst(_ j: JSONValue, _ expected: JSONValue, _ at: String) throws -> JSONValue {
    if j != expected { throw fail(at, "expected " + expected.encoded + ", found " + describeValue(j)) }
    return j
}

func nullOr<T>(_ j: JSONValue, _ decode: (JSONValue) throws -> T) rethrows -> T? {
    if case .null = j { return nil }
    return try decode(j)
}

func optionalMember<T>(_ o: [String: JSONValue], _ key: String, _ decode: (JSONValue) throws -> T) rethrows -> T? {
    guard let j = o[key] else { return nil }
    return try decode(j)
}

func optionalNullable<T>(_ o: [String: JSONValue], _ key: String, _ decode: (JSONValue) throws -> T) rethrows -> JsonField<T> {
    guard let j = o[key] else { return .absent }
    if case .null = j { return .null }
    return .value(try decode(j))
}

func readString(_ j: JSONValue, _ at: String, minLength: Int = 0, maxLength: Int = Int.max, pattern: CompiledPattern? = nil) throws -> String {
    guard case .string(let s) = j else { throw fail(at, "expected a string, found " + describeValue(j)) }
    // JSON Schema counts Unicode code points.
    let n = s.unicodeScalars.count
    if n < minLength { throw fail(at, "shorter than \(minLength) characters") }
    if n > maxLength { throw fail(at, "longer than \(maxLength) characters") }
    if let p = pattern, !p.matches(s) {
        throw fail(at, "does not match " + p.pattern)
    }
    return s
}

/// The exact integer a JSON number denotes (3.0 is the integer 3), or nil when it has a fraction
/// or does not fit 64 bits.
func integralValue(_ text: String) -> Int64? {
    if let i = Int64(text) { return i }
    guard let d = Double(text), d.isFinite, d.rounded() == d, abs(d) < 9.2e18 else { return nil }
    return Int64(d)
}

func readLong(_ j: JSONValue, _ at: String, minimum: Int64 = Int64.min, maximum: Int64 = Int64.max) throws -> Int64 {
    guard case .number(let text) = j, let v = integralValue(text) else {
        throw fail(at, "expected an integer, found " + describeValue(j))
    }
    if v < minimum { throw fail(at, "less than the minimum \(minimum)") }
    if v > maximum { throw fail(at, "greater than the maximum \(maximum)") }
    return v
}

func readNumber(_ j: JSONValue, _ at: String) throws -> Double {
    guard case .number(let text) = j, let d = Double(text) else { throw fail(at, "expected a number, found " + describeValue(j)) }
    return d
}

func readBoolean(_ j: JSONValue, _ at: String) throws -> Bool {
    guard case .bool(let b) = j else { throw fail(at, "expected a boolean, found " + describeValue(j)) }
    return b
}

func readJson(_ j: JSONValue, _ at: String) throws -> JSONValue {
    j
}

/// A request id: an integer in range or a string of at most `maxLength` characters, kept as written.
func readIntegerOrString(_ j: JSONValue, _ at: String, minimum: Int64 = Int64.min, maximum: Int64 = Int64.max, maxLength: Int = Int.max) throws -> JSONValue {
    if case .string = j {
        _ = try readString(j, at, maxLength: maxLength)
    } else {
        _ = try readLong(j, at, minimum: minimum, maximum: maximum)
    }
    return j
}

/// `x-max-depth`: arrays and objects nest at most `limit` levels, `j` itself being the first.
func checkDepth(_ j: JSONValue, _ at: String, _ limit: Int) throws {
    func walk(_ v: JSONValue, _ level: Int, _ at: String) throws {
        switch v {
        case .object(let o):
            if level > limit { throw fail(at, "nested more than \(limit) levels of arrays and objects deep") }
            for k in o.keys.sorted() { try walk(o[k]!, level + 1, ptr(at, k)) }
        case .array(let a):
            if level > limit { throw fail(at, "nested more than \(limit) levels of arrays and objects deep") }
            for (i, x) in a.enumerated() { try walk(x, level + 1, ptr(at, i)) }
        default:
            return
        }
    }
    try walk(j, 1, at)
}

func readList<T>(_ j: JSONValue, _ at: String, minItems: Int = 0, maxItems: Int = Int.max, _ item: (JSONValue, String) throws -> T) throws -> [T] {
    guard case .array(let a) = j else { throw fail(at, "expected an array, found " + describeValue(j)) }
    if a.count < minItems { throw fail(at, "fewer than \(minItems) items") }
    if a.count > maxItems { throw fail(at, "more than \(maxItems) items") }
    var out: [T] = []
    out.reserveCapacity(a.count)
    for (i, x) in a.enumerated() { out.append(try item(x, ptr(at, i))) }
    return out
}

func readMap<T>(_ j: JSONValue, _ at: String, maxProperties: Int = Int.max, keyMinLength: Int = 0, keyMaxLength: Int = Int.max, _ value: (JSONValue, String) throws -> T) throws -> [String: T] {
    let o = try readObject(j, at)
    if o.count > maxProperties { throw fail(at, "more than \(maxProperties) members") }
    var out: [String: T] = [:]
    for k in o.keys.sorted() {
        let n = k.unicodeScalars.count
        if n < keyMinLength || n > keyMaxLength {
            throw fail(ptr(at, k), "member name length outside \(keyMinLength)...\(keyMaxLength)")
        }
        out[k] = try value(o[k]!, ptr(at, k))
    }
    return out
}

func encodeLong(_ v: Int64) -> JSONValue {
    .number(String(v))
}

func encodeNumber(_ v: Double) -> JSONValue {
    .number(String(v))
}
