// Swift replay of the shared wire v1 fixtures against the generated bindings: every file under
// schema/fixtures/valid must parse, decode and re-encode to the same JSON (member order ignored,
// numbers by value) in both decode modes; every file under schema/fixtures/invalid must be refused
// by the strict parser or the generated decoders in conformance mode. The folder is the Rust verdict.
import CcAppServerProtocol
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
}
