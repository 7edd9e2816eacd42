// Notification streams: buffering from the call, several at once, per-turn filtering, the end of
// a stream (client close, server shutdown, cancellation, drop), interrupt, and many clients.
@testable import CcAppServer
import Foundation
import XCTest

final class StreamTests: XCTestCase {
    private let chatty = script([message("one two three four", chunks: 4)])

    func testAStreamMadeBeforeTurnStartSeesEveryEvent() async throws {
        let server = try openServer(chatty)
        defer { server.close() }
        let client = try await server.client()
        let thread = try await client.threadStart().thread
        let stream = client.notifications()
        let started = try await client.turnStart(threadId: thread.id, text: "go")
        var seen: [ServerNotification] = []
        for try await n in stream {
            seen.append(n)
            if case .turnCompleted(let c) = n, c.params.turn.id == started.turn.id { break }
        }
        guard case .turnStarted(let first)? = seen.first(where: { $0.turnId == started.turn.id }) else {
            return XCTFail("turn/started missing: \(seen)")
        }
        XCTAssertEqual(first.params.turn.id, started.turn.id)
        XCTAssertEqual(streamedText(seen), "one two three four")
        // Event sequence numbers of this thread only grow.
        let seqs = seen.compactMap(\.eventSeq)
        XCTAssertEqual(seqs, seqs.sorted())
    }

    // docs/rollout-format.md, "Trace and parent ids": the host's trace reaches every event.
    func testATraceparentReachesEveryEventOfTheTurn() async throws {
        let server = try openServer(chatty)
        defer { server.close() }
        let client = try await server.client()
        let thread = try await client.threadStart().thread
        let trace = "4bf92f3577b34da6a3ce929d0e0e4736"
        let events = try await client.turn(threadId: thread.id, text: "go",
                                           traceparent: "00-\(trace)-00f067aa0ba902b7-01")
        for try await _ in events {}
        let read = try await client.threadRead(threadId: thread.id)
        let traced = read.events.filter { $0.traceId == trace }
        XCTAssertGreaterThan(traced.count, 4)
        XCTAssertEqual(traced.first?.parentId, "span:00f067aa0ba902b7")
        for e in traced.dropFirst() {
            XCTAssertLessThan(Int64(e.parentId ?? "") ?? .max, e.seq)
        }
    }

    func testSeveralStreamsEachSeeEverything() async throws {
        let server = try openServer(chatty)
        defer { server.close() }
        let client = try await server.client()
        let thread = try await client.threadStart().thread
        let a = client.notifications(), b = client.rawNotifications()
        let started = try await client.turnStart(threadId: thread.id, text: "go")
        async let typed: [ServerNotification] = Self.collect(a, until: started.turn.id)
        async let raw: [String] = Self.collectRaw(b, until: "turn/completed")
        let (ta, rb) = try await (typed, raw)
        XCTAssertEqual(ta.count, rb.count)
        XCTAssertEqual(try rb.map { try decodeNotification($0) }, ta)
    }

    func testTurnEventsAreFilteredToTheirTurnAndEnd() async throws {
        let server = try openServer(chatty)
        defer { server.close() }
        let client = try await server.client()
        let one = try await client.threadStart().thread, two = try await client.threadStart().thread
        let runOne = try await client.turn(threadId: one.id, text: "a")
        let runTwo = try await client.turn(threadId: two.id, text: "b")
        var countOne = 0
        for try await n in runOne {
            XCTAssertEqual(n.threadId, one.id)
            if let t = n.turnId { XCTAssertEqual(t, runOne.turn.id) }
            countOne += 1
        }
        let (done, events) = try await runTwo.completion()
        XCTAssertEqual(done.turn.id, runTwo.turn.id)
        XCTAssertTrue(events.allSatisfy { $0.threadId == two.id })
        XCTAssertGreaterThan(countOne, 4)
        XCTAssertEqual(streamedText(events), "one two three four")
    }

    func testCancellingTheReadingTaskEndsTheSubscription() async throws {
        let server = try openServer(script([sleepStep(ms: 50), message("x")]))
        defer { server.close() }
        let client = try await server.client()
        let hub = try XCTUnwrap(Mirror(reflecting: client).descendant("hub") as? Hub)
        let stream = client.notifications()
        XCTAssertEqual(hub.subscriberCount, 1)
        let reader = Task { () -> Int in
            var n = 0
            for try await _ in stream { n += 1 }
            return n
        }
        try await Task.sleep(nanoseconds: 50_000_000)
        reader.cancel()
        let count = try await reader.value
        XCTAssertEqual(count, 0)
        XCTAssertEqual(hub.subscriberCount, 0, "a cancelled stream must unsubscribe")
        // The client is still fine.
        _ = try await client.threadList()
    }

    func testACancelledRawReaderStopsEvenWithMessagesBuffered() async throws {
        let server = try openServer(script([message(String(repeating: "y", count: 500), chunks: 500)]))
        defer { server.close() }
        let client = try await server.client()
        let hub = try XCTUnwrap(Mirror(reflecting: client).descendant("hub") as? Hub)
        let raw = client.rawNotifications()
        let thread = try await client.threadStart().thread.id
        _ = try await client.turnStart(threadId: thread, text: "go")
        let reader = Task { () -> Int in
            var n = 0
            for try await _ in raw {
                n += 1
                // Cancel from inside once 10 are read: the next call must end the loop at once
                // although the buffer still holds the rest of the turn.
                if n == 10 { withUnsafeCurrentTask { $0?.cancel() } }
            }
            return n
        }
        let count = try await reader.value
        XCTAssertEqual(count, 10)
        XCTAssertEqual(hub.subscriberCount, 0, "a cancelled raw stream must unsubscribe")
        _ = try await client.threadList()
    }

    func testADroppedStreamUnsubscribes() async throws {
        let server = try openServer()
        defer { server.close() }
        let client = try await server.client()
        let hub = try XCTUnwrap(Mirror(reflecting: client).descendant("hub") as? Hub)
        do {
            let s = client.notifications()
            XCTAssertEqual(hub.subscriberCount, 1)
            _ = s
        }
        XCTAssertEqual(hub.subscriberCount, 0)
    }

    func testStreamsEndWhenTheClientCloses() async throws {
        let server = try openServer()
        defer { server.close() }
        let client = try await server.client()
        let stream = client.notifications()
        let reader = Task { () -> Int in
            var n = 0
            for try await _ in stream { n += 1 }
            return n
        }
        try await Task.sleep(nanoseconds: 20_000_000)
        client.close()
        let n = try await reader.value
        XCTAssertEqual(n, 0)
        XCTAssertTrue(client.isClosed)
        // A stream made after close ends at once.
        var after = 0
        for try await _ in client.notifications() { after += 1 }
        XCTAssertEqual(after, 0)
    }

    func testStreamsThrowClosedWhenTheServerShutsDown() async throws {
        let server = try openServer()
        let client = try await server.client()
        let stream = client.notifications()
        let reader = Task { () -> Error? in
            do {
                for try await _ in stream {}
                return nil
            } catch { return error }
        }
        try await Task.sleep(nanoseconds: 20_000_000)
        server.close()
        let error = await reader.value
        guard case .closed? = error as? AppServerError else { return XCTFail("expected .closed, got \(String(describing: error))") }
    }

    func testInterruptARunningTurn() async throws {
        let server = try openServer(script([message("start"), sleepStep(ms: 30_000), message("never")]))
        defer { server.close() }
        let client = try await server.client()
        let thread = try await client.threadStart().thread
        let run = try await client.turn(threadId: thread.id, text: "go")
        var sawStart = false
        for try await n in run {
            if case .itemCompleted = n, !sawStart {
                sawStart = true
                let result = try await client.turnInterrupt(threadId: thread.id, turnId: run.turn.id)
                XCTAssertEqual(result.turn.status, .interrupted)
            }
            if case .turnCompleted(let c) = n { XCTAssertEqual(c.params.turn.status, .interrupted) }
        }
        XCTAssertTrue(sawStart)
    }

    func testASecondTurnWhileOneRunsIsAConflict() async throws {
        let server = try openServer(script([sleepStep(ms: 30_000)]))
        defer { server.close() }
        let client = try await server.client()
        let thread = try await client.threadStart().thread
        let first = try await client.turnStart(threadId: thread.id, text: "a")
        let error = await assertAppServerError { try await client.turnStart(threadId: thread.id, text: "b") }
        guard case .conflict? = error else { return XCTFail("expected .conflict, got \(String(describing: error))") }
        XCTAssertEqual(error?.code, -32009)
        _ = try await client.turnInterrupt(threadId: thread.id, turnId: first.turn.id)
    }

    func testManyConcurrentClients() async throws {
        let server = try openServer()
        defer { server.close() }
        let results = try await withThrowingTaskGroup(of: (TurnStatus, Int).self) { group in
            for i in 0..<12 {
                group.addTask {
                    let client = try await server.client(approvals: { _ in .acceptOnce })
                    defer { client.close() }
                    let thread = try await client.threadStart(title: "client \(i)").thread
                    let (done, events) = try await runTurn(client, thread.id)
                    XCTAssertTrue(events.allSatisfy { $0.threadId == thread.id })
                    return (done.turn.status, toolResults(events).count)
                }
            }
            var all: [(TurnStatus, Int)] = []
            for try await r in group { all.append(r) }
            return all
        }
        XCTAssertEqual(results.count, 12)
        XCTAssertTrue(results.allSatisfy { $0.0 == .completed && $0.1 == 1 }, "\(results)")
        XCTAssertEqual(server.toolsExecuted, 12)
    }

    func testConcurrentRequestsOnOneClient() async throws {
        let server = try openServer()
        defer { server.close() }
        let client = try await server.client()
        let ids = try await withThrowingTaskGroup(of: String.self) { group in
            for i in 0..<40 {
                group.addTask { try await client.threadStart(threadId: "t\(i)").thread.id }
            }
            var out: Set<String> = []
            for try await id in group { out.insert(id) }
            return out
        }
        XCTAssertEqual(ids, Set((0..<40).map { "t\($0)" }))
        let listed = try await client.threadList(limit: 100)
        XCTAssertEqual(Set(listed.threads.map(\.id)), ids)
        XCTAssertEqual(client.pendingRequests, 0)
    }

    func testABufferSmallerThanATurnLosesNothing() async throws {
        // A stream buffer of 2 messages: the delivery thread waits for the reader instead of
        // dropping, so every delta still arrives, in order.
        let server = try openServer(script([message(String(repeating: "ab", count: 200), chunks: 200)]))
        defer { server.close() }
        let client = try await server.client(options: ClientOptions(streamBuffer: 2))
        let thread = try await client.threadStart().thread
        let (_, events) = try await runTurn(client, thread.id)
        XCTAssertEqual(streamedText(events), String(repeating: "ab", count: 200))
    }

    func testAZeroStreamBufferIsRefused() async throws {
        let server = try openServer()
        defer { server.close() }
        let error = await assertAppServerError { try await server.client(options: ClientOptions(streamBuffer: 0)) }
        guard case .invalidParams? = error else { return XCTFail("got \(String(describing: error))") }
    }

    // MARK: helpers

    private static func collect(_ s: AsyncThrowingStream<ServerNotification, any Error>, until turnId: String) async throws -> [ServerNotification] {
        var out: [ServerNotification] = []
        for try await n in s {
            out.append(n)
            if case .turnCompleted(let c) = n, c.params.turn.id == turnId { break }
        }
        return out
    }

    private static func collectRaw(_ s: RawNotifications, until method: String) async throws -> [String] {
        var out: [String] = []
        for try await t in s {
            out.append(t)
            if t.contains("\"method\":\"\(method)\"") { break }
        }
        return out
    }
}

extension ServerNotification {
    /// The rollout seq this notification reports, when it has one.
    var eventSeq: Int64? {
        switch self {
        case .turnStarted(let n): return n.params.eventSeq
        case .turnCompleted(let n): return n.params.eventSeq
        case .itemStarted(let n): return n.params.eventSeq
        case .itemDelta(let n): return n.params.eventSeq
        case .itemCompleted(let n): return n.params.eventSeq
        default: return nil
        }
    }
}
