// Graph runs from Kotlin against the real library: compile (and refuse with a rule code and a JSON
// pointer), run durably with the tool node passing the approval handler, read back, cancel.
package com.chainlesschain.appserver

import com.chainlesschain.appserver.protocol.GraphCompileErrorCode
import com.chainlesschain.appserver.protocol.GraphEventParams
import com.chainlesschain.appserver.protocol.GraphRunStatus
import com.chainlesschain.appserver.protocol.GraphRunUpdatedParams
import com.chainlesschain.appserver.protocol.ServerNotification
import kotlinx.coroutines.runBlocking
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.assertThrows
import java.util.concurrent.atomic.AtomicInteger

class GraphTest {
    private companion object {
        val GRANT = listOf("agent", "tool:echo")

        /** The run's state when [n] is a `graph/event` of type runUpdated. */
        fun runUpdate(n: ServerNotification): GraphRunUpdatedParams? =
            ((n as? ServerNotification.GraphEvent)?.value?.params as? GraphEventParams.RunUpdated)?.value
    }

    private fun definition(target: String = "tell") = """
        {"graphVersion": 1, "id": "kt-graph",
         "outputs": [{"name": "said", "type": "text"}],
         "nodes": [
           {"kind": "tool", "id": "fetch", "tool": "echo", "arguments": {"what": "news"},
            "outputs": [{"name": "result", "type": "json"}]},
           {"kind": "agent", "id": "tell", "inputs": [{"name": "facts", "type": "json"}],
            "outputs": [{"name": "text", "type": "text"}]}],
         "edges": [
           {"from": {"node": "fetch", "port": "result"}, "to": {"node": "$target", "port": "facts"}},
           {"from": {"node": "tell", "port": "text"}, "to": {"port": "said"}}]}
    """.trimIndent()

    @Test
    fun `validate, run, read and cancel a graph`() = runBlocking {
        val asked = AtomicInteger()
        AppServer.open(tempStateDir(), ServerOptions(durability = Durability.BUFFERED)).use { server ->
            server.client(approvals = { asked.incrementAndGet(); Decision.AcceptOnce }).use { client ->
                val ok = client.graphValidate(definition(), GRANT)
                assertTrue(ok.valid)
                assertEquals(2L, ok.nodeCount)
                val refused = client.graphValidate(definition(target = "nowhere"), GRANT)
                assertFalse(refused.valid)
                assertTrue(refused.errors.first().pointer.startsWith("/edges/0"), refused.errors.toString())
                val ungranted = client.graphValidate(definition())
                assertFalse(ungranted.valid, "nothing is granted unless listed")
                assertEquals(GraphCompileErrorCode.CapabilityNotGranted, ungranted.errors.first().code)
                assertThrows<AppServerException.InvalidJson> { runBlocking { client.graphValidate("{\"graphVersion\": 1}") } }

                client.graphRunStart(definition(), runId = "kt-run", capabilities = GRANT)
                // Graph runs report through one published method, graph/event, tagged by type.
                val seen = client.collectUntil {
                    runUpdate(it)?.run?.status.let { s ->
                        s == GraphRunStatus.Succeeded || s == GraphRunStatus.Failed || s == GraphRunStatus.Cancelled
                    }
                }
                assertEquals(GraphRunStatus.Succeeded, runUpdate(seen.last())!!.run.status)
                val nodes = seen.mapNotNull { ((it as? ServerNotification.GraphEvent)?.value?.params as? GraphEventParams.NodeUpdated)?.value }
                assertEquals(setOf("fetch", "tell"), nodes.map { it.node.nodeId }.toSet())
                assertTrue(nodes.all { it.runId == "kt-run" })
                val read = client.graphRunRead("kt-run", includeContent = true)
                assertEquals(setOf("fetch", "tell"), read.nodes.map { it.nodeId }.toSet())
                assertTrue(read.run.outputs!!.containsKey("said"))
                val cancelled = client.graphRunCancel("kt-run", "already done")
                assertTrue(cancelled.fenced.isEmpty())
            }
            assertEquals(1, asked.get(), "the tool node asked the approval handler once")
            assertEquals(1L, server.stats().toolsExecuted)
        }
    }
}
