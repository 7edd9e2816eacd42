// Lifecycle, typed requests and their typed failures, close → reopen → resume, concurrency from
// 50 threads, and the overload bound surfacing as AppServerException.Overloaded.
package com.chainlesschain.appserver

import com.chainlesschain.appserver.protocol.ServerNotification
import com.chainlesschain.appserver.protocol.ThreadStatus
import com.chainlesschain.appserver.protocol.TurnStatus
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.async
import kotlinx.coroutines.awaitAll
import kotlinx.coroutines.runBlocking
import org.json.JSONObject
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertNotNull
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.assertThrows
import java.util.concurrent.CountDownLatch
import java.util.concurrent.atomic.AtomicInteger

class LifecycleTest {
    @Test
    fun `open, handshake, typed requests, close`() = runBlocking {
        val dir = tempStateDir()
        val server = AppServer.open(dir, ServerOptions(durability = Durability.BUFFERED))
        val client = server.client()
        assertEquals(1L, client.initializeResult.protocolVersion)
        assertTrue(client.initializeResult.schemaDigest.startsWith("sha256:"))

        val started = client.threadStart(title = "hello", threadId = "life")
        assertEquals("life", started.thread.id)
        assertEquals("hello", started.thread.title)
        assertEquals(ThreadStatus.Idle, started.thread.status)
        assertEquals(listOf("life"), client.threadList().threads.map { it.id })
        val raw = JSONObject(client.request("thread/read", """{"threadId":"life"}"""))
        assertEquals("life", raw.getJSONObject("thread").getString("id"))
        assertEquals(0L, client.pendingRequests)
        // Where a fork came from sits beside the (published, closed) thread; archiving is a status.
        val forked = client.threadFork("life", newThreadId = "life-fork")
        assertEquals("life", forked.forkedFrom.threadId)
        assertEquals("life", forked.thread.parentThreadId)
        assertEquals(forked.forkedFrom, client.threadRead("life-fork").forkedFrom)
        assertNull(client.threadRead("life").forkedFrom)
        assertEquals(ThreadStatus.Archived, client.threadArchive("life-fork").thread.status)
        assertEquals(listOf("life"), client.threadList().threads.map { it.id })

        client.close()
        assertTrue(client.isClosed)
        assertThrows<AppServerException.Closed> { runBlocking { client.threadList() } }
        client.close() // idempotent
        server.close()
        assertTrue(server.isClosed)
        server.close() // idempotent
    }

    @Test
    fun `thread compact with a caller summary, and the options this engine adds`() = runBlocking {
        val options = ServerOptions(durability = Durability.BUFFERED, outboundStallMs = 500L, rolloutKey = ByteArray(32) { it.toByte() })
        AppServer.open(tempStateDir(), options).use { server ->
            server.client().use { client ->
                client.startScripted("long", script(messageStep("a long answer", 3)))
                client.collectUntil { completedTurn(it) != null }
                val before = client.threadResume("long", limit = 1).thread.revision
                val done = client.threadCompact("long", summary = "the user said go")
                assertEquals("the user said go", done.summary)
                assertEquals(before, done.toSeq)
                val again = assertThrows<ProtocolException> { runBlocking { client.threadCompact("long", "again") } }
                assertEquals(-32602, again.code)
            }
        }
        val badKey = assertThrows<AppServerException> { AppServer.open(tempStateDir(), ServerOptions(rolloutKey = ByteArray(31))) }
        assertTrue(badKey.message!!.contains("32 bytes"), badKey.message)
    }

    @Test
    fun `protocol errors carry their code and data`() = runBlocking {
        AppServer.open(tempStateDir()).use { server ->
            server.client().use { client ->
                val missing = assertThrows<ProtocolException> { runBlocking { client.threadRead("missing") } }
                assertEquals(-32004, missing.code)
                val invalid = assertThrows<ProtocolException> { runBlocking { client.threadStart(threadId = "../etc") } }
                assertEquals(-32602, invalid.code)
                assertEquals("/params/threadId", JSONObject(invalid.dataJson).getString("pointer"))
                val badJson = assertThrows<AppServerException.InvalidJson> { runBlocking { client.request("thread/list", "{nope") } }
                assertEquals(-32700, badJson.code)
                val unknown = assertThrows<ProtocolException> { runBlocking { client.request("no/such", "{}") } }
                assertEquals(-32601, unknown.code)
                val negative = assertThrows<AppServerException.InvalidArgument> { client.nextNotification(-1) }
                assertEquals(-32602, negative.code)
            }
        }
    }

    @Test
    fun `open refuses bad options and a directory another server holds`() {
        assertThrows<AppServerException.InvalidArgument> { AppServer.open("") }
        assertThrows<AppServerException.InvalidArgument> { AppServer.open(tempStateDir(), ServerOptions(inboundMessages = 0)) }
        assertThrows<AppServerException.InvalidArgument> { AppServer.open(tempStateDir(), ServerOptions(scriptJson = "{nope")) }
        val dir = tempStateDir()
        AppServer.open(dir).use {
            assertThrows<AppServerException.Store> { AppServer.open(dir) }
            assertThrows<AppServerException.InvalidArgument> { it.client(options = ClientOptions(collectorBuffer = 0)) }
            assertThrows<AppServerException.InvalidArgument> { it.client(options = ClientOptions(requestTimeoutMs = -1)) }
            assertThrows<AppServerException.InvalidArgument> { it.client(options = ClientOptions(approvalTimeoutMs = -1)) }
            assertThrows<AppServerException.InvalidArgument> { it.client(options = ClientOptions(maxPending = 0)) }
            // The edges themselves are accepted.
            it.client(options = ClientOptions(collectorBuffer = 1, maxPending = 1, approvalTimeoutMs = Long.MAX_VALUE)).close()
        }
    }

    @Test
    fun `close, reopen, resume`() = runBlocking {
        val dir = tempStateDir()
        val firstTurn: String
        AppServer.open(dir).use { server ->
            server.client().use { client ->
                firstTurn = client.startScripted("durable", script(messageStep("first answer", 2)))
                val done = client.collectUntil { completedTurn(it)?.id == firstTurn }
                assertEquals(TurnStatus.Completed, completedTurn(done.last())!!.status)
            }
        }
        AppServer.open(dir).use { server ->
            server.client().use { client ->
                val resumed = client.threadResume("durable")
                assertNull(resumed.activeTurn)
                assertEquals("durable", resumed.thread.id)
                val kinds = resumed.events.map { JSONObject(it.toJson().toString()).getJSONObject("payload").getString("type") }
                assertTrue("turnCompleted" in kinds, kinds.toString())
                assertTrue(resumed.thread.revision >= resumed.events.size.toLong())
                assertEquals(ThreadStatus.Idle, resumed.thread.status)
                assertNull(resumed.forkedFrom)
                // The thread goes on where it stopped.
                val second = client.turnStart("durable", "again").turn.id
                val done = client.collectUntil { completedTurn(it)?.id == second }
                assertEquals(TurnStatus.Completed, completedTurn(done.last())!!.status)
                assertTrue(server.store().verify("durable").ok)
            }
        }
    }

    @Test
    fun `fifty threads share one client`() {
        AppServer.open(tempStateDir(), ServerOptions(durability = Durability.BUFFERED)).use { server ->
            server.client().use { client ->
                val failures = AtomicInteger()
                val ready = CountDownLatch(1)
                val threads = (0 until 50).map { n ->
                    Thread {
                        ready.await()
                        try {
                            runBlocking { client.threadStart(threadId = "t$n", title = "thread $n") }
                            repeat(4) {
                                val listed = JSONObject(client.requestBlocking("thread/read", """{"threadId":"t$n"}"""))
                                check(listed.getJSONObject("thread").getString("title") == "thread $n")
                            }
                        } catch (e: Exception) {
                            e.printStackTrace()
                            failures.incrementAndGet()
                        }
                    }.also { it.start() }
                }
                ready.countDown()
                threads.forEach { it.join(WAIT_MS) }
                assertEquals(0, failures.get())
                val all = runBlocking { client.threadList(limit = 100) }.threads.map { it.id }.toSet()
                assertEquals((0 until 50).map { "t$it" }.toSet(), all)
                assertEquals(0L, client.pendingRequests)
                val stats = server.stats()
                assertEquals(50L, stats.storeIndexedThreads, "the index holds every thread on disk")
                assertTrue(stats.tailCacheBytes > 0, "recent events are served from the tail cache")
            }
        }
    }

    @Test
    fun `fifty coroutines on a thread pool`() = runBlocking {
        AppServer.open(tempStateDir(), ServerOptions(durability = Durability.BUFFERED)).use { server ->
            server.client().use { client ->
                val ids = (0 until 50).map { n -> async(Dispatchers.IO) { client.threadStart(threadId = "c$n").thread.id } }.awaitAll()
                assertEquals((0 until 50).map { "c$it" }, ids)
            }
        }
    }

    @Test
    fun `too many requests in flight is Overloaded with a retry hint`() = runBlocking {
        val options = ServerOptions(settleDeadlineMs = 5_000)
        AppServer.open(tempStateDir(), options).use { server ->
            server.client(options = ClientOptions(maxPending = 1)).use { client ->
                // A kernel that ignores the interrupt for a while keeps turn/interrupt pending.
                val turn = client.startScripted("busy", script(messageStep("in"), """{"type":"ignoreCancel","ms":1500}"""))
                client.collectUntil { it is ServerNotification.ItemCompleted }
                val interrupt = async(Dispatchers.IO) { client.turnInterrupt("busy", turn) }
                val deadline = System.nanoTime() + WAIT_MS * 1_000_000
                while (client.pendingRequests < 1 && System.nanoTime() < deadline) Thread.sleep(5)
                val overloaded = assertThrows<AppServerException.Overloaded> { runBlocking { client.threadList() } }
                assertEquals(-32001, overloaded.code)
                assertTrue(overloaded.retryAfterMs >= 1)
                val settled = interrupt.await()
                assertTrue(settled.physicallySettled)
                assertEquals(TurnStatus.Interrupted, settled.turn.status)
                // The bound frees up once the answer is in.
                assertNotNull(client.threadList())
            }
        }
    }

    @Test
    fun `the compact profile admits eight clients and refuses the ninth as Overloaded`() {
        val options = ServerOptions.builder().profile(ServerProfile.COMPACT).durability(Durability.BUFFERED).build()
        assertEquals(ServerProfile.COMPACT, options.toBuilder().build().profile)
        AppServer.open(tempStateDir(), options).use { server ->
            val clients = (0 until 8).map { server.client() }
            try {
                val refused = assertThrows<AppServerException.Overloaded> { server.client() }
                assertEquals(-32001, refused.code)
                assertTrue(refused.retryAfterMs >= 1)
                clients[0].close()
                server.client().use { again -> assertNotNull(runBlocking { again.threadList() }) }
            } finally {
                clients.forEach { it.close() }
            }
        }
    }

    @Test
    fun `a server shutdown closes its clients and their flows`() = runBlocking {
        val server = AppServer.open(tempStateDir())
        val client = server.client()
        val collected = async(Dispatchers.IO) { client.notifications().collect { } }
        server.close()
        kotlinx.coroutines.withTimeout(WAIT_MS) { collected.await() }
        assertTrue(client.isClosed)
        assertFalse(client.hasNativeListener)
        assertThrows<AppServerException.Closed> { client.nextNotification(10) }
        client.close()
    }
}
