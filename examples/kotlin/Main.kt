// The smallest complete Kotlin host: opens a server in a state directory, connects a client with
// a suspend approval handler, runs the scripted demo turn (reasoning, a tool behind an approval,
// a streamed answer) while collecting the typed notification Flow, then verifies the rollout.
// Run: bash scripts/test-jvm.sh builds the jar and runs this on a plain `java -cp` classpath.
import com.chainlesschain.appserver.AppServer
import com.chainlesschain.appserver.Decision
import com.chainlesschain.appserver.protocol.AgentOptions
import com.chainlesschain.appserver.protocol.ItemContent
import com.chainlesschain.appserver.protocol.ItemDelta
import com.chainlesschain.appserver.protocol.ProtocolJson
import com.chainlesschain.appserver.protocol.ServerNotification
import kotlinx.coroutines.flow.takeWhile
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking

private val DEMO_SCRIPT = """{"steps":[
  {"type":"reasoning","text":"The user wants a file written; that needs approval."},
  {"type":"tool","tool":"fs.write","arguments":{"path":"notes/hello.txt","text":"hello from Kotlin"}},
  {"type":"message","text":"I wrote notes/hello.txt after you approved it.","chunks":4}]}"""

fun main(args: Array<String>) = runBlocking {
    val stateDir = args.firstOrNull() ?: error("usage: Main <state-dir>")
    AppServer.open(stateDir).use { server ->
        val client = server.client(approvals = { request ->
            println("approval requested: ${request.tool} ${request.argumentsJson} (risk ${request.risk.wire})")
            Decision.AcceptOnce
        })
        client.use {
            val events = launch {
                client.notifications().takeWhile { it !is ServerNotification.TurnCompleted }.collect { n ->
                    when (n) {
                        is ServerNotification.ItemDelta -> (n.value.params.delta as? ItemDelta.Text)?.let { println("delta: " + it.value.text) }
                        // The published Item: kind and status around the body the kernel reported.
                        is ServerNotification.ItemCompleted -> n.value.params.item.let { item ->
                            val text = (item.content as? ItemContent.AgentMessage)?.value?.text
                            println("item ${item.kind.wire} ${item.status.wire}" + (text?.let { ": $it" } ?: ""))
                        }
                        is ServerNotification.ApprovalResolved -> println("approval ${n.value.params.outcome.wire}")
                        else -> println("notification ${n.toJson().getString("method")}")
                    }
                }
            }
            val thread = client.threadStart(title = "kotlin example", agentOptions = AgentOptions(script = ProtocolJson.parse(DEMO_SCRIPT)))
            val turn = client.turnStart(thread.thread.id, "write me a note")
            events.join()
            val done = client.threadRead(thread.thread.id).thread
            println("turn ${turn.turn.id} done; thread ${done.id} is at revision ${done.revision}")
            val report = server.store().verify(done.id)
            println("rollout verified: ${if (report.ok) "ok" else "FAILED " + report.reason}")
        }
    }
}
