// The approval gate from Swift: every decision, every way a handler can fail, and the policies.
@testable import CcAppServer
import Foundation
import XCTest

final class ApprovalTests: XCTestCase {
    func testFullFlowWithAnApprovalRunsTheTool() async throws {
        let server = try openServer()
        defer { server.close() }
        let recorder = Recorder()
        let client = try await server.client(approvals: recorder.handler(.acceptOnce))
        let thread = try await client.threadStart(title: "flow").thread
        XCTAssertEqual(thread.title, "flow")
        let (completed, events) = try await runTurn(client, thread.id, "write a.txt")
        XCTAssertEqual(completed.turn.status, .completed)
        XCTAssertNil(completed.error)
        XCTAssertEqual(recorder.requests.count, 1)
        guard case .ok(let ok)? = toolResults(events).first else { return XCTFail("no ok tool result: \(events)") }
        XCTAssertEqual(ok.output, try JSONValue.parse(#"{"tool":"fs.write","echo":{"path":"a.txt","text":"x"}}"#))
        XCTAssertEqual(streamedText(events), "done")
        XCTAssertEqual(server.toolsExecuted, 1)
        // The events come in wire order and end with this turn's completion.
        guard case .turnStarted? = events.first, case .turnCompleted? = events.last else {
            return XCTFail("turn events out of order: \(events)")
        }
    }

    func testTheHandlerSeesTheBoundOperation() async throws {
        let server = try openServer()
        defer { server.close() }
        let recorder = Recorder()
        let client = try await server.client(approvals: recorder.handler(.acceptOnce))
        let thread = try await client.threadStart().thread
        let run = try await client.turn(threadId: thread.id, text: "go")
        _ = try await run.completion()
        let asked = try XCTUnwrap(recorder.requests.first)
        XCTAssertEqual(asked.operation.tool, "fs.write")
        XCTAssertEqual(asked.operation.arguments, .object(["path": .string("a.txt"), "text": .string("x")]))
        XCTAssertEqual(asked.binding.threadId, thread.id)
        XCTAssertEqual(asked.binding.turnId, run.turn.id)
        XCTAssertTrue(asked.binding.operationDigest.hasPrefix("sha256:"), asked.binding.operationDigest)
        XCTAssertFalse(asked.binding.nonce.isEmpty)
    }

    func testAcceptOnceAsksForEveryCall() async throws {
        let server = try openServer(script([toolStep(), toolStep()]))
        defer { server.close() }
        let recorder = Recorder()
        let client = try await server.client(approvals: recorder.handler(.acceptOnce))
        let (_, events) = try await runTurn(client, try await client.threadStart().thread.id)
        XCTAssertEqual(recorder.requests.count, 2)
        XCTAssertEqual(toolResults(events).count, 2)
        XCTAssertEqual(server.toolsExecuted, 2)
    }

    func testAcceptForTurnAsksOncePerTurn() async throws {
        let server = try openServer(script([toolStep(), toolStep()]))
        defer { server.close() }
        let recorder = Recorder()
        let client = try await server.client(approvals: recorder.handler(.acceptForTurn))
        let thread = try await client.threadStart().thread
        _ = try await runTurn(client, thread.id)
        XCTAssertEqual(recorder.requests.count, 1)
        XCTAssertEqual(server.toolsExecuted, 2)
        // A new turn asks again.
        _ = try await runTurn(client, thread.id)
        XCTAssertEqual(recorder.requests.count, 2)
        XCTAssertEqual(server.toolsExecuted, 4)
    }

    func testAcceptForSessionCoversLaterTurns() async throws {
        let server = try openServer(script([toolStep()]))
        defer { server.close() }
        let recorder = Recorder()
        let client = try await server.client(approvals: recorder.handler(.acceptForSession))
        let thread = try await client.threadStart().thread
        _ = try await runTurn(client, thread.id)
        _ = try await runTurn(client, thread.id)
        XCTAssertEqual(recorder.requests.count, 1)
        XCTAssertEqual(server.toolsExecuted, 2)
    }

    func testDeclineWithAReasonDeniesTheToolAndTheTurnGoesOn() async throws {
        let server = try openServer()
        defer { server.close() }
        let client = try await server.client(approvals: { _ in .decline(reason: "not today") })
        let (completed, events) = try await runTurn(client, try await client.threadStart().thread.id)
        XCTAssertEqual(completed.turn.status, .completed)
        guard case .denied(let denied)? = toolResults(events).first else { return XCTFail("no denial: \(events)") }
        XCTAssertTrue(denied.reason.contains("not today"), denied.reason)
        XCTAssertEqual(streamedText(events), "done")
        XCTAssertEqual(server.toolsExecuted, 0)
    }

    func testCancelInterruptsTheTurn() async throws {
        let server = try openServer()
        defer { server.close() }
        let client = try await server.client(approvals: { _ in .cancel })
        let (completed, events) = try await runTurn(client, try await client.threadStart().thread.id)
        XCTAssertEqual(completed.turn.status, .interrupted)
        XCTAssertEqual(streamedText(events), "", "nothing after the cancelled tool may run")
        XCTAssertEqual(server.toolsExecuted, 0)
    }

    func testAThrowingHandlerDeclinesAndTheLogSaysWhy() async throws {
        struct Refusal: Error, CustomStringConvertible { var description: String { "the prompt crashed" } }
        let log = LogCapture()
        defer { log.stop() }
        let server = try openServer()
        defer { server.close() }
        let client = try await server.client(approvals: { _ in throw Refusal() })
        let (completed, events) = try await runTurn(client, try await client.threadStart().thread.id)
        XCTAssertEqual(completed.turn.status, .completed)
        guard case .denied(let denied)? = toolResults(events).first else { return XCTFail("no denial") }
        XCTAssertTrue(denied.reason.contains("the prompt crashed"), denied.reason)
        XCTAssertTrue(log.waitFor { $0.contains("threw") && $0.contains("the prompt crashed") }, "\(log.messages)")
        XCTAssertEqual(server.toolsExecuted, 0)
    }

    func testNoHandlerDeclinesAndTheLogSaysWhy() async throws {
        let log = LogCapture()
        defer { log.stop() }
        let server = try openServer()
        defer { server.close() }
        let client = try await server.client()
        let (_, events) = try await runTurn(client, try await client.threadStart().thread.id)
        guard case .denied(let denied)? = toolResults(events).first else { return XCTFail("no denial") }
        XCTAssertTrue(denied.reason.contains("no approval handler"), denied.reason)
        XCTAssertTrue(log.waitFor { $0.contains("no approval handler") && $0.contains("fs.write") }, "\(log.messages)")
        XCTAssertEqual(server.toolsExecuted, 0)
    }

    func testAHandlerThatDoesNotAnswerInTimeDeclines() async throws {
        let log = LogCapture()
        defer { log.stop() }
        let server = try openServer()
        defer { server.close() }
        let client = try await server.client(approvals: { _ in
            try await Task.sleep(nanoseconds: 5_000_000_000)
            return .acceptOnce
        }, options: ClientOptions(approvalTimeout: 0.3))
        let started = Date()
        let (_, events) = try await runTurn(client, try await client.threadStart().thread.id)
        XCTAssertLessThan(Date().timeIntervalSince(started), 4.5, "the decline must not wait for the handler")
        guard case .denied? = toolResults(events).first else { return XCTFail("no denial: \(events)") }
        XCTAssertEqual(server.toolsExecuted, 0)
        XCTAssertTrue(log.waitFor { $0.contains("did not answer") }, "\(log.messages)")
    }

    func testAutoApproveRunsWithoutAsking() async throws {
        let server = try openServer(options: ServerOptions(policy: .autoApprove))
        defer { server.close() }
        let recorder = Recorder()
        let client = try await server.client(approvals: recorder.handler(.decline(reason: nil)))
        let (_, events) = try await runTurn(client, try await client.threadStart().thread.id)
        XCTAssertEqual(recorder.requests.count, 0)
        guard case .ok? = toolResults(events).first else { return XCTFail("tool did not run") }
        XCTAssertEqual(server.toolsExecuted, 1)
    }

    func testDenyAllNeverRunsATool() async throws {
        let server = try openServer(options: ServerOptions(policy: .denyAll))
        defer { server.close() }
        let recorder = Recorder()
        let client = try await server.client(approvals: recorder.handler(.acceptOnce))
        let (_, events) = try await runTurn(client, try await client.threadStart().thread.id)
        XCTAssertEqual(recorder.requests.count, 0)
        guard case .denied? = toolResults(events).first else { return XCTFail("tool ran: \(events)") }
        XCTAssertEqual(server.toolsExecuted, 0)
    }

    func testSetPolicyAppliesToTheNextTurn() async throws {
        let server = try openServer()
        defer { server.close() }
        let recorder = Recorder()
        let client = try await server.client(approvals: recorder.handler(.acceptOnce))
        let thread = try await client.threadStart().thread
        server.setPolicy(.denyAll)
        _ = try await runTurn(client, thread.id)
        XCTAssertEqual(server.toolsExecuted, 0)
        server.setPolicy(.askEveryTime)
        _ = try await runTurn(client, thread.id)
        XCTAssertEqual(server.toolsExecuted, 1)
        XCTAssertEqual(recorder.requests.count, 1)
    }

    func testApprovalEventsAreNotifiedAndResolved() async throws {
        let server = try openServer()
        defer { server.close() }
        let client = try await server.client(approvals: { _ in .acceptOnce })
        let (_, events) = try await runTurn(client, try await client.threadStart().thread.id)
        let requested = events.filter { if case .approvalRequested = $0 { return true } else { return false } }
        let resolved = events.compactMap { e -> ApprovalResolvedParams? in
            if case .approvalResolved(let n) = e { return n.params } else { return nil }
        }
        XCTAssertEqual(requested.count, 1)
        XCTAssertEqual(resolved.map(\.outcome), [.approved])
    }
}
