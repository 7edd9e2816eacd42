// The Swift SDK benchmark (benches/swift/run.sh): request round trips and notifications per second
// delivered into a Swift `for try await` loop, through the SDK on the release library, next to the
// Rust client (printed by the Rust legs of run.sh). One JSON line per measurement.
//
// Notifications are measured two ways, as the Python benchmark does:
// - drain: the stream is opened, the engine streams N deltas into its buffer and the turn completes,
//   then the reader alone is timed up to turn/completed (what the SDK costs per notification);
// - live: the reader runs while the engine produces (end to end, bounded by the engine).
import CcAppServer
import Foundation

let args = CommandLine.arguments
let requests = args.count > 1 ? Int(args[1])! : 10_000
let notes = args.count > 2 ? Int(args[2])! : 100_000
let repeats = args.count > 3 ? Int(args[3])! : 5

func now() -> UInt64 { DispatchTime.now().uptimeNanoseconds }

func report(_ path: String, _ samples: [UInt64]) {
    let s = samples.sorted()
    let mean = s.reduce(0, +) / UInt64(s.count)
    print(#"{"path": "\#(path)", "n": \#(s.count), "p50_ns": \#(s[s.count / 2]), "p90_ns": \#(s[s.count * 9 / 10]), "mean_ns": \#(mean)}"#)
}

func medianRate(_ path: String, _ runs: [(count: Int, seconds: Double)]) {
    let sorted = runs.sorted { Double($0.count) / $0.seconds < Double($1.count) / $1.seconds }
    let mid = sorted[sorted.count / 2]
    let all = sorted.map { String(Int(Double($0.count) / $0.seconds)) }.joined(separator: ", ")
    print(#"{"path": "\#(path)", "n": \#(mid.count), "seconds": \#(String(format: "%.4f", mid.seconds)), "per_s": \#(Int(Double(mid.count) / mid.seconds)), "runs_per_s": [\#(all)]}"#)
}

let dir = NSTemporaryDirectory() + "cc-swift-bench-\(getpid())"
let server = try AppServer.open(stateDirectory: dir, options: ServerOptions(durability: .ephemeral))

// Round trips: thread/list with limit 1, p50 of `requests` after 10% warm-up.
do {
    let client = try await server.client()
    _ = try await client.threadStart(threadId: "rt")
    var typed: [UInt64] = [], raw: [UInt64] = []
    let params = JSONValue.object(["limit": .number("1")])
    for i in 0..<(requests + requests / 10) {
        let t = now()
        _ = try await client.request(method: "thread/list", params: params)
        if i >= requests / 10 { raw.append(now() - t) }
    }
    for i in 0..<(requests + requests / 10) {
        let t = now()
        _ = try await client.threadList(limit: 1)
        if i >= requests / 10 { typed.append(now() - t) }
    }
    report("swift sdk await client.request(thread/list) -> JSONValue", raw)
    report("swift sdk await client.threadList(limit:) -> ThreadListResult", typed)
    client.close()
}

let streamScript = JSONValue.object(["steps": .array([.object([
    "type": .string("message"), "text": .string(String(repeating: "x", count: notes)), "chunks": .number(String(notes)),
])])])

func freshThread(_ client: Client, _ id: String) async throws -> String {
    try await client.threadStart(threadId: id, agentOptions: AgentOptions(script: streamScript)).thread.id
}

/// Starts the turn and waits (without reading the stream) until it has completed.
func fill(_ client: Client, _ thread: String) async throws {
    _ = try await client.turnStart(threadId: thread, text: "go")
    while try await client.threadResume(threadId: thread, limit: 1).activeTurn != nil {
        try await Task.sleep(nanoseconds: 10_000_000)
    }
}

let done = #""method":"turn/completed""#

func drainRaw(_ s: RawNotifications) async throws -> Int {
    var n = 0
    for try await text in s {
        n += 1
        if text.utf8.count < 4096, text.contains(done) { break }
    }
    return n
}

func drainTyped(_ s: AsyncThrowingStream<ServerNotification, any Error>) async throws -> Int {
    var n = 0
    for try await note in s {
        n += 1
        if case .turnCompleted = note { break }
    }
    return n
}

let options = ClientOptions(streamBuffer: notes + 1000)
for typed in [false, true] {
    let kind = typed ? "typed ServerNotification" : "raw String"
    var drained: [(count: Int, seconds: Double)] = [], live: [(count: Int, seconds: Double)] = []
    for run in 0..<repeats {
        let client = try await server.client(options: options)
        let thread = try await freshThread(client, "\(kind.prefix(3))-drain-\(run)")
        if typed {
            let s = client.notifications()
            try await fill(client, thread)
            let t = now()
            let n = try await drainTyped(s)
            drained.append((n, Double(now() - t) / 1e9))
        } else {
            let s = client.rawNotifications()
            try await fill(client, thread)
            let t = now()
            let n = try await drainRaw(s)
            drained.append((n, Double(now() - t) / 1e9))
        }
        let second = try await freshThread(client, "\(kind.prefix(3))-live-\(run)")
        let t = now()
        if typed {
            let s = client.notifications()
            _ = try await client.turnStart(threadId: second, text: "go")
            live.append((try await drainTyped(s), Double(now() - t) / 1e9))
        } else {
            let s = client.rawNotifications()
            _ = try await client.turnStart(threadId: second, text: "go")
            live.append((try await drainRaw(s), Double(now() - t) / 1e9))
        }
        client.close()
    }
    medianRate("drain: swift sdk for try await in \(typed ? "notifications()" : "rawNotifications()") \(kind)", drained)
    medianRate("live: swift sdk for try await in \(typed ? "notifications()" : "rawNotifications()") \(kind)", live)
}
server.close()
try? FileManager.default.removeItem(atPath: dir)
