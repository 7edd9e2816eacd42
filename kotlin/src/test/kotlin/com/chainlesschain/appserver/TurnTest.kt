// The per-turn stream (`Client.turn`) on the scripted kernel: deltas and the assistant's text, an
// approval answered by the client's handler, a failing kernel (KernelFailed), an interrupt
// (TurnInterrupted), and two turns on two threads that never see each other's events.
package com.chainlesschain.appserver

import com.chainlesschain.appserver.protocol.ServerNotification
import com.chainlesschain.appserver.protocol.TurnStatus
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.async
import kotlinx.coroutines.flow.toList
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.assertThrows

class TurnTest {
    // docs/rollout-format.md, "Trace and parent ids": the host's trace reaches every event.
    @Test
    fun `a traceparent reaches every event of the turn`() = runBlocking {
        AppServer.open(tempStateDir()) { durability = Durability.EPHEMERAL }.use { server ->
            server.client().use { client ->
                val trace = "4bf92f3577b34da6a3ce929d0e0e4736"
                client.threadStart(threadId = "tr", agentOptions = scriptOptions(script(messageStep("traced", chunks = 2))))
                val turn = client.turn("tr", "go", traceparent = "00-$trace-00f067aa0ba902b7-01")
                assertEquals("traced", turn.text())
                val traced = client.threadRead("tr").events.filter { it.traceId == trace }
                assertTrue(traced.size >= 5, "$traced")
                assertEquals("span:00f067aa0ba902b7", traced.first().parentId)
                assertTrue(traced.drop(1).all { (it.parentId?.toLongOrNull() ?: Long.MAX_VALUE) < it.seq }, "$traced")
            }
        }
    }

    @Test
    fun `a turn's events, its text and an approval`() = runBlocking {
        var asked = 0
        AppServer.open(tempStateDir()) { durability = Durability.EPHEMERAL }.use { server ->
            server.client(approvals = { asked++; Decision.AcceptOnce }).use { client ->
                client.threadStart(threadId = "t", agentOptions = scriptOptions(script(messageStep("hello there", chunks = 3), TOOL_STEP, messageStep("done"))))
                val turn = client.turn("t", "go")
                val events = withTimeout(WAIT_MS) { turn.events.toList() }
                assertTrue(events.last() is ServerNotification.TurnCompleted, "${events.last()}")
                // Three chunks of the first message, one of the second.
                assertEquals(4, events.count { it is ServerNotification.ItemDelta })
                assertTrue(events.any { it is ServerNotification.ApprovalResolved })
                assertTrue(events.all { notificationScope(it) == ("t" to turn.turnId) })
                assertEquals("hello there\ndone", turn.text())
                assertEquals(TurnStatus.Completed, turn.completion().turn.status)
                assertEquals(1, asked)
                assertEquals(1L, server.stats().toolsExecuted)
            }
        }
    }

    @Test
    fun `a failing kernel is KernelFailed, an interrupted turn TurnInterrupted`() = runBlocking {
        AppServer.open(tempStateDir()).use { server ->
            server.client().use { client ->
                client.threadStart(threadId = "f", agentOptions = scriptOptions(script("""{"type":"fail","message":"no luck"}""")))
                val failing = client.turn("f", "go")
                val failed = assertThrows<AppServerException.KernelFailed> { runBlocking { withTimeout(WAIT_MS) { failing.text() } } }
                assertEquals("kernelFailed", failed.reason)
                assertEquals(failing.turnId, failed.turnId)
                assertTrue("no luck" in (failed.message ?: ""), failed.message)
                // completion() still answers, with the error beside the turn.
                assertEquals(TurnStatus.Failed, failing.completion().turn.status)

                client.threadStart(threadId = "i", agentOptions = scriptOptions(script(messageStep("in"), sleepStep(20_000))))
                val sleeping = client.turn("i", "go")
                val text = async(Dispatchers.IO) { runCatching { withTimeout(WAIT_MS) { sleeping.text() } } }
                client.turnInterrupt("i", sleeping.turnId)
                val interrupted = text.await().exceptionOrNull()
                assertTrue(interrupted is AppServerException.TurnInterrupted, "$interrupted")
                assertEquals(sleeping.turnId, (interrupted as AppServerException.TurnInterrupted).turnId)
            }
        }
    }

    @Test
    fun `two turns on two threads are isolated`() = runBlocking {
        AppServer.open(tempStateDir()).use { server ->
            server.client().use { client ->
                client.threadStart(threadId = "a", agentOptions = scriptOptions(script(messageStep("from a", chunks = 4))))
                client.threadStart(threadId = "b", agentOptions = scriptOptions(script(messageStep("from b", chunks = 4))))
                val a = client.turn("a", "go")
                val b = client.turn("b", "go")
                // Read b first: a's events wait in its own handle meanwhile.
                assertEquals("from b", withTimeout(WAIT_MS) { b.text() })
                assertEquals("from a", withTimeout(WAIT_MS) { a.text() })
                // A second turn on the same thread only sees its own turn.
                val again = client.turn("a", "again")
                val events = withTimeout(WAIT_MS) { again.events.toList() }
                assertTrue(events.all { notificationScope(it) == ("a" to again.turnId) })
                assertTrue(events.last() is ServerNotification.TurnCompleted)
            }
        }
    }
}
