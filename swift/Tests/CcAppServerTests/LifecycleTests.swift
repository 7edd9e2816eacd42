// Threads over their life and across restarts: read, resume, fork, list, archive, compact, keyed
// rollouts, both stores, the bytes on disk, and typed errors for bad input.
@testable import CcAppServer
import Foundation
import XCTest

final class LifecycleTests: XCTestCase {
    func testRestartAndResumeFromDisk() async throws {
        let dir = tempStateDirectory()
        var threadId = ""
        var revision: Int64 = 0
        do {
            let server = try openServer(directory: dir)
            let client = try await server.client(approvals: { _ in .acceptOnce })
            threadId = try await client.threadStart(title: "survives").thread.id
            let (done, _) = try await runTurn(client, threadId)
            revision = done.turn.revision
            server.close()
        }
        let again = try openServer(directory: dir)
        defer { again.close() }
        let client = try await again.client()
        let resumed = try await client.threadResume(threadId: threadId)
        XCTAssertEqual(resumed.thread.title, "survives")
        XCTAssertNil(resumed.activeTurn)
        XCTAssertGreaterThanOrEqual(resumed.thread.revision, revision)
        XCTAssertTrue(resumed.events.contains { if case .turnCompleted = $0.payload { return true } else { return false } })
        // The chain links: every event's prevHash is the previous event's hash.
        for (a, b) in zip(resumed.events, resumed.events.dropFirst()) {
            XCTAssertEqual(b.prevHash, a.hash)
            XCTAssertEqual(b.seq, a.seq + 1)
        }
        let listed = try await client.threadList()
        XCTAssertEqual(listed.threads.map(\.id), [threadId])
    }

    func testTheCompactProfileAdmitsEightClientsAndRefusesTheNinth() async throws {
        let server = try openServer(options: ServerOptions(durability: .buffered, profile: .compact))
        defer { server.close() }
        var clients: [Client] = []
        for _ in 0..<8 { clients.append(try await server.client()) }
        do {
            _ = try await server.client()
            XCTFail("a ninth client was admitted")
        } catch let e as AppServerError {
            guard case .overloaded(let retryAfter) = e else { return XCTFail("\(e)") }
            XCTAssertEqual(e.code, -32001)
            XCTAssertGreaterThan(retryAfter, 0)
        }
        clients.removeFirst().close()
        let again = try await server.client()
        let listed = try await again.threadList()
        XCTAssertEqual(listed.threads.count, 0)
        again.close()
        clients.forEach { $0.close() }
    }

    func testTheRolloutIsOnDiskAsJSONLines() async throws {
        let dir = tempStateDirectory()
        let server = try openServer(directory: dir)
        let client = try await server.client(approvals: { _ in .acceptOnce })
        let thread = try await client.threadStart(threadId: "on-disk").thread
        _ = try await runTurn(client, thread.id)
        server.close()
        let files = try FileManager.default.subpathsOfDirectory(atPath: dir).filter { $0.hasSuffix("on-disk.jsonl") }
        let path = try XCTUnwrap(files.first, "no rollout file in \(dir)")
        let text = try String(contentsOfFile: dir + "/" + path, encoding: .utf8)
        let lines = text.split(separator: "\n")
        XCTAssertGreaterThan(lines.count, 5)
        var previous: String?
        for line in lines {
            guard case .object(let event) = try JSONValue.parse(String(line)) else { return XCTFail("not an object: \(line)") }
            if let previous { XCTAssertEqual(event["prevHash"], .string(previous)) }
            guard case .string(let hash)? = event["hash"] else { return XCTFail("no hash: \(line)") }
            previous = hash
        }
        XCTAssertTrue(text.contains("\"turnCompleted\""))
    }

    func testThreadReadPagesThroughEvents() async throws {
        let server = try openServer()
        defer { server.close() }
        let client = try await server.client(approvals: { _ in .acceptOnce })
        let thread = try await client.threadStart().thread
        _ = try await runTurn(client, thread.id)
        let first = try await client.threadRead(threadId: thread.id, limit: 2)
        XCTAssertEqual(first.events.count, 2)
        XCTAssertTrue(first.hasMore)
        let rest = try await client.threadRead(threadId: thread.id, afterEventSeq: first.events.last!.seq)
        XCTAssertEqual(rest.events.first?.seq, first.events.last!.seq + 1)
        XCTAssertFalse(rest.hasMore)
    }

    func testForkCopiesHistoryUpToAnEvent() async throws {
        let server = try openServer()
        defer { server.close() }
        let client = try await server.client(approvals: { _ in .acceptOnce })
        let thread = try await client.threadStart(title: "parent").thread
        _ = try await runTurn(client, thread.id)
        let parent = try await client.threadRead(threadId: thread.id)
        let at = parent.events[1].seq
        let fork = try await client.threadFork(threadId: thread.id, atEventSeq: at, title: "child")
        XCTAssertEqual(fork.forkedFrom.threadId, thread.id)
        XCTAssertEqual(fork.forkedFrom.eventSeq, at)
        XCTAssertEqual(fork.forkedFrom.eventHash, parent.events[1].hash)
        XCTAssertEqual(fork.thread.parentThreadId, thread.id)
        XCTAssertNotEqual(fork.thread.id, thread.id)
        // The child runs turns of its own.
        let (done, _) = try await runTurn(client, fork.thread.id)
        XCTAssertEqual(done.turn.status, .completed)
    }

    func testArchiveHidesAThreadFromTheDefaultList() async throws {
        let server = try openServer()
        defer { server.close() }
        let client = try await server.client()
        let keep = try await client.threadStart(threadId: "keep").thread
        let gone = try await client.threadStart(threadId: "gone").thread
        let archived = try await client.threadArchive(threadId: gone.id)
        XCTAssertEqual(archived.thread.status, .archived)
        let visible = try await client.threadList().threads.map(\.id)
        XCTAssertEqual(visible, [keep.id])
        let all = try await client.threadList(includeArchived: true).threads.map(\.id)
        XCTAssertEqual(Set(all), [keep.id, gone.id])
    }

    func testThreadListPagesWithACursor() async throws {
        let server = try openServer()
        defer { server.close() }
        let client = try await server.client()
        for i in 0..<5 { _ = try await client.threadStart(threadId: "p\(i)") }
        let page = try await client.threadList(limit: 2)
        XCTAssertEqual(page.threads.count, 2)
        let cursor = try XCTUnwrap(page.nextCursor)
        let next = try await client.threadList(cursor: cursor, limit: 10)
        XCTAssertEqual(next.threads.count, 3)
        XCTAssertTrue(Set(page.threads.map(\.id)).isDisjoint(with: next.threads.map(\.id)))
    }

    func testCompactWithACallerSummary() async throws {
        let server = try openServer(script([message("a long answer", chunks: 3)]))
        defer { server.close() }
        let client = try await server.client()
        let thread = try await client.threadStart().thread
        _ = try await runTurn(client, thread.id)
        let done = try await client.threadCompact(threadId: thread.id, summary: "the user said go")
        XCTAssertEqual(done.summary, "the user said go")
        XCTAssertLessThanOrEqual(done.fromSeq, done.toSeq)
        let again = await assertAppServerError { try await client.threadCompact(threadId: thread.id, summary: "again") }
        XCTAssertEqual(again?.code, -32602)
    }

    func testIdempotentThreadStartReturnsTheSameThread() async throws {
        let server = try openServer()
        defer { server.close() }
        let client = try await server.client()
        let a = try await client.threadStart(title: "once", idempotencyKey: "k-1").thread
        let b = try await client.threadStart(title: "once", idempotencyKey: "k-1").thread
        XCTAssertEqual(a.id, b.id)
        let count = try await client.threadList().threads.count
        XCTAssertEqual(count, 1)
    }

    func testKeyedRolloutsReopenWithTheirKey() async throws {
        let dir = tempStateDirectory()
        let key = (0..<32).map { UInt8($0) }
        do {
            let server = try openServer(options: ServerOptions(rolloutKey: key), directory: dir)
            let client = try await server.client(approvals: { _ in .acceptOnce })
            _ = try await client.threadStart(threadId: "keyed")
            _ = try await runTurn(client, "keyed")
            server.close()
        }
        let server = try openServer(options: ServerOptions(rolloutKey: key), directory: dir)
        let client = try await server.client()
        let resumed = try await client.threadResume(threadId: "keyed")
        XCTAssertTrue(resumed.events.contains { if case .turnCompleted = $0.payload { return true } else { return false } })
        server.close()
        // The anchors carry a MAC under the key: the key never appears on disk.
        let keyHex = key.map { String(format: "%02x", $0) }.joined()
        for path in try FileManager.default.subpathsOfDirectory(atPath: dir) {
            guard let data = FileManager.default.contents(atPath: dir + "/" + path) else { continue }
            XCTAssertFalse(String(decoding: data, as: UTF8.self).contains(keyHex), path)
        }
    }

    func testAKeyedStoreRefusesAnotherKey() async throws {
        let dir = tempStateDirectory()
        do {
            let server = try openServer(options: ServerOptions(rolloutKey: Array(repeating: 7, count: 32)), directory: dir)
            let client = try await server.client()
            _ = try await client.threadStart(threadId: "keyed")
            server.close()
        }
        do {
            let server = try openServer(options: ServerOptions(rolloutKey: Array(repeating: 8, count: 32)), directory: dir)
            defer { server.close() }
            let client = try await server.client()
            _ = try await client.threadResume(threadId: "keyed")
            XCTFail("a store keyed with another key must not open silently")
        } catch let e as AppServerError {
            XCTAssertFalse(e.message.isEmpty)
        }
    }

    func testARolloutKeyMustBe32Bytes() async throws {
        let error = await assertAppServerError { try openServer(options: ServerOptions(rolloutKey: Array(repeating: 1, count: 31))) }
        guard case .invalidParams(let m)? = error else { return XCTFail("got \(String(describing: error))") }
        XCTAssertTrue(m.contains("32"), m)
    }

    func testTheSQLiteStoreRunsTheSameFlow() async throws {
        let dir = tempStateDirectory()
        do {
            let server = try openServer(options: ServerOptions(store: .sqlite), directory: dir)
            let client = try await server.client(approvals: { _ in .acceptOnce })
            _ = try await client.threadStart(threadId: "sql")
            let (done, _) = try await runTurn(client, "sql")
            XCTAssertEqual(done.turn.status, .completed)
            server.close()
        }
        let again = try openServer(options: ServerOptions(store: .sqlite), directory: dir)
        defer { again.close() }
        let resumed = try await again.client().threadResume(threadId: "sql")
        XCTAssertGreaterThan(resumed.events.count, 5)
    }

    func testEphemeralAndBufferedDurabilityOpen() async throws {
        for durability in [Durability.buffered, .ephemeral] {
            let server = try openServer(options: ServerOptions(durability: durability))
            let client = try await server.client(approvals: { _ in .acceptOnce })
            let (done, _) = try await runTurn(client, try await client.threadStart().thread.id)
            XCTAssertEqual(done.turn.status, .completed, "\(durability)")
            server.close()
        }
    }

    func testTheInitializeResultIsTyped() async throws {
        let server = try openServer()
        defer { server.close() }
        let client = try await server.client()
        XCTAssertEqual(client.initializeResult.schemaDigest, schemaDigest)
        XCTAssertFalse(client.initializeResult.features.isEmpty)
    }

    // MARK: typed errors

    func testAnUnknownThreadIsNotFound() async throws {
        let server = try openServer()
        defer { server.close() }
        let client = try await server.client()
        let error = await assertAppServerError { try await client.threadRead(threadId: "missing") }
        guard case .notFound? = error else { return XCTFail("got \(String(describing: error))") }
        XCTAssertEqual(error?.code, -32004)
    }

    func testAPathLikeThreadIdIsInvalidParams() async throws {
        let server = try openServer()
        defer { server.close() }
        let client = try await server.client()
        let error = await assertAppServerError { try await client.threadStart(threadId: "../etc") }
        guard case .invalidParams? = error else { return XCTFail("got \(String(describing: error))") }
        XCTAssertEqual(error?.code, -32602)
    }

    func testAnUnknownMethodKeepsItsCode() async throws {
        let server = try openServer()
        defer { server.close() }
        let client = try await server.client()
        let error = await assertAppServerError { try await client.request(method: "no/such") }
        guard case .server(let code, _, _)? = error else { return XCTFail("got \(String(describing: error))") }
        XCTAssertEqual(code, -32601)
    }

    func testTheRawRequestPath() async throws {
        let server = try openServer()
        defer { server.close() }
        let client = try await server.client()
        _ = try await client.threadStart(threadId: "raw")
        let result = try await client.request(method: "thread/list", params: .object(["limit": .number("5")]))
        guard case .object(let o) = result, case .array(let threads)? = o["threads"] else { return XCTFail("\(result)") }
        XCTAssertEqual(threads.count, 1)
        let notObject = await assertAppServerError { try await client.request(method: "thread/list", params: .array([])) }
        XCTAssertEqual(notObject?.code, -32602)
    }

    func testABadStateDirectoryIsAStoreError() async throws {
        let file = tempStateDirectory() + "/plain-file"
        XCTAssertTrue(FileManager.default.createFile(atPath: file, contents: Data("x".utf8)))
        let error = await assertAppServerError { try AppServer.open(stateDirectory: file) }
        guard case .storeUnsafe? = error else { return XCTFail("got \(String(describing: error))") }
        let empty = await assertAppServerError { try AppServer.open(stateDirectory: "") }
        guard case .invalidParams? = empty else { return XCTFail("got \(String(describing: empty))") }
    }

    func testASecondServerOnTheSameDirectoryIsRefused() async throws {
        let dir = tempStateDirectory()
        let first = try openServer(directory: dir)
        defer { first.close() }
        let error = await assertAppServerError { try openServer(directory: dir) }
        guard case .storeLocked? = error else { return XCTFail("got \(String(describing: error))") }
    }

    func testAClosedClientRefusesRequests() async throws {
        let server = try openServer()
        defer { server.close() }
        let client = try await server.client()
        client.close()
        client.close()
        let error = await assertAppServerError { try await client.threadList() }
        guard case .closed? = error else { return XCTFail("got \(String(describing: error))") }
    }

    func testAClosedServerRefusesNewClientsAndEndsOldOnes() async throws {
        let server = try openServer()
        let client = try await server.client()
        server.close()
        let old = await assertAppServerError { try await client.threadList() }
        guard case .closed? = old else { return XCTFail("got \(String(describing: old))") }
        let fresh = await assertAppServerError { try await server.client() }
        guard case .closed? = fresh else { return XCTFail("got \(String(describing: fresh))") }
    }

    func testARequestOverTheLineLimitIsRefusedLocally() async throws {
        let server = try openServer(options: ServerOptions(limits: Limits(maxLineBytes: 4096)))
        defer { server.close() }
        let client = try await server.client()
        let thread = try await client.threadStart().thread
        let error = await assertAppServerError {
            try await client.turnStart(threadId: thread.id, text: String(repeating: "x", count: 5000))
        }
        guard case .lineTooLarge(let size, let max)? = error else { return XCTFail("got \(String(describing: error))") }
        XCTAssertEqual(max, 4096)
        XCTAssertGreaterThan(size, 5000)
        // Nothing was accepted: the thread has no turn.
        let resumed = try await client.threadResume(threadId: thread.id)
        XCTAssertNil(resumed.activeTurn)
        XCTAssertFalse(resumed.events.contains { if case .turnStarted = $0.payload { return true } else { return false } })
    }
}
