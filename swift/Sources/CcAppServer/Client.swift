// A connected, initialized client: one async method per request, typed with the generated
// protocol types, and notification streams.
import Foundation
internal import CcAppServerNative
import CcAppServerProtocol

/// One client of an `AppServer`. Requests may run concurrently from any task. `close()` it when
/// done (dropping the last reference closes it too).
public final class Client: Sendable {
    private let native: CcAppServerNative.Client
    private let hub: Hub
    private let delivery: TaskHandle
    private let streamBuffer: Int
    /// The server's `initialize` result.
    public let initializeResult: InitializeResult

    init(server: AppServer, approvals: ApprovalHandler?, options: ClientOptions) throws {
        let timeout = options.approvalTimeout ?? 30
        let handler: ApprovalHandler = approvals ?? { params in
            Log.emit(.warn, "no approval handler on this client: declining \(params.operation.tool) (\(params.binding.itemId))")
            return .decline(reason: "no approval handler is configured on this client")
        }
        let nativeOptions = CcAppServerNative.ClientOptions(
            requestTimeoutMs: millis(options.requestTimeout), maxPending: int32(options.maxPending),
            approvalTimeoutMs: millis(options.approvalTimeout), notificationCapacity: nil)
        guard options.streamBuffer >= 1 else {
            throw AppServerError.invalidParams(message: "streamBuffer must be at least 1 (got \(options.streamBuffer))")
        }
        let client = try mapNative {
            try CcAppServerNative.Client.connect(
                server: server.native, handler: ApprovalBridge(handler, timeout: timeout), options: nativeOptions)
        }
        let hub = Hub()
        self.native = client
        self.hub = hub
        self.streamBuffer = options.streamBuffer
        do {
            delivery = try mapNative { try client.listen(listener: hub) }
            initializeResult = try decoding("initialize result") {
                try InitializeResult(json: JSONValue.parse(client.initializeResult()))
            }
        } catch {
            client.close()
            throw error
        }
    }

    deinit {
        hub.hostClosed()
        delivery.cancel()
        native.close()
    }

    /// Closes the client now: requests in flight end with `.closed`, open notification streams
    /// end after what they buffered. Idempotent.
    public func close() {
        hub.hostClosed()
        delivery.cancel()
        native.close()
    }

    /// True once closed: by `close()`, a server shutdown, or a connection the server dropped.
    public var isClosed: Bool { native.isClosed() }

    /// Requests waiting for an answer now.
    public var pendingRequests: Int { Int(native.pendingRequests()) }

    // MARK: Requests

    /// Any request by method name; `params` must be a JSON object. The result as JSON.
    public func request(method: String, params: JSONValue = .object([:])) async throws -> JSONValue {
        let text = try await call(method, params.encoded)
        return try decoding("\(method) result") { try JSONValue.parse(text) }
    }

    private func call(_ method: String, _ params: String) async throws -> String {
        do { return try await native.request(method: method, paramsJson: params) } catch {
            throw AppServerError.from(error)
        }
    }

    private func typed<R>(_ method: String, _ params: JSONValue, _ decode: (JSONValue) throws -> R) async throws -> R {
        let text = try await call(method, params.encoded)
        return try decoding("\(method) result") { try decode(JSONValue.parse(text)) }
    }

    public func threadStart(_ params: ThreadStartParams) async throws -> ThreadStartResult {
        try await typed("thread/start", params.toJSON()) { try ThreadStartResult(json: $0) }
    }

    /// Starts a thread. `threadId` (file-safe) and `idempotencyKey` make a retry safe.
    public func threadStart(title: String? = nil, threadId: String? = nil, metadata: Metadata? = nil,
                            agentOptions: AgentOptions? = nil, idempotencyKey: String? = nil) async throws -> ThreadStartResult {
        try await threadStart(ThreadStartParams(threadId: threadId, title: title, metadata: metadata,
                                                agentOptions: agentOptions, idempotencyKey: idempotencyKey))
    }

    /// The thread and a page of its durable events.
    public func threadRead(threadId: String, afterEventSeq: Int64? = nil, limit: Int64? = nil) async throws -> ThreadReadResult {
        try await typed("thread/read", ThreadReadParams(threadId: threadId, afterEventSeq: afterEventSeq, limit: limit).toJSON()) {
            try ThreadReadResult(json: $0)
        }
    }

    /// Reopens a thread (after a restart too): its events, and the turn still running, if any.
    public func threadResume(threadId: String, afterEventSeq: Int64? = nil, limit: Int64? = nil) async throws -> ThreadResumeResult {
        try await typed("thread/resume", ThreadResumeParams(threadId: threadId, afterEventSeq: afterEventSeq, limit: limit).toJSON()) {
            try ThreadResumeResult(json: $0)
        }
    }

    /// A new thread holding this one's history up to `atEventSeq` (default: all of it).
    public func threadFork(threadId: String, atEventSeq: Int64? = nil, newThreadId: String? = nil, title: String? = nil,
                           idempotencyKey: String? = nil) async throws -> ThreadForkResult {
        let p = ThreadForkParams(threadId: threadId, newThreadId: newThreadId, atEventSeq: atEventSeq, title: title,
                                 idempotencyKey: idempotencyKey)
        return try await typed("thread/fork", p.toJSON()) { try ThreadForkResult(json: $0) }
    }

    /// A page of threads, newest first; pass `nextCursor` back for the next page.
    public func threadList(includeArchived: Bool? = nil, cursor: String? = nil, limit: Int64? = nil) async throws -> ThreadListResult {
        let p = ThreadListParams(includeArchived: includeArchived, cursor: cursor.map { .value($0) } ?? .absent, limit: limit)
        return try await typed("thread/list", p.toJSON()) { try ThreadListResult(json: $0) }
    }

    public func threadArchive(threadId: String) async throws -> ThreadArchiveResult {
        try await typed("thread/archive", ThreadArchiveParams(threadId: threadId).toJSON()) { try ThreadArchiveResult(json: $0) }
    }

    /// Replaces the thread's history so far with `summary` (the kernel's own when nil).
    public func threadCompact(threadId: String, summary: String? = nil) async throws -> ThreadCompactResult {
        try await typed("thread/compact", ThreadCompactParams(threadId: threadId, summary: summary).toJSON()) {
            try ThreadCompactResult(json: $0)
        }
    }

    /// `traceparent`: a W3C trace context (`00-<trace id>-<span id>-<flags>`) every event of the
    /// turn is recorded under, its first naming your span (else the turn starts its own trace).
    public func turnStart(threadId: String, input: [UserInput], idempotencyKey: String? = nil,
                          traceparent: String? = nil) async throws -> TurnStartResult {
        let p = TurnStartParams(threadId: threadId, input: input, idempotencyKey: idempotencyKey, traceparent: traceparent)
        return try await typed("turn/start", p.toJSON()) { try TurnStartResult(json: $0) }
    }

    /// Starts a turn with one text input. Its events arrive as notifications (see `turn`).
    public func turnStart(threadId: String, text: String, idempotencyKey: String? = nil,
                          traceparent: String? = nil) async throws -> TurnStartResult {
        try await turnStart(threadId: threadId, input: [.text(TextInput(text: text))], idempotencyKey: idempotencyKey,
                            traceparent: traceparent)
    }

    /// Interrupts a running turn and waits until it has settled.
    public func turnInterrupt(threadId: String, turnId: String) async throws -> TurnInterruptResult {
        try await typed("turn/interrupt", TurnInterruptParams(threadId: threadId, turnId: turnId).toJSON()) {
            try TurnInterruptResult(json: $0)
        }
    }

    public func graphValidate(definition: GraphDefinition, grant: GraphRunGrant? = nil) async throws -> GraphValidateResult {
        try await typed("graph/validate", GraphValidateParams(definition: definition, grant: grant).toJSON()) {
            try GraphValidateResult(json: $0)
        }
    }

    public func graphRunStart(_ params: GraphRunStartParams) async throws -> GraphRunStartResult {
        try await typed("graph/run/start", params.toJSON()) { try GraphRunStartResult(json: $0) }
    }

    public func graphRunStart(definition: GraphDefinition, runId: String? = nil, inputs: GraphValues? = nil,
                              grant: GraphRunGrant? = nil, options: GraphRunOptions? = nil,
                              idempotencyKey: String? = nil) async throws -> GraphRunStartResult {
        try await graphRunStart(GraphRunStartParams(definition: definition, runId: runId, inputs: inputs, grant: grant,
                                                    options: options, idempotencyKey: idempotencyKey))
    }

    public func graphRunRead(runId: String, includeContent: Bool? = nil, afterEventSeq: Int64? = nil,
                             limit: Int64? = nil) async throws -> GraphRunReadResult {
        let p = GraphRunReadParams(runId: runId, includeContent: includeContent, afterEventSeq: afterEventSeq, limit: limit)
        return try await typed("graph/run/read", p.toJSON()) { try GraphRunReadResult(json: $0) }
    }

    public func graphRunCancel(runId: String, reason: String? = nil) async throws -> GraphRunCancelResult {
        try await typed("graph/run/cancel", GraphRunCancelParams(runId: runId, reason: reason).toJSON()) {
            try GraphRunCancelResult(json: $0)
        }
    }

    // MARK: Notifications

    /// Every notification from now on, typed. Buffers from this call (a stream made before
    /// `turnStart` sees every event of that turn); several may coexist, each sees everything.
    /// Ends when the client closes (with `.closed` if the server closed it); cancelling the task
    /// that reads it, or dropping it, unsubscribes.
    public func notifications() -> AsyncThrowingStream<ServerNotification, any Error> {
        let sub = Subscription(hub: hub, capacity: streamBuffer)
        return AsyncThrowingStream {
            guard let text = try await sub.nextText() else { return nil }
            return try decodeNotification(text)
        }
    }

    /// `notifications()` as the raw JSON-RPC message text, for hosts that route or store them
    /// without decoding (the fastest path: a buffered message is returned without suspending).
    public func rawNotifications() -> RawNotifications {
        RawNotifications(subscription: Subscription(hub: hub, capacity: streamBuffer))
    }

    /// Starts a turn and returns its events: subscribed before the turn starts, filtered to this
    /// turn, ending after its `turn/completed`.
    public func turn(threadId: String, text: String, idempotencyKey: String? = nil,
                     traceparent: String? = nil) async throws -> TurnEvents {
        try await turn(threadId: threadId, input: [.text(TextInput(text: text))], idempotencyKey: idempotencyKey,
                       traceparent: traceparent)
    }

    public func turn(threadId: String, input: [UserInput], idempotencyKey: String? = nil,
                     traceparent: String? = nil) async throws -> TurnEvents {
        let sub = Subscription(hub: hub, capacity: streamBuffer)
        let started = try await turnStart(threadId: threadId, input: input, idempotencyKey: idempotencyKey,
                                          traceparent: traceparent)
        let turnId = started.turn.id
        let done = Flag()
        let stream = AsyncThrowingStream<ServerNotification, any Error> {
            if done.isSet { return nil }
            while let text = try await sub.nextText() {
                let n = try decodeNotification(text)
                // This turn's events only: thread-level ones (no turnId) belong to no turn.
                guard n.threadId == threadId, n.turnId == turnId else { continue }
                if case .turnCompleted = n { done.set() }
                return n
            }
            return nil
        }
        return TurnEvents(turn: started.turn, stream: stream)
    }
}

/// The raw notification messages of `Client.rawNotifications()`, in order, from the moment it was
/// made. Same semantics as `notifications()`: iterate it from one task; cancelling that task or
/// dropping the sequence unsubscribes; it ends when the client closes.
public struct RawNotifications: AsyncSequence, Sendable {
    public typealias Element = String
    let subscription: Subscription

    public struct AsyncIterator: AsyncIteratorProtocol {
        let subscription: Subscription

        public mutating func next() async throws -> String? {
            if Task.isCancelled {
                subscription.cancel()
                return nil
            }
            return try await subscription.nextText()
        }
    }

    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(subscription: subscription)
    }
}

/// The events of one turn (`Client.turn`): iterate it; it ends after the turn's `turn/completed`.
public struct TurnEvents: AsyncSequence, Sendable {
    public typealias Element = ServerNotification
    /// The turn as `turn/start` returned it.
    public let turn: Turn
    let stream: AsyncThrowingStream<ServerNotification, any Error>

    public func makeAsyncIterator() -> AsyncThrowingStream<ServerNotification, any Error>.AsyncIterator {
        stream.makeAsyncIterator()
    }

    /// Reads the whole turn and returns its `turn/completed` params (and every event on the way).
    public func completion() async throws -> (completed: TurnCompletedParams, events: [ServerNotification]) {
        var events: [ServerNotification] = []
        for try await n in self {
            events.append(n)
            if case .turnCompleted(let c) = n { return (c.params, events) }
        }
        throw AppServerError.closed(message: "the client closed before turn \(turn.id) completed")
    }

    /// Reads the whole turn and returns the assistant's text: the `text` of the turn's completed
    /// `agentMessage` items, in order, joined with "\n". A turn that ended `failed` throws
    /// `.kernelFailed` (with the turn error's code as `reason`), one that was interrupted
    /// `.turnInterrupted`.
    public func text() async throws -> String {
        let (completed, events) = try await completion()
        switch completed.turn.status {
        case .failed:
            throw AppServerError.kernelFailed(
                reason: completed.error?.code ?? "failed", message: completed.error?.message ?? "the turn failed",
                turnId: turn.id)
        case .interrupted:
            throw AppServerError.turnInterrupted(turnId: turn.id)
        default:
            var parts: [String] = []
            for case .itemCompleted(let n) in events {
                if case .agentMessage(let message) = n.params.item.content { parts.append(message.text) }
            }
            return parts.joined(separator: "\n")
        }
    }
}

final class Flag: @unchecked Sendable {
    private let lock = NSLock()
    private var value = false
    var isSet: Bool {
        lock.lock()
        defer { lock.unlock() }
        return value
    }

    func set() {
        lock.lock()
        value = true
        lock.unlock()
    }
}
