// Notification fan-out: one native listener per client (started with the client, on the
// library's delivery thread) feeds every stream a host has open. Each stream has its own bounded
// buffer, filled from the moment the stream is made; a full buffer makes the delivery thread wait
// (nothing is dropped), so a stream nobody reads must not be kept alive — dropping it (or
// cancelling the task that reads it) unsubscribes it.
import Foundation
internal import CcAppServerNative
import CcAppServerProtocol

/// One stream's buffer: whole notification messages (JSON text), in order, in the batches the
/// library delivered them.
final class Subscriber: @unchecked Sendable {
    private let cond = NSCondition()
    private var batches: [[String]] = []
    private var buffered = 0
    private let capacity: Int
    /// Set when the stream ends: the reader stopped (cancel, drop) or the client closed.
    private var ended = false
    private var closedBy: AppServerError?
    private var waiter: CheckedContinuation<[String]?, any Error>?

    init(capacity: Int) {
        self.capacity = max(1, capacity)
    }

    /// Delivery thread: appends a batch, waiting while the buffer is full. Never drops: returns
    /// only when the batch is queued or the stream has ended.
    func push(_ batch: [String]) {
        cond.lock()
        while !ended && buffered >= capacity && waiter == nil {
            cond.wait()
        }
        if ended {
            cond.unlock()
            return
        }
        if let w = waiter {
            waiter = nil
            cond.unlock()
            w.resume(returning: batch)
            return
        }
        batches.append(batch)
        buffered += batch.count
        cond.unlock()
    }

    /// The client closed: readers get what is buffered, then the end (or `error`).
    func close(_ error: AppServerError?) {
        cond.lock()
        if ended {
            cond.unlock()
            return
        }
        ended = true
        closedBy = error
        let w = waiter
        waiter = nil
        cond.broadcast()
        cond.unlock()
        finish(w, error)
    }

    /// The reader went away (cancelled, or the stream was dropped): stop buffering now.
    func cancel() {
        cond.lock()
        ended = true
        batches.removeAll()
        buffered = 0
        let w = waiter
        waiter = nil
        cond.broadcast()
        cond.unlock()
        w?.resume(returning: nil)
    }

    private func finish(_ w: CheckedContinuation<[String]?, any Error>?, _ error: AppServerError?) {
        guard let w else { return }
        if let error { w.resume(throwing: error) } else { w.resume(returning: nil) }
    }

    /// Reader: the next batch, waiting for one; nil at the end.
    func next() async throws -> [String]? {
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<[String]?, any Error>) in
                cond.lock()
                if !batches.isEmpty {
                    let b = batches.removeFirst()
                    buffered -= b.count
                    cond.broadcast()
                    cond.unlock()
                    c.resume(returning: b)
                } else if ended || Task.isCancelled {
                    ended = true
                    let e = closedBy
                    cond.broadcast()
                    cond.unlock()
                    finish(c, e)
                } else {
                    waiter = c
                    cond.broadcast()
                    cond.unlock()
                }
            }
        } onCancel: {
            self.cancel()
        }
    }
}

/// Feeds every subscriber of one client. The native layer calls it on its delivery thread.
final class Hub: CcAppServerNative.NotificationListener, @unchecked Sendable {
    private let lock = NSLock()
    private var subscribers: [Int: Subscriber] = [:]
    private var nextId = 0
    private var closed = false
    /// Set by `Client.close()`: the host's own close ends streams normally, anything else (a server
    /// shutdown, a connection the server dropped) ends them with `.closed`.
    private var closedByHost = false

    func subscribe(capacity: Int) -> (Int, Subscriber) {
        let s = Subscriber(capacity: capacity)
        lock.lock()
        let id = nextId
        nextId += 1
        if closed {
            let byHost = closedByHost
            lock.unlock()
            s.close(byHost ? nil : .closed(message: "the client is closed"))
            return (id, s)
        }
        subscribers[id] = s
        lock.unlock()
        return (id, s)
    }

    func unsubscribe(_ id: Int) {
        lock.lock()
        let s = subscribers.removeValue(forKey: id)
        lock.unlock()
        s?.cancel()
    }

    var subscriberCount: Int {
        lock.lock()
        defer { lock.unlock() }
        return subscribers.count
    }

    func hostClosed() {
        lock.lock()
        closedByHost = true
        lock.unlock()
        onClosedNow()
    }

    func onNotifications(messages: [String]) throws {
        lock.lock()
        let targets = Array(subscribers.values)
        lock.unlock()
        for s in targets { s.push(messages) }
    }

    func onClosed() throws {
        onClosedNow()
    }

    private func onClosedNow() {
        lock.lock()
        if closed {
            lock.unlock()
            return
        }
        closed = true
        let byHost = closedByHost
        let all = Array(subscribers.values)
        subscribers.removeAll()
        lock.unlock()
        for s in all { s.close(byHost ? nil : .closed(message: "the connection closed (server shut down or dropped it)")) }
    }
}

/// Unsubscribes when the last reference to a stream's state goes (the stream was dropped).
final class Subscription: @unchecked Sendable {
    let subscriber: Subscriber
    private let id: Int
    private weak var hub: Hub?
    private let lock = NSLock()
    private var batch: [String] = []
    private var index = 0

    init(hub: Hub, capacity: Int) {
        (id, subscriber) = hub.subscribe(capacity: capacity)
        self.hub = hub
    }

    deinit {
        hub?.unsubscribe(id)
    }

    /// The reader's task was cancelled: unsubscribe now.
    func cancel() {
        hub?.unsubscribe(id)
    }

    /// The next message's text, nil at the end. One reader at a time (as `AsyncThrowingStream` has).
    func nextText() async throws -> String? {
        while true {
            if let t = takeBuffered() { return t }
            guard let b = try await subscriber.next() else {
                hub?.unsubscribe(id)
                return nil
            }
            refill(b)
        }
    }

    private func takeBuffered() -> String? {
        lock.lock()
        defer { lock.unlock() }
        guard index < batch.count else { return nil }
        index += 1
        return batch[index - 1]
    }

    private func refill(_ b: [String]) {
        lock.lock()
        batch = b
        index = 0
        lock.unlock()
    }
}

/// Decodes one notification message for the typed streams.
func decodeNotification(_ text: String) throws -> ServerNotification {
    try decoding("notification") { try ServerNotification(json: JSONValue.parse(text), mode: .receive) }
}

extension ServerNotification {
    /// The thread this notification is about (nil for graph events and unknown methods).
    public var threadId: String? {
        switch self {
        case .threadUpdated(let n): return n.params.threadId
        case .turnStarted(let n): return n.params.threadId
        case .turnCompleted(let n): return n.params.threadId
        case .itemStarted(let n): return n.params.threadId
        case .itemDelta(let n): return n.params.threadId
        case .itemCompleted(let n): return n.params.threadId
        case .toolRequested(let n): return n.params.threadId
        case .toolResult(let n): return n.params.threadId
        case .approvalRequested(let n): return n.params.threadId
        case .approvalResolved(let n): return n.params.threadId
        case .graphEvent, .unknown: return nil
        }
    }

    /// The turn this notification is about (nil for thread updates, graph events, unknown methods).
    public var turnId: String? {
        switch self {
        case .turnStarted(let n): return n.params.turn.id
        case .turnCompleted(let n): return n.params.turn.id
        case .itemStarted(let n): return n.params.turnId
        case .itemDelta(let n): return n.params.turnId
        case .itemCompleted(let n): return n.params.turnId
        case .toolRequested(let n): return n.params.turnId
        case .toolResult(let n): return n.params.turnId
        case .approvalRequested(let n): return n.params.turnId
        case .approvalResolved(let n): return n.params.turnId
        case .threadUpdated, .graphEvent, .unknown: return nil
        }
    }
}
