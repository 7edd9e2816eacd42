// The surface a Swift host writes against: names that coexist with Foundation, Hashable and
// Sendable generated types, the error cases and their codes, and the log bridge.
import CcAppServer
import Foundation
import XCTest

/// Compiles only for Sendable values: the checks below are the compiler's.
private func requireSendable<T: Sendable>(_: T.Type) {}

final class TypeTests: XCTestCase {
    func testFoundationAndTheProtocolTypesCoexistUnqualified() async throws {
        let server = try openServer()
        defer { server.close() }
        let client = try await server.client()
        let started = try await client.threadStart(title: "names")
        let listed = try await client.threadList()
        // `Thread` is still Foundation's; ours is `AgentThread`.
        let foundationThread: Thread.Type = Thread.self
        XCTAssertTrue(foundationThread.isMultiThreaded())
        let ours: AgentThread = started.thread
        XCTAssertEqual(listed.threads, [ours])
        XCTAssertEqual(started.thread.id, listed.threads[0].id)
        let stream: OutputStream? = OutputStream(toMemory: ())
        XCTAssertNotNil(stream)
        let kind: OutputStreamKind = .stdout
        XCTAssertEqual(kind.wire, "stdout")
    }

    func testGeneratedTypesAreHashable() throws {
        let a = try ServerNotification(json: JSONValue.parse(
            #"{"jsonrpc":"2.0","method":"thread/updated","params":{"threadId":"t","eventSeq":1,"thread":{"id":"t","status":"idle","title":null,"parentThreadId":null,"createdAt":"2026-01-01T00:00:00.000Z","updatedAt":"2026-01-01T00:00:00.000Z","revision":1,"metadata":{}}}}"#))
        let b = try ServerNotification(json: a.toJSON())
        XCTAssertEqual(Set([a, b]).count, 1)
        XCTAssertEqual(a.hashValue, b.hashValue)
        XCTAssertEqual(a.threadId, "t")
        XCTAssertNil(a.turnId)
    }

    func testJSONNumbersHashByValue() throws {
        let three = try JSONValue.parse("3"), threePointZero = try JSONValue.parse("3.0")
        XCTAssertEqual(three, threePointZero)
        XCTAssertEqual(three.hashValue, threePointZero.hashValue)
        XCTAssertEqual(Set([three, threePointZero, try JSONValue.parse("4")]).count, 2)
        let ordered = try JSONValue.parse(#"{"a":1,"b":[true,null]}"#), reordered = try JSONValue.parse(#"{"b":[true,null],"a":1.0}"#)
        XCTAssertEqual(ordered.hashValue, reordered.hashValue)
    }

    func testThePublicTypesAreSendable() {
        requireSendable(AppServer.self)
        requireSendable(Client.self)
        requireSendable(ServerOptions.self)
        requireSendable(Decision.self)
        requireSendable(AppServerError.self)
        requireSendable(TurnEvents.self)
        requireSendable(KernelTurn.self)
        requireSendable(AgentThread.self)
        requireSendable(ServerNotification.self)
        requireSendable(JSONValue.self)
        requireSendable(ProtocolMessage.self)
    }

    func testErrorCasesCarryTheWireCodes() {
        XCTAssertEqual(AppServerError.notFound(message: "x").code, -32004)
        XCTAssertEqual(AppServerError.conflict(message: "x").code, -32009)
        XCTAssertEqual(AppServerError.invalidParams(message: "x").code, -32602)
        XCTAssertEqual(AppServerError.overloaded(retryAfter: 0.5).code, -32001)
        XCTAssertEqual(AppServerError.timeout.code, -32010)
        XCTAssertEqual(AppServerError.closed(message: "x").code, -32603)
        XCTAssertEqual(AppServerError.lineTooLarge(size: 2, max: 1).code, -32600)
        XCTAssertEqual(AppServerError.invalidJSON(message: "x").code, -32700)
        XCTAssertEqual(AppServerError.server(code: -32601, message: "m", data: nil).code, -32601)
        XCTAssertTrue(AppServerError.overloaded(retryAfter: 0.5).message.contains("0.5"))
    }

    func testTheLibrarysOwnLogReachesTheHandler() async throws {
        // The library (not the SDK) logs a declined approval whose handler failed.
        struct Nope: Error {}
        let log = LogCapture(level: .debug)
        defer { log.stop() }
        let server = try openServer()
        defer { server.close() }
        let client = try await server.client(approvals: { _ in throw Nope() })
        _ = try await runTurn(client, try await client.threadStart().thread.id)
        let deadline = Date().addingTimeInterval(5)
        while Date() < deadline, !log.targets.contains("cc_app_server::approval") {
            try await Task.sleep(nanoseconds: 10_000_000)
        }
        XCTAssertTrue(log.targets.contains("cc_app_server::approval"), "\(log.targets) \(log.messages)")
        XCTAssertTrue(log.messages.contains { $0.contains("declining") }, "\(log.messages)")
    }

    func testServerOptionsDefaults() {
        let o = ServerOptions()
        XCTAssertEqual(o.store, .jsonl)
        XCTAssertEqual(o.durability, .sync)
        XCTAssertEqual(o.policy, .askEveryTime)
        XCTAssertNil(o.rolloutKey)
        XCTAssertNil(o.scriptJSON)
        XCTAssertFalse(o.acceptUnanchored)
    }
}
