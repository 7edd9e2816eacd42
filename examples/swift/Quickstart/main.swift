// The quickstart of docs/swift.md: open an in-process server, start a thread, stream a turn, answer its approval.
import CcAppServer
import Foundation

let script = #"{"steps": [{"type": "tool", "tool": "fs.write", "arguments": {"path": "hello.txt", "text": "hi"}},"#
    + #" {"type": "message", "text": "I wrote hello.txt.", "chunks": 3}]}"#
let stateDirectory = CommandLine.arguments.dropFirst().first ?? NSTemporaryDirectory() + "cc-quickstart-\(getpid())"

let server = try AppServer.open(stateDirectory: stateDirectory, options: ServerOptions(scriptJSON: script))
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
server.close()
