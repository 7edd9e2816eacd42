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
        var parser = StrictParser(Array(text.utf16))
        return try parser.document()
    }

    public static func parse(_ text: String) throws -> JSONValue {
        var parser = StrictParser(Array(text.utf16))
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

/// A compiled schema `pattern`. `NSRegularExpression` is immutable and safe to match from any
/// thread (Apple's documentation says so) but is not declared `Sendable`; this wrapper says it
/// once, so the generated pattern constants are concurrency-safe globals.
final class CompiledPattern: @unchecked Sendable {
    let regex: NSRegularExpression

    init(_ pattern: String) {
        regex = try! NSRegularExpression(pattern: pattern)
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

struct StrictParser {
    private let s: [UInt16]
    private var i = 0

    init(_ s: [UInt16]) {
        self.s = s
    }

    private func err(_ reason: String) -> ProtocolDecodeError {
        ProtocolDecodeError(pointer: "", reason: "parse error at offset \(i): \(reason)")
    }

    private func peek() -> UInt16 {
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
        let units = Array(w.utf16)
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
            let c = s[i + k]
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
        var units: [UInt16] = []
        while true {
            if i >= s.count { throw err("unterminated string") }
            let c = s[i]
            i += 1
            if c == 0x22 { return String(decoding: units, as: UTF16.self) }
            if c < 0x20 { throw err("control character in string") }
            if c != 0x5C {
                units.append(c)
                continue
            }
            if i >= s.count { throw err("unterminated escape") }
            let e = s[i]
            i += 1
            switch e {
            case 0x22, 0x5C, 0x2F: units.append(e)
            case 0x62: units.append(0x08)
            case 0x66: units.append(0x0C)
            case 0x6E: units.append(0x0A)
            case 0x72: units.append(0x0D)
            case 0x74: units.append(0x09)
            case 0x75:
                let u = try hex4()
                if UTF16.isLeadSurrogate(u) {
                    if i + 2 > s.count || s[i] != 0x5C || s[i + 1] != 0x75 { throw err("lone surrogate escape") }
                    i += 2
                    let low = try hex4()
                    if !UTF16.isTrailSurrogate(low) { throw err("lone surrogate escape") }
                    units.append(u)
                    units.append(low)
                } else if UTF16.isTrailSurrogate(u) {
                    throw err("lone surrogate escape")
                } else {
                    units.append(u)
                }
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
        return .number(String(decoding: s[start..<i], as: UTF16.self))
    }
}

func ptr(_ at: String, _ key: String) -> String {
    at + "/" + key.replacingOccurrences(of: "~", with: "~0").replacingOccurrences(of: "/", with: "~1")
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
    if let p = pattern?.regex, p.firstMatch(in: s, options: [], range: NSRange(s.startIndex..., in: s)) == nil {
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
