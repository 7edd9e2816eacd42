// Swift replay of the shared wire v1 fixtures against the generated bindings: every file under
// schema/fixtures/valid must parse, decode and re-encode to the same JSON (member order ignored,
// numbers by value) in both decode modes; every file under schema/fixtures/invalid must be refused
// by the strict parser or the generated decoders in conformance mode. The folder is the Rust verdict.
@testable import CcAppServerProtocol
import Foundation
import XCTest

final class ReplayTests: XCTestCase {
    private var fixtures: URL {
        // swift/Tests/ProtocolReplayTests/ReplayTests.swift -> repository root
        URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
            .appendingPathComponent("schema/fixtures")
    }

    private func files(_ folder: String) -> [URL] {
        let root = fixtures.appendingPathComponent(folder)
        let walker = FileManager.default.enumerator(at: root, includingPropertiesForKeys: nil)
        var out: [URL] = []
        while let url = walker?.nextObject() as? URL {
            if url.pathExtension == "json" { out.append(url) }
        }
        return out.sorted { $0.path < $1.path }
    }

    private func roundtrip(_ doc: JSONValue, definition: Bool, mode: DecodeMode) throws -> (JSONValue, JSONValue) {
        if !definition { return (doc, try decodeMessage(doc, mode: mode).toJSON()) }
        guard case .object(let wrapper) = doc, wrapper.count == 2,
              case .string(let name)? = wrapper["definition"], let value = wrapper["value"] else {
            throw ProtocolDecodeError(pointer: "", reason: "a definition fixture has exactly `definition` and `value`")
        }
        guard let out = try roundtripDefinition(name, value, mode: mode) else {
            throw ProtocolDecodeError(pointer: "/definition", reason: "no definition named \(name)")
        }
        return (value, out)
    }

    func testFixtureReplay() throws {
        var passed = 0
        var failures: [String] = []
        for folder in ["valid", "invalid"] {
            let list = files(folder)
            XCTAssertFalse(list.isEmpty, "no fixtures under \(folder)")
            for url in list {
                let rel = url.path.replacingOccurrences(of: fixtures.path + "/", with: "")
                let definition = url.deletingLastPathComponent().lastPathComponent == "definitions"
                let data = try Data(contentsOf: url)
                if folder == "valid" {
                    do {
                        let doc = try JSONValue.parse(data)
                        for mode in [DecodeMode.receive, .conformance] {
                            let (input, output) = try roundtrip(doc, definition: definition, mode: mode)
                            let reparsed = try JSONValue.parse(output.encoded)
                            if input == output && input == reparsed { passed += 1 } else {
                                failures.append("\(rel): \(mode) round trip differs:\n  in:  \(input.encoded)\n  out: \(output.encoded)")
                            }
                        }
                    } catch {
                        failures.append("\(rel): valid fixture refused: \(error)")
                    }
                } else {
                    do {
                        let doc = try JSONValue.parse(data)
                        _ = try roundtrip(doc, definition: definition, mode: .conformance)
                        failures.append("\(rel): invalid fixture accepted")
                    } catch is ProtocolDecodeError {
                        passed += 1
                    } catch {
                        failures.append("\(rel): unexpected error \(error)")
                    }
                }
            }
        }
        for f in failures { print("FAIL \(f)") }
        print("\(passed) passed, \(failures.count) failed")
        XCTAssertTrue(failures.isEmpty, failures.joined(separator: "\n"))
    }

    func testMissingNullAndPresentStayDistinct() throws {
        XCTAssertEqual(try ThreadListParams(json: JSONValue.parse("{}")).cursor, .absent)
        XCTAssertEqual(try ThreadListParams(json: JSONValue.parse(#"{"cursor": null}"#)).cursor, .null)
        XCTAssertEqual(try ThreadListParams(json: JSONValue.parse(#"{"cursor": "c1"}"#)).cursor, .value("c1"))
        XCTAssertThrowsError(try ThreadStartParams(json: JSONValue.parse(#"{"title": null}"#)))
        guard case .object(let o) = ThreadListParams(cursor: .null).toJSON() else { return XCTFail("object") }
        XCTAssertEqual(o["cursor"], JSONValue.null)
        guard case .object(let absent) = ThreadListParams().toJSON() else { return XCTFail("object") }
        XCTAssertNil(absent["cursor"])
    }

    func testUnknownItemIsKeptAndDecisionRefused() throws {
        let raw = try JSONValue.parse(#"{"type": "hologram", "id": "i1", "frames": 3}"#)
        let item = try ItemContent(json: raw)
        guard case .unknown(let kept) = item else { return XCTFail("expected .unknown, got \(item)") }
        XCTAssertEqual(kept, raw)
        XCTAssertEqual(item.toJSON(), raw)
        XCTAssertThrowsError(try ItemContent(json: raw, mode: .conformance))
        for mode in [DecodeMode.receive, .conformance] {
            XCTAssertThrowsError(try ApprovalDecision(json: JSONValue.parse(#"{"kind": "acceptAlways"}"#), mode: mode)) { error in
                XCTAssertEqual((error as? ProtocolDecodeError)?.pointer, "/kind")
            }
        }
        XCTAssertEqual(try ApprovalDecision(json: JSONValue.parse(#"{"kind": "acceptOnce"}"#)), .acceptOnce(AcceptOnce()))
    }

    func testKeywordMembersSurviveAndCodableRoutesThroughTheChecks() throws {
        let text = #"{"tool": "k", "arguments": {"class": 1, "default": 2, "in": 3, "is": 4, "self": 5, "Type": 6}}"#
        let call = try ToolCall(json: JSONValue.parse(text))
        XCTAssertEqual(call.toJSON(), try JSONValue.parse(text))
        let viaCodable = try JSONDecoder().decode(ToolCall.self, from: Data(text.utf8))
        XCTAssertEqual(viaCodable, call)
        XCTAssertThrowsError(try JSONDecoder().decode(ToolCall.self, from: Data(#"{"tool": "k", "arguments": 1, "class": "x"}"#.utf8)))
        XCTAssertThrowsError(try JSONValue.parse(#"{"a": 1,}"#))
        XCTAssertThrowsError(try JSONValue.parse(#""\ud800""#))
        XCTAssertTrue(schemaDigest.hasPrefix("sha256:"))
    }

    func testStringsDecodeEscapesAndKeepNonASCII() throws {
        XCTAssertEqual(try JSONValue.parse(#""a\u00e9\ud83d\ude00\n\"b\/\t""#), .string("a\u{e9}\u{1F600}\n\"b/\t"))
        XCTAssertEqual(try JSONValue.parse("\"h\u{e9}llo \u{1F600} \u{4E16}\""), .string("h\u{e9}llo \u{1F600} \u{4E16}"))
        XCTAssertEqual(try JSONValue.parse(#"{"k\u0041": ["x\u0000y", -0.5e3]}"#),
                       .object(["kA": .array([.string("x\u{0}y"), .number("-0.5e3")])]))
        XCTAssertThrowsError(try JSONValue.parse(#""\ude00""#))
        XCTAssertThrowsError(try JSONValue.parse(#""\ud83dx""#))
        XCTAssertThrowsError(try JSONValue.parse("\"a\u{1}b\""))
        XCTAssertThrowsError(try JSONValue.parse(#""abc"#))
        XCTAssertThrowsError(try JSONValue.parse(#""a\qb""#))
        XCTAssertThrowsError(try JSONValue.parse(Data([0x22, 0xFF, 0x22])))
        let round = JSONValue.string("caf\u{e9} \u{1F600} \"q\" \\ \n")
        XCTAssertEqual(try JSONValue.parse(round.encoded), round)
    }

    /// Every pattern the generator emitted: the fast matcher (where it applies) agrees with
    /// NSRegularExpression on valid ids, their edges and random mutations.
    func testTheFastPatternMatcherAgreesWithTheRegexEngine() throws {
        let types = fixtures.deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("bindings/swift/Sources/CcAppServerProtocol/ProtocolTypes.swift")
        let source = try String(contentsOf: types, encoding: .utf8)
        let literal = try NSRegularExpression(pattern: #"CompiledPattern\("((?:[^"\\]|\\.)*)"\)"#)
        let found = literal.matches(in: source, range: NSRange(source.startIndex..., in: source)).map { m in
            String(source[Range(m.range(at: 1), in: source)!]).replacingOccurrences(of: "\\\\", with: "\\")
        }
        XCTAssertGreaterThanOrEqual(found.count, 10)
        var simple = 0
        var rng = SystemRandomNumberGenerator()
        let alphabet = Array("aZz09_-.:/@*+=~ \u{e9}\u{1F600}\nTs")
        for pattern in found {
            let compiled = CompiledPattern(pattern)
            guard compiled.simple != nil else { continue }
            simple += 1
            let regex = try NSRegularExpression(pattern: pattern)
            func agree(_ s: String) {
                let expected = regex.firstMatch(in: s, range: NSRange(s.startIndex..., in: s)) != nil
                XCTAssertEqual(compiled.matches(s), expected, "\(pattern) on \(s.debugDescription)")
            }
            for length in [0, 1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 128, 159, 160, 161, 700, 701] {
                agree(String(repeating: "a", count: length))
                agree(String(repeating: "0", count: length))
                agree("sha256:" + String(repeating: "f", count: length))
            }
            for _ in 0..<400 {
                let n = Int.random(in: 0...70, using: &rng)
                agree(String((0..<n).map { _ in alphabet.randomElement(using: &rng)! }))
            }
        }
        // The id patterns, sha256 digests and hex keys take the fast path; groups do not.
        XCTAssertGreaterThanOrEqual(simple, 9)
        XCTAssertNotNil(CompiledPattern("^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\\z").simple)
        XCTAssertNil(CompiledPattern("^(\\*|[a-z]{1,3})\\z").simple)
        XCTAssertNil(CompiledPattern("^[^a]\\z").simple)
    }
}
