// The quickstart of docs/swift.md: an in-process server, a thread, a turn streamed, its approval answered.
import CcAppServer
import Foundation

let script = #"{"steps": [{"type": "tool", "tool": "write_file", "arguments": {"path": "hello.txt", "content": "hi"}},"#
    + #" {"type": "message", "text": "I wrote hello.txt.", "chunks": 3}]}"#
let base = CommandLine.arguments.dropFirst().first ?? NSTemporaryDirectory() + "cc-quickstart-\(getpid())"
try FileManager.default.createDirectory(atPath: base + "/workspace", withIntermediateDirectories: true)
let options = ServerOptions(scriptJSON: script, workspaceToolsDirectory: base + "/workspace")
let server = try AppServer.open(stateDirectory: base + "/state", options: options)
let client = try await server.client { request in
    print("approve \(request.operation.tool) \(request.operation.arguments.encoded) (risk \(request.risk))? yes")
    return .acceptOnce
}
let thread = try await client.threadStart(title: "quickstart").thread
for try await event in try await client.turn(threadId: thread.id, text: "write hello.txt") {
    switch event {
    case .itemDelta(let n): if case .text(let d) = n.params.delta { print(d.text, terminator: "") }
    case .turnCompleted(let n): print("\nturn \(n.params.turn.status.wire)")
    default: break
    }
}
print("hello.txt holds: " + (try String(contentsOfFile: base + "/workspace/hello.txt", encoding: .utf8)))
server.close()
