// The notification Flow: fan-out to several collectors, a slow collector losing nothing, a
// throwing collector ending only itself, cancellation releasing the native listener, the unknown
// form kept; and interrupts and cancellation of a suspended request.
package com.chainlesschain.appserver

import com.chainlesschain.appserver.protocol.ItemDelta
import com.chainlesschain.appserver.protocol.ServerNotification
import com.chainlesschain.appserver.protocol.TurnStatus
import kotlinx.coroutines.CoroutineStart
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.TimeoutCancellationException
import kotlinx.coroutines.async
import kotlinx.coroutines.cancelAndJoin
import kotlinx.coroutines.delay
import kotlinx.coroutines.flow.collect
import kotlinx.coroutines.flow.onEach
import kotlinx.coroutines.flow.takeWhile
import kotlinx.coroutines.flow.toList
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import org.json.JSONObject
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertNotNull
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.assertThrows
import java.util.concurrent.atomic.AtomicInteger

class NotificationsTest {
    private fun textOf(n: ServerNotification): String? =
        ((n as? ServerNotification.ItemDelta)?.value?.params?.delta as? ItemDelta.Text)?.value?.text

    /** Every notification up to (not including) the first turn/completed. */
    private fun Client.untilCompleted() = notifications().takeWhile { completedTurn(it) == null }

    @Test
    fun `a slow collector and a fast one both see every notification in order`() = runBlocking {
        AppServer.open(tempStateDir(), ServerOptions(durability = Durability.EPHEMERAL)).use { server ->
            server.client(options = ClientOptions(collectorBuffer = 8)).use { client ->
                val slowReady = AtomicInteger()
                val fast = async(Dispatchers.IO, start = CoroutineStart.UNDISPATCHED) {
                    client.untilCompleted().toList()
                }
                val slow = async(Dispatchers.IO, start = CoroutineStart.UNDISPATCHED) {
                    client.untilCompleted().onEach {
                        slowReady.incrementAndGet()
                        delay(2)
                    }.toList()
                }
                while (!client.hasNativeListener) delay(5)
                client.startScripted("many", script(messageStep("x".repeat(300), 300)))
                val fastSeen = withTimeout(WAIT_MS) { fast.await() }
                val slowSeen = withTimeout(WAIT_MS) { slow.await() }
                val deltas = fastSeen.mapNotNull { textOf(it) }
                assertEquals(300, deltas.size)
                assertEquals("x".repeat(300), deltas.joinToString(""))
                assertEquals(fastSeen, slowSeen)
                // Requests are not held up by a lagging collector within its buffer.
                assertNotNull(client.threadList())
            }
        }
    }

    @Test
    fun `a collector that throws ends only itself`() = runBlocking {
        AppServer.open(tempStateDir()).use { server ->
            server.client().use { client ->
                val thrower = async(Dispatchers.IO, start = CoroutineStart.UNDISPATCHED) {
                    runCatching { client.notifications().collect { throw IllegalStateException("collector bug") } }
                }
                val steady = async(Dispatchers.IO, start = CoroutineStart.UNDISPATCHED) {
                    client.untilCompleted().toList()
                }
                while (!client.hasNativeListener) delay(5)
                client.startScripted("t", script(messageStep("hello", 3)))
                val failure = withTimeout(WAIT_MS) { thrower.await() }
                assertEquals("collector bug", failure.exceptionOrNull()?.message)
                val seen = withTimeout(WAIT_MS) { steady.await() }
                assertEquals("hello", seen.mapNotNull { textOf(it) }.joinToString(""))
                assertTrue(seen.any { it is ServerNotification.TurnStarted })
            }
        }
    }

    @Test
    fun `cancelling the collecting coroutine releases the native listener and loses nothing`() = runBlocking {
        AppServer.open(tempStateDir()).use { server ->
            server.client().use { client ->
                val job = launch(Dispatchers.IO) { client.notifications().collect { } }
                while (!client.hasNativeListener) delay(5)
                job.cancelAndJoin()
                assertFalse(client.hasNativeListener)
                // With no listener, notifications wait in the native client for the next reader.
                val turn = client.startScripted("after", script(messageStep("kept")))
                val polled = mutableListOf<ServerNotification>()
                while (polled.none { completedTurn(it)?.id == turn }) {
                    polled += client.nextNotification(WAIT_MS) ?: error("no notification")
                }
                assertTrue(polled.any { it is ServerNotification.TurnStarted })
                assertEquals("kept", polled.mapNotNull { textOf(it) }.joinToString(""))
                // The next collector starts a fresh listener.
                val next = client.startScripted("again", script(messageStep("fresh")))
                val seen = client.collectUntil { completedTurn(it)?.id == next }
                assertEquals("fresh", seen.mapNotNull { textOf(it) }.joinToString(""))
                assertFalse(client.hasNativeListener)
            }
        }
    }

    @Test
    fun `closing the client completes its collectors after what was delivered`() = runBlocking {
        AppServer.open(tempStateDir()).use { server ->
            val client = server.client()
            // One collector only: a second one started after turn/start could subscribe after a
            // fast turn had already completed and wait for it forever.
            val seen = java.util.concurrent.ConcurrentLinkedQueue<ServerNotification>()
            val all = async(Dispatchers.IO, start = CoroutineStart.UNDISPATCHED) {
                client.notifications().onEach { seen.add(it) }.toList()
            }
            while (!client.hasNativeListener) delay(5)
            val turn = client.startScripted("c", script(messageStep("bye")))
            withTimeout(WAIT_MS) { while (seen.none { completedTurn(it)?.id == turn }) delay(5) }
            client.close()
            val collected = withTimeout(WAIT_MS) { all.await() }
            assertEquals(turn, collected.firstNotNullOf { completedTurn(it) }.id)
            // A collector that starts after the close completes at once.
            assertEquals(emptyList<ServerNotification>(), withTimeout(WAIT_MS) { client.notifications().toList() })
        }
    }

    @Test
    fun `an unknown notification is kept as sent`() {
        val raw = """{"jsonrpc":"2.0","method":"future/thing","params":{"x":1}}"""
        val decoded = decodeNotification(raw)
        assertTrue(decoded is ServerNotification.Unknown)
        assertEquals(1, (decoded as ServerNotification.Unknown).raw.getJSONObject("params").getInt("x"))
        // A known method this version cannot decode does not break the stream either.
        val odd = decodeNotification("""{"jsonrpc":"2.0","method":"turn/completed","params":{"surprise":true}}""")
        assertTrue(odd is ServerNotification.Unknown)
        assertNull(decodeNotification("not json"))
    }

    @Test
    fun `interrupt settles the turn and reports it interrupted`() = runBlocking {
        AppServer.open(tempStateDir()).use { server ->
            server.client().use { client ->
                val turn = client.startScripted("i", script(messageStep("working"), sleepStep(60_000)))
                client.collectUntil { it is ServerNotification.ItemCompleted }
                val started = System.nanoTime()
                val result = client.turnInterrupt("i", turn)
                assertTrue((System.nanoTime() - started) / 1_000_000 < 10_000)
                assertTrue(result.physicallySettled)
                assertEquals(TurnStatus.Interrupted, result.turn.status)
                val done = client.collectUntil { completedTurn(it)?.id == turn }
                assertEquals(TurnStatus.Interrupted, completedTurn(done.last())!!.status)
                // Interrupting a settled turn again answers with the same terminal state.
                val again = client.turnInterrupt("i", turn)
                assertEquals(TurnStatus.Interrupted, again.turn.status)
                assertTrue(again.physicallySettled)
            }
        }
    }

    @Test
    fun `cancelling a suspended request returns at once and the client goes on`() = runBlocking {
        AppServer.open(tempStateDir(), ServerOptions(settleDeadlineMs = 5_000)).use { server ->
            server.client().use { client ->
                val turn = client.startScripted("slow", script(messageStep("in"), """{"type":"ignoreCancel","ms":1500}"""))
                client.collectUntil { it is ServerNotification.ItemCompleted }
                val started = System.nanoTime()
                assertThrows<TimeoutCancellationException> {
                    runBlocking { withTimeout(100) { client.turnInterrupt("slow", turn) } }
                }
                val cancelledAfterMs = (System.nanoTime() - started) / 1_000_000
                assertTrue(cancelledAfterMs < 1_000, "cancellation took $cancelledAfterMs ms")
                // The request itself still completes (the turn does get interrupted), and the client works.
                val done = client.collectUntil { completedTurn(it)?.id == turn }
                assertEquals(TurnStatus.Interrupted, completedTurn(done.last())!!.status)
                val deadline = System.nanoTime() + WAIT_MS * 1_000_000
                while (client.pendingRequests > 0 && System.nanoTime() < deadline) delay(10)
                assertEquals(0L, client.pendingRequests)
                assertEquals("slow", JSONObject(client.request("thread/read", """{"threadId":"slow"}""")).getJSONObject("thread").getString("id"))
            }
        }
    }
}
