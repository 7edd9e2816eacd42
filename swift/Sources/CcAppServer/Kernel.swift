// Host-implemented agent kernels and tool executors. The engine calls them on its own threads;
// the bridges here run the async functions as tasks, turn an interrupt into task cancellation,
// and map errors onto the boundary's (a kernel's failure fails the turn; a tool's failure becomes
// the tool's `error` result).
import Foundation
internal import CcAppServerNative
import CcAppServerProtocol

/// Runs one turn: emit items through `turn`, ask for tools with `turn.requestTool` (which passes
/// the approval gate), return when done. An interrupt cancels the task (check
/// `Task.isCancelled`, or let `Task.sleep` throw); throwing fails the turn with the error's text.
public protocol AgentKernel: Sendable {
    func runTurn(_ turn: KernelTurn, input: TurnInput) async throws
}

/// Runs an approved tool call; the returned JSON is the tool's output. Throwing makes the tool's
/// result an `error` (the turn goes on).
public protocol ToolExecutor: Sendable {
    func execute(threadId: String, tool: String, arguments: JSONValue) async throws -> JSONValue
}

/// What the user sent for this turn: every text input joined, and the wire `UserInput` array.
public struct TurnInput: Hashable, Sendable {
    public var text: String
    public var input: [UserInput]
}

/// The turn was cancelled (interrupt, shutdown, or the user cancelled at an approval).
public struct TurnCancelled: Error, Hashable, Sendable {
    public init() {}
}

/// The engine's side of one running turn; valid only while `AgentKernel.runTurn` runs.
public final class KernelTurn: Sendable {
    private let ctx: TurnContext
    public let threadId: String
    public let turnId: String

    init(_ ctx: TurnContext) {
        self.ctx = ctx
        threadId = ctx.threadId()
        turnId = ctx.turnId()
    }

    /// The thread's `agentOptions` (`.null` when none were given).
    public func agentOptions() throws -> JSONValue {
        try JSONValue.parse(kernelCall { try ctx.agentOptionsJson() })
    }

    /// True once the turn has been asked to stop.
    public var isCancelled: Bool { ctx.isCancelled() }

    public func newItemId() throws -> String {
        try kernelCall { try ctx.newItemId() }
    }

    /// Records and announces `item/started` with `item` as the published item's `content`.
    public func itemStarted(_ item: ItemContent) throws {
        try kernelCall { try ctx.itemStarted(itemJson: item.toJSON().encoded) }
    }

    public func itemDelta(itemId: String, _ delta: ItemDelta) throws {
        try kernelCall { try ctx.itemDelta(itemId: itemId, deltaJson: delta.toJSON().encoded) }
    }

    /// Records and announces `item/completed`: the item's final content.
    public func itemCompleted(_ item: ItemContent) throws {
        try kernelCall { try ctx.itemCompleted(itemJson: item.toJSON().encoded) }
    }

    /// Asks for a tool through the approval gate and waits (off the Swift thread pool) for the
    /// decision and the run. `.denied` when the gate failed closed; throws `TurnCancelled` when the
    /// user cancelled at the approval or the turn was interrupted.
    public func requestTool(itemId: String, tool: String, arguments: JSONValue) async throws -> ToolResult {
        let ctx = self.ctx
        let args = arguments.encoded
        let text: String = try await offThePool {
            try kernelCall { try ctx.requestTool(itemId: itemId, tool: tool, argumentsJson: args) }
        }
        return try decoding("tool result") { try ToolResult(json: JSONValue.parse(text)) }
    }

    /// Streams `text` as one agent message: item started, one delta, item completed.
    public func say(_ text: String) throws {
        let id = try newItemId()
        try itemStarted(.agentMessage(AgentMessageItem(id: id, text: "")))
        try itemDelta(itemId: id, .text(TextDelta(text: text)))
        try itemCompleted(.agentMessage(AgentMessageItem(id: id, text: text)))
    }
}

private func kernelCall<T>(_ body: () throws -> T) throws -> T {
    do { return try body() } catch let e as KernelError {
        switch e {
        case .Cancelled: throw TurnCancelled()
        case .Expired: throw AppServerError.closed(message: "this KernelTurn belongs to a turn whose runTurn has returned")
        case .Invalid(let reason): throw AppServerError.invalidParams(message: reason)
        case .Failed(let reason): throw AppServerError.server(code: ErrorCode.internal, message: reason, data: nil)
        }
    }
}

/// Runs a blocking native call on a thread of its own, so a Swift task awaiting it never holds
/// one of the (few) cooperative threads while a human decides.
func offThePool<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { c in
        let t = Thread { c.resume(with: Result { try body() }) }
        t.name = "cc-swift-blocking"
        t.start()
    }
}

/// A result box a native thread waits on while a task runs.
private final class Completion: @unchecked Sendable {
    private let done = DispatchSemaphore(value: 0)
    private var result: Result<Void, any Error> = .success(())

    func finish(_ r: Result<Void, any Error>) {
        result = r
        done.signal()
    }

    /// Waits, polling `cancelled` every 10 ms (to cancel `task`) until the task finishes.
    func wait(cancelling task: Task<Void, Never>, when cancelled: () -> Bool) -> Result<Void, any Error> {
        var asked = false
        while done.wait(timeout: .now() + .milliseconds(10)) == .timedOut {
            if !asked && cancelled() {
                asked = true
                task.cancel()
            }
        }
        return result
    }
}

final class KernelBridge: CcAppServerNative.AgentKernel, @unchecked Sendable {
    private let kernel: any AgentKernel

    init(_ kernel: any AgentKernel) {
        self.kernel = kernel
    }

    func runTurn(ctx: TurnContext, input: CcAppServerNative.TurnInput) throws {
        let turn = KernelTurn(ctx)
        let inputs: [UserInput]
        do {
            guard case .array(let items) = try JSONValue.parse(input.json) else {
                throw KernelError.Invalid(reason: "the turn input is not an array")
            }
            inputs = try items.map { try UserInput(json: $0) }
        } catch let e as KernelError {
            throw e
        } catch {
            throw KernelError.Failed(reason: "the turn input did not decode: \(describe(error))")
        }
        let kernel = self.kernel
        let value = TurnInput(text: input.text, input: inputs)
        let completion = Completion()
        let task = Task {
            do {
                try await kernel.runTurn(turn, input: value)
                completion.finish(.success(()))
            } catch {
                completion.finish(.failure(error))
            }
        }
        switch completion.wait(cancelling: task, when: { ctx.isCancelled() }) {
        case .success:
            return
        case .failure(let error):
            if error is TurnCancelled || error is CancellationError || ctx.isCancelled() {
                throw KernelError.Cancelled
            }
            if let e = error as? KernelError { throw e }
            throw KernelError.Failed(reason: describe(error))
        }
    }
}

final class ToolBridge: CcAppServerNative.ToolExecutor, @unchecked Sendable {
    private let tools: any ToolExecutor

    init(_ tools: any ToolExecutor) {
        self.tools = tools
    }

    func execute(threadId: String, tool: String, argumentsJson: String) throws -> String {
        let tools = self.tools
        let arguments: JSONValue
        do { arguments = try JSONValue.parse(argumentsJson) } catch {
            throw HandlerError.Failed(reason: "tool arguments did not parse: \(describe(error))")
        }
        let box = ResultBox()
        let done = DispatchSemaphore(value: 0)
        Task {
            do { box.value = .success(try await tools.execute(threadId: threadId, tool: tool, arguments: arguments)) } catch {
                box.value = .failure(error)
            }
            done.signal()
        }
        done.wait()
        switch box.value {
        case .success(let output): return output.encoded
        case .failure(let error): throw HandlerError.Failed(reason: describe(error))
        case nil: throw HandlerError.Failed(reason: "the tool executor returned nothing")
        }
    }
}

private final class ResultBox: @unchecked Sendable {
    var value: Result<JSONValue, any Error>?
}
