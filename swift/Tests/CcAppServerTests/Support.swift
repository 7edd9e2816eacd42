// Shared helpers of the SDK tests: fresh state directories, scripts for the built-in scripted
// kernel, a recording approval handler and log capture. Everything runs against the real library.
@testable import CcAppServer
import Foundation
import XCTest

/// A new, empty directory under the system temporary directory.
func tempStateDirectory(_ name: String = #function) -> String {
    let safe = name.filter { $0.isLetter || $0.isNumber }
    let dir = NSTemporaryDirectory() + "cc-swift-\(safe)-\(UUID().uuidString.prefix(8))"
    try! FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
    return dir
}

/// A scripted-kernel script (docs/kernels.md) as JSON.
func script(_ steps: [JSONValue]) -> JSONValue {
    .object(["steps": .array(steps)])
}

func message(_ text: String, chunks: Int = 1) -> JSONValue {
    .object(["type": .string("message"), "text": .string(text), "chunks": .number(String(chunks))])
}

func toolStep(_ tool: String = "fs.write", _ arguments: JSONValue = .object(["path": .string("a.txt"), "text": .string("x")])) -> JSONValue {
    .object(["type": .string("tool"), "tool": .string(tool), "arguments": arguments])
}

func sleepStep(ms: Int) -> JSONValue {
    .object(["type": .string("sleep"), "ms": .number(String(ms))])
}

func failStep(_ text: String) -> JSONValue {
    .object(["type": .string("fail"), "message": .string(text)])
}

let toolThenMessage = script([toolStep(), message("done", chunks: 2)])

/// Counts and records what an approval handler was asked.
final class Recorder: @unchecked Sendable {
    private let lock = NSLock()
    private var asked: [ApprovalDecideParams] = []

    func record(_ p: ApprovalDecideParams) {
        lock.lock()
        asked.append(p)
        lock.unlock()
    }

    var requests: [ApprovalDecideParams] {
        lock.lock()
        defer { lock.unlock() }
        return asked
    }

    /// A handler that records and answers `decision`.
    func handler(_ decision: Decision) -> ApprovalHandler {
        { [self] params in
            record(params)
            return decision
        }
    }
}

/// Captures SDK and library log records while a test runs.
final class LogCapture: @unchecked Sendable {
    private let lock = NSLock()
    private var records: [LogRecord] = []

    init(level: LogLevel = .info) {
        Logging.setHandler({ [self] r in
            lock.lock()
            records.append(r)
            lock.unlock()
        }, level: level)
    }

    var messages: [String] {
        lock.lock()
        defer { lock.unlock() }
        return records.map(\.message)
    }

    var targets: [String] {
        lock.lock()
        defer { lock.unlock() }
        return records.map(\.target)
    }

    /// Waits (the library delivers on its own thread) until a message satisfies `match`.
    func waitFor(_ match: (String) -> Bool, seconds: Double = 5) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if messages.contains(where: match) { return true }
            Thread.sleep(forTimeInterval: 0.01)
        }
        return false
    }

    func stop() {
        Logging.setHandler(nil)
    }
}

/// A server over a fresh directory with `script` as the scripted kernel's default.
func openServer(_ script: JSONValue = toolThenMessage, options: ServerOptions = .init(),
                directory: String = tempStateDirectory()) throws -> AppServer {
    var o = options
    o.scriptJSON = script.encoded
    return try AppServer.open(stateDirectory: directory, options: o)
}

/// Thread start params whose thread runs `script`.
func scripted(_ s: JSONValue, threadId: String? = nil) -> ThreadStartParams {
    ThreadStartParams(threadId: threadId, agentOptions: AgentOptions(script: s))
}

/// Runs one turn to completion and returns its completion and events.
func runTurn(_ client: Client, _ threadId: String, _ text: String = "go") async throws
    -> (completed: TurnCompletedParams, events: [ServerNotification]) {
    try await client.turn(threadId: threadId, text: text).completion()
}

/// The tool results among `events`.
func toolResults(_ events: [ServerNotification]) -> [ToolResult] {
    events.compactMap { if case .toolResult(let n) = $0 { return n.params.result } else { return nil } }
}

/// The text of every text delta among `events`, joined.
func streamedText(_ events: [ServerNotification]) -> String {
    events.compactMap { e -> String? in
        if case .itemDelta(let n) = e, case .text(let d) = n.params.delta { return d.text }
        return nil
    }.joined()
}

/// Asserts `body` throws an `AppServerError` and returns it.
func assertAppServerError<T>(_ body: () async throws -> T, file: StaticString = #filePath, line: UInt = #line) async -> AppServerError? {
    do {
        _ = try await body()
        XCTFail("expected an AppServerError", file: file, line: line)
        return nil
    } catch let e as AppServerError {
        return e
    } catch {
        XCTFail("expected an AppServerError, got \(error)", file: file, line: line)
        return nil
    }
}
