// Every decision through the suspend approval handler, and every fail-closed path (no handler, a
// throwing handler, a slow one — cooperative or blocking) declining with a logged diagnostic.
package com.chainlesschain.appserver

import com.chainlesschain.appserver.protocol.ApprovalOutcome
import com.chainlesschain.appserver.protocol.ApprovalRisk
import com.chainlesschain.appserver.protocol.ServerNotification
import com.chainlesschain.appserver.protocol.ToolResult
import com.chainlesschain.appserver.protocol.TurnStatus
import kotlinx.coroutines.delay
import kotlinx.coroutines.runBlocking
import org.json.JSONObject
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertNotNull
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.params.ParameterizedTest
import org.junit.jupiter.params.provider.ValueSource
import java.util.Collections

class ApprovalTest {
    private class Outcome(
        val resolved: List<ApprovalOutcome>,
        val status: TurnStatus,
        val asked: Int,
        val executed: Long,
        /** The reason of every denied tool result, in order. */
        val denied: List<String>,
    )

    /** Runs [turns] turns of [steps] on one thread with [decide]; returns what the server recorded. */
    private fun run(
        decide: ApprovalHandler?,
        vararg steps: String,
        turns: Int = 1,
        clientOptions: ClientOptions = ClientOptions(),
    ): Outcome = runBlocking {
        val asked = Collections.synchronizedList(mutableListOf<ApprovalRequest>())
        val handler = decide?.let { d -> ApprovalHandler { r -> asked.add(r); d.decide(r) } }
        AppServer.open(tempStateDir(), ServerOptions(workspace = "/repo")).use { server ->
            server.client(handler, clientOptions).use { client ->
                client.threadStart(threadId = "a", agentOptions = scriptOptions(script(*steps)))
                val resolved = mutableListOf<ApprovalOutcome>()
                val denied = mutableListOf<String>()
                var status: TurnStatus? = null
                repeat(turns) {
                    val turn = client.turnStart("a", "go").turn.id
                    val seen = client.collectUntil { completedTurn(it)?.id == turn }
                    seen.filterIsInstance<ServerNotification.ApprovalResolved>().forEach { resolved += it.value.params.outcome }
                    seen.filterIsInstance<ServerNotification.ToolResult>()
                        .mapNotNull { it.value.params.result as? ToolResult.Denied }
                        .forEach { denied += it.value.reason }
                    status = completedTurn(seen.last())!!.status
                }
                for (r in asked) {
                    assertEquals("fs.write", r.tool)
                    assertEquals("a.txt", (r.arguments as JSONObject).getString("path"))
                    assertEquals("a", r.threadId)
                    assertTrue(r.bindingMatches(ApprovalPolicy.ASK_EVERY_TIME, "/repo"))
                    assertFalse(r.bindingMatches(ApprovalPolicy.ASK_EVERY_TIME, "/elsewhere"))
                    // The published ApprovalRequest: its id names the nonce; it says how risky and why.
                    assertEquals("approval-" + r.binding.nonce, r.id)
                    assertEquals(r.id, r.published.id)
                    assertEquals("fs.write", r.published.operation.tool)
                    assertTrue(r.risk in ApprovalRisk.entries)
                    assertTrue(!r.reason.isNullOrEmpty())
                }
                Outcome(resolved, status!!, asked.size, server.stats().toolsExecuted, denied)
            }
        }
    }

    @Test
    fun `accept once runs the tool once and asks again next time`() {
        val o = run({ Decision.AcceptOnce }, TOOL_STEP, TOOL_STEP)
        assertEquals(listOf(ApprovalOutcome.Approved, ApprovalOutcome.Approved), o.resolved)
        assertEquals(2, o.asked)
        assertEquals(2L, o.executed)
        assertEquals(TurnStatus.Completed, o.status)
    }

    @Test
    fun `accept for turn covers the same operation for the rest of the turn only`() {
        val o = run({ Decision.AcceptForTurn }, TOOL_STEP, TOOL_STEP, turns = 2)
        assertEquals(2, o.asked, "asked once per turn")
        assertEquals(4L, o.executed)
    }

    @Test
    fun `accept for session covers later turns on the connection`() {
        val o = run({ Decision.AcceptForSession }, TOOL_STEP, TOOL_STEP, turns = 2)
        assertEquals(1, o.asked)
        assertEquals(4L, o.executed)
    }

    @Test
    fun `decline skips the tool and the turn goes on`() {
        val o = run({ Decision.Decline("not today") }, TOOL_STEP, messageStep("after"))
        assertEquals(listOf(ApprovalOutcome.Declined), o.resolved)
        assertEquals(0L, o.executed)
        assertEquals(TurnStatus.Completed, o.status)
        // The user's reason reaches the kernel in the denied tool result.
        assertEquals(listOf("approval declined: not today"), o.denied)
    }

    @Test
    fun `cancel skips the tool and interrupts the turn`() {
        val o = run({ Decision.Cancel }, TOOL_STEP, messageStep("never"))
        assertEquals(listOf(ApprovalOutcome.Cancelled), o.resolved)
        assertEquals(0L, o.executed)
        assertEquals(TurnStatus.Interrupted, o.status)
    }

    @Test
    fun `no handler declines with a WARNING naming the tool`() {
        CapturedLogs("com.chainlesschain.appserver.approval").use { logs ->
            val o = run(null, TOOL_STEP)
            assertEquals(listOf(ApprovalOutcome.Declined), o.resolved)
            assertEquals(0L, o.executed)
            assertEquals(listOf("approval declined: no approval handler is configured on this client"), o.denied)
            val warning = synchronized(logs.records) { logs.records.firstOrNull { it.message.contains("without an approval handler") } }
            assertNotNull(warning, "no WARNING for a client without a handler: ${logs.messages()}")
            assertEquals(java.util.logging.Level.WARNING, warning!!.level)
            assertTrue(warning.message.contains("fs.write"), warning.message)
        }
    }

    @Test
    fun `a throwing handler declines with a logged diagnostic`() {
        CapturedLogs("com.chainlesschain.appserver.approval").use { logs ->
            val o = run({ throw IllegalStateException("handler bug") }, TOOL_STEP)
            assertEquals(listOf(ApprovalOutcome.Declined), o.resolved)
            assertEquals(0L, o.executed)
            val line = logs.awaitMessage("approval handler threw")
            assertTrue("fail closed" in line, line)
            assertTrue(logs.records.any { it.thrown?.message == "handler bug" })
            assertEquals(
                listOf("approval declined: the approval handler failed: IllegalStateException: handler bug"),
                o.denied,
            )
        }
    }

    @ParameterizedTest
    @ValueSource(booleans = [true, false])
    fun `a slow handler declines at its deadline with a logged diagnostic`(cooperative: Boolean) {
        CapturedLogs("com.chainlesschain.appserver.approval").use { logs ->
            val started = System.nanoTime()
            val o = run(
                {
                    if (cooperative) delay(20_000) else Thread.sleep(5_000)
                    Decision.AcceptOnce
                },
                TOOL_STEP,
                clientOptions = ClientOptions(approvalTimeoutMs = 300),
            )
            val elapsedMs = (System.nanoTime() - started) / 1_000_000
            assertEquals(listOf(ApprovalOutcome.Declined), o.resolved)
            assertEquals(0L, o.executed)
            assertTrue(elapsedMs < 4_500, "declined after $elapsedMs ms, not at the 300 ms deadline")
            logs.awaitMessage("took longer than 300 ms")
            assertEquals(listOf("approval declined: the approval handler did not answer within 300 ms"), o.denied)
        }
    }
}
