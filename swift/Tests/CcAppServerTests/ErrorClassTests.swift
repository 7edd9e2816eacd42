// The error classes every SDK shares (docs/errors.md), each made to happen for real, and the
// per-turn `text()` convenience with its failure classes.
@testable import CcAppServer
import Foundation
import XCTest

final class ErrorClassTests: XCTestCase {
    func testAStoreHeldByAnotherServerIsStoreLocked() async throws {
        let dir = tempStateDirectory()
        let first = try openServer(directory: dir)
        defer { first.close() }
        let error = await assertAppServerError { try openServer(directory: dir) }
        guard case .storeLocked(let m)? = error else { return XCTFail("got \(String(describing: error))") }
        XCTAssertTrue(error?.isStoreError ?? false)
        XCTAssertTrue(m.contains("this process"), m)
        XCTAssertEqual(error?.code, -32603)
    }

    func testAWorldWritableStateDirectoryIsStoreUnsafe() async throws {
        let dir = tempStateDirectory()
        XCTAssertEqual(chmod(dir, 0o777), 0)
        let error = await assertAppServerError { try AppServer.open(stateDirectory: dir) }
        guard case .storeUnsafe(let m)? = error else { return XCTFail("got \(String(describing: error))") }
        XCTAssertTrue(m.contains("chmod 700"), m)
        let file = tempStateDirectory() + "/plain-file"
        XCTAssertTrue(FileManager.default.createFile(atPath: file, contents: Data("x".utf8)))
        let onFile = await assertAppServerError { try AppServer.open(stateDirectory: file) }
        XCTAssertTrue(onFile?.isStoreError ?? false, "\(String(describing: onFile))")
    }

    func testTextCollectsTheAssistantMessages() async throws {
        let server = try openServer(script([message("first answer", chunks: 3), toolStep(), message("second", chunks: 2)]))
        defer { server.close() }
        let recorder = Recorder()
        let client = try await server.client(approvals: recorder.handler(.acceptOnce))
        let thread = try await client.threadStart().thread
        let text = try await client.turn(threadId: thread.id, text: "go").text()
        XCTAssertEqual(text, "first answer\nsecond")
        XCTAssertEqual(recorder.requests.count, 1)
    }

    func testTextOfAFailedTurnIsKernelFailed() async throws {
        let server = try openServer(script([message("partial"), failStep("the model is down")]))
        defer { server.close() }
        let client = try await server.client()
        let thread = try await client.threadStart().thread
        let run = try await client.turn(threadId: thread.id, text: "go")
        let error = await assertAppServerError { try await run.text() }
        guard case .kernelFailed(let reason, let message, let turnId)? = error else {
            return XCTFail("got \(String(describing: error))")
        }
        XCTAssertEqual(reason, "kernelFailed")
        XCTAssertTrue(message.contains("the model is down"), message)
        XCTAssertEqual(turnId, run.turn.id)
    }

    func testTextOfAnInterruptedTurnIsTurnInterrupted() async throws {
        let server = try openServer(script([message("start"), sleepStep(ms: 30_000)]))
        defer { server.close() }
        let client = try await server.client()
        let thread = try await client.threadStart().thread
        let run = try await client.turn(threadId: thread.id, text: "go")
        let reader = Task { try await run.text() }
        try await Task.sleep(nanoseconds: 50_000_000)
        _ = try await client.turnInterrupt(threadId: thread.id, turnId: run.turn.id)
        do {
            _ = try await reader.value
            XCTFail("an interrupted turn has no text")
        } catch let e as AppServerError {
            guard case .turnInterrupted(let id) = e else { return XCTFail("got \(e)") }
            XCTAssertEqual(id, run.turn.id)
        }
    }

    func testTwoTurnsOnTwoThreadsSeeOnlyTheirOwnEvents() async throws {
        let server = try openServer(script([message("same words", chunks: 4)]))
        defer { server.close() }
        let client = try await server.client()
        let a = try await client.threadStart().thread
        let b = try await client.threadStart().thread
        let runA = try await client.turn(threadId: a.id, text: "a")
        let runB = try await client.turn(threadId: b.id, text: "b")
        async let doneA = runA.completion()
        async let doneB = runB.completion()
        let (ra, rb) = try await (doneA, doneB)
        XCTAssertTrue(ra.events.allSatisfy { $0.threadId == a.id }, "\(ra.events)")
        XCTAssertTrue(rb.events.allSatisfy { $0.threadId == b.id }, "\(rb.events)")
        XCTAssertEqual(ra.completed.turn.id, runA.turn.id)
        XCTAssertEqual(rb.completed.turn.id, runB.turn.id)
    }
}
