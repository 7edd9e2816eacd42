// Host-supplied kernels and tool executors written in Swift, run by the real engine.
@testable import CcAppServer
import Foundation
import XCTest

/// Says what the user said back, then asks for one tool and reports its result.
struct EchoKernel: AgentKernel {
    var askTool = false

    func runTurn(_ turn: KernelTurn, input: TurnInput) async throws {
        try turn.say("heard: \(input.text)")
        guard askTool else { return }
        let id = try turn.newItemId()
        let result = try await turn.requestTool(itemId: id, tool: "clock.read", arguments: .object(["zone": .string("UTC")]))
        switch result {
        case .ok(let ok): try turn.say("tool said \(ok.output.encoded)")
        case .error(let e): try turn.say("tool failed: \(e.message)")
        case .denied(let d): try turn.say("tool denied: \(d.reason)")
        }
    }
}

struct FailingKernel: AgentKernel {
    struct Broken: Error, CustomStringConvertible { var description: String { "the model is down" } }
    func runTurn(_ turn: KernelTurn, input: TurnInput) async throws {
        try turn.say("trying")
        throw Broken()
    }
}

/// Sleeps (cancellably) until interrupted; records whether it saw the cancellation.
final class PatientKernel: AgentKernel, @unchecked Sendable {
    private let lock = NSLock()
    private var cancelled = false
    var sawCancellation: Bool {
        lock.lock()
        defer { lock.unlock() }
        return cancelled
    }

    func runTurn(_ turn: KernelTurn, input: TurnInput) async throws {
        try turn.say("waiting")
        do {
            try await Task.sleep(nanoseconds: 30_000_000_000)
        } catch is CancellationError {
            markCancelled()
            throw CancellationError()
        }
    }

    private func markCancelled() {
        lock.lock()
        cancelled = true
        lock.unlock()
    }
}

struct ClockTools: ToolExecutor {
    var fail = false
    struct Unavailable: Error, CustomStringConvertible { var description: String { "no clock here" } }

    func execute(threadId: String, tool: String, arguments: JSONValue) async throws -> JSONValue {
        if fail { throw Unavailable() }
        return .object(["tool": .string(tool), "time": .string("12:00"), "args": arguments])
    }
}

final class KernelTests: XCTestCase {
    func testASwiftKernelStreamsItsMessage() async throws {
        let server = try AppServer.open(stateDirectory: tempStateDirectory(), kernel: EchoKernel())
        defer { server.close() }
        let client = try await server.client()
        let (done, events) = try await runTurn(client, try await client.threadStart().thread.id, "hello there")
        XCTAssertEqual(done.turn.status, .completed)
        XCTAssertEqual(streamedText(events), "heard: hello there")
    }

    func testASwiftKernelAsksForAToolThroughTheGateAndASwiftExecutorRunsIt() async throws {
        let server = try AppServer.open(stateDirectory: tempStateDirectory(), kernel: EchoKernel(askTool: true), tools: ClockTools())
        defer { server.close() }
        let recorder = Recorder()
        let client = try await server.client(approvals: recorder.handler(.acceptOnce))
        let (_, events) = try await runTurn(client, try await client.threadStart().thread.id, "what time")
        XCTAssertEqual(recorder.requests.map(\.operation.tool), ["clock.read"])
        XCTAssertTrue(streamedText(events).contains(#"tool said {"args":{"zone":"UTC"},"time":"12:00","tool":"clock.read"}"#),
                      streamedText(events))
        XCTAssertEqual(server.toolsExecuted, 1)
    }

    func testADeclinedToolReachesTheKernelAsDenied() async throws {
        let server = try AppServer.open(stateDirectory: tempStateDirectory(), kernel: EchoKernel(askTool: true), tools: ClockTools())
        defer { server.close() }
        let client = try await server.client(approvals: { _ in .decline(reason: "no clocks") })
        let (_, events) = try await runTurn(client, try await client.threadStart().thread.id)
        XCTAssertTrue(streamedText(events).contains("tool denied"), streamedText(events))
        XCTAssertTrue(streamedText(events).contains("no clocks"), streamedText(events))
        XCTAssertEqual(server.toolsExecuted, 0)
    }

    func testAThrowingExecutorBecomesTheToolsError() async throws {
        let server = try AppServer.open(stateDirectory: tempStateDirectory(), kernel: EchoKernel(askTool: true),
                                        tools: ClockTools(fail: true))
        defer { server.close() }
        let client = try await server.client(approvals: { _ in .acceptOnce })
        let (done, events) = try await runTurn(client, try await client.threadStart().thread.id)
        XCTAssertEqual(done.turn.status, .completed)
        XCTAssertTrue(streamedText(events).contains("tool failed"), streamedText(events))
        XCTAssertTrue(streamedText(events).contains("no clock here"), streamedText(events))
    }

    func testAThrowingKernelFailsTheTurnWithItsMessage() async throws {
        let server = try AppServer.open(stateDirectory: tempStateDirectory(), kernel: FailingKernel())
        defer { server.close() }
        let client = try await server.client()
        let (done, events) = try await runTurn(client, try await client.threadStart().thread.id)
        XCTAssertEqual(done.turn.status, .failed)
        let error = try XCTUnwrap(done.error)
        XCTAssertTrue(error.message.contains("the model is down"), error.message)
        XCTAssertEqual(streamedText(events), "trying")
    }

    func testAnInterruptCancelsTheKernelsTask() async throws {
        let kernel = PatientKernel()
        let server = try AppServer.open(stateDirectory: tempStateDirectory(), kernel: kernel)
        defer { server.close() }
        let client = try await server.client()
        let thread = try await client.threadStart().thread
        let run = try await client.turn(threadId: thread.id, text: "go")
        for try await n in run {
            if case .itemCompleted = n {
                let result = try await client.turnInterrupt(threadId: thread.id, turnId: run.turn.id)
                XCTAssertEqual(result.turn.status, .interrupted)
            }
        }
        XCTAssertTrue(kernel.sawCancellation)
    }

    func testAgentOptionsReachTheKernel() async throws {
        struct OptionsKernel: AgentKernel {
            func runTurn(_ turn: KernelTurn, input: TurnInput) async throws {
                guard case .object(let o) = try turn.agentOptions(), case .string(let model)? = o["model"] else {
                    return try turn.say("no model")
                }
                try turn.say("model \(model)")
            }
        }
        let server = try AppServer.open(stateDirectory: tempStateDirectory(), kernel: OptionsKernel())
        defer { server.close() }
        let client = try await server.client()
        let thread = try await client.threadStart(agentOptions: AgentOptions(model: "tiny-1")).thread
        let (_, events) = try await runTurn(client, thread.id)
        XCTAssertEqual(streamedText(events), "model tiny-1")
    }
}
