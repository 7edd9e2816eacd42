// JVM benchmark, one run, side by side (docs/bench/jvm.md): request round trips and notification
// drain rates through uniffi over JNA (raw connection, the uniffi Client) against a minimal direct
// JNI entry (ffi/src/jni.rs, feature `jni`), the Kotlin SDK on its JNI hot path and on JNA, and
// the Rust client timed in Rust.
// Rounds interleave the paths so machine noise hits all of them alike; medians are reported.
// Run: bash scripts/bench-jvm.sh
package com.chainlesschain.appserver.bench

import com.chainlesschain.appserver.AppServer
import com.chainlesschain.appserver.ClientOptions
import com.chainlesschain.appserver.ServerOptions
import com.chainlesschain.appserver.Durability
import com.chainlesschain.appserver.ffi.Durability as NativeDurability
import com.chainlesschain.appserver.ffi.MessageListener
import com.chainlesschain.appserver.ffi.NotificationListener
import com.chainlesschain.appserver.ffi.ServerOptions as NativeOptions
import com.chainlesschain.appserver.protocol.ServerNotification
import kotlinx.coroutines.flow.first
import kotlinx.coroutines.runBlocking
import org.json.JSONObject
import java.nio.file.Files
import java.util.concurrent.CountDownLatch
import java.util.concurrent.TimeUnit
import java.util.concurrent.atomic.AtomicInteger
import com.chainlesschain.appserver.ffi.AppServer as NativeServer
import com.chainlesschain.appserver.ffi.Client as NativeClient
import com.chainlesschain.appserver.ffi.ClientOptions as NativeClientOptions
import com.chainlesschain.appserver.ffi.Connection as NativeConnection

/** The JNI entry points of ffi/src/jni.rs. */
object JniBench {
    @JvmStatic external fun openServer(stateDir: String, outbound: Int): Long
    @JvmStatic external fun closeServer(handle: Long)
    @JvmStatic external fun connect(server: Long): Long
    @JvmStatic external fun closeConnection(handle: Long)
    @JvmStatic external fun send(handle: Long, line: String): Int
    @JvmStatic external fun recv(handle: Long, timeoutMs: Long): String?
    @JvmStatic external fun recvBatch(handle: Long, max: Int, timeoutMs: Long): Array<String>?
    @JvmStatic external fun rustClientRoundTrips(server: Long, n: Int): Long
    /** `messages shl 40 or nanoseconds`. */
    @JvmStatic external fun rustDrain(handle: Long): Long
}

/** A raw JSON-RPC line transport: uniffi's Connection or a JNI connection. */
interface Wire {
    fun send(line: String)
    fun recv(timeoutMs: Long): String?
}

class UniffiWire(val conn: NativeConnection) : Wire {
    override fun send(line: String) = conn.send(line)
    override fun recv(timeoutMs: Long): String? = try {
        conn.recv(timeoutMs)
    } catch (e: com.chainlesschain.appserver.ffi.RecvException) {
        null
    }
}

class JniWire(val handle: Long) : Wire {
    override fun send(line: String) {
        check(JniBench.send(handle, line) == 0) { "JNI send refused" }
    }
    override fun recv(timeoutMs: Long): String? = JniBench.recv(handle, timeoutMs)
}

const val INIT = """{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"minimumProtocolVersion":1,"client":{"name":"bench","version":"1"},"features":[]}}"""

fun Wire.handshake() {
    send(INIT)
    check(recv(10_000)?.contains("\"result\"") == true) { "initialize failed" }
}

private var nextId = 1L
fun listLine(): String = """{"jsonrpc":"2.0","id":${nextId++},"method":"thread/list","params":{"limit":1}}"""

fun script(n: Int) = JSONObject().put("steps", org.json.JSONArray().put(
    JSONObject().put("type", "message").put("text", "x".repeat(n)).put("chunks", n)))

private var threadSeq = 0

/** Queues a turn streaming [n] deltas on [wire] and waits (polling on [poller]) until it is done. */
fun prefill(wire: Wire, poller: Wire, n: Int): String {
    val thread = "drain${threadSeq++}"
    val start = JSONObject().put("jsonrpc", "2.0").put("id", nextId++).put("method", "thread/start")
        .put("params", JSONObject().put("threadId", thread).put("agentOptions", JSONObject().put("script", script(n))))
    wire.send(start.toString())
    wire.send("""{"jsonrpc":"2.0","id":${nextId++},"method":"turn/start","params":{"threadId":"$thread","input":[{"type":"text","text":"go"}]}}""")
    awaitIdle(poller, thread, n)
    return thread
}

fun awaitIdle(poller: Wire, thread: String, n: Int) {
    val deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(120)
    while (System.nanoTime() < deadline) {
        poller.send("""{"jsonrpc":"2.0","id":${nextId++},"method":"thread/list","params":{"limit":1000}}""")
        val answer = JSONObject(poller.recv(10_000) ?: error("poller got no answer"))
        val threads = answer.getJSONObject("result").getJSONArray("threads")
        for (i in 0 until threads.length()) {
            val t = threads.getJSONObject(i)
            if (t.getString("id") == thread && t.getString("status") == "idle" && t.getLong("revision") > n) return
        }
        Thread.sleep(20)
    }
    error("turn on $thread did not finish")
}

/** Receives on [wire] until turn/completed; returns (messages, nanoseconds). */
fun drainPerMessage(wire: Wire): Pair<Int, Long> {
    var count = 0
    val started = System.nanoTime()
    while (true) {
        val line = wire.recv(30_000) ?: error("drain timed out after $count")
        count++
        if (line.contains("\"turn/completed\"")) break
    }
    return count to System.nanoTime() - started
}

fun drainJniBatches(handle: Long): Pair<Int, Long> {
    var count = 0
    val started = System.nanoTime()
    while (true) {
        val batch = JniBench.recvBatch(handle, 256, 30_000) ?: error("no batch")
        check(batch.isNotEmpty()) { "drain timed out after $count" }
        count += batch.size
        if (batch.last().contains("\"turn/completed\"") || batch.any { it.contains("\"turn/completed\"") }) break
    }
    return count to System.nanoTime() - started
}

fun median(xs: List<Double>): Double = xs.sorted().let { if (it.size % 2 == 1) it[it.size / 2] else (it[it.size / 2 - 1] + it[it.size / 2]) / 2 }

fun main(args: Array<String>) {
    System.load(args[0])
    val rounds = args.getOrNull(1)?.toInt() ?: 5
    val rtN = args.getOrNull(2)?.toInt() ?: 2000
    val drainN = args.getOrNull(3)?.toInt() ?: 20000
    val outbound = drainN * 2 + 100
    val tmp = Files.createTempDirectory("cc-jvm-bench")
    // The rollouts of a run take hundreds of MB: never leave them behind.
    Runtime.getRuntime().addShutdownHook(Thread { tmp.toFile().deleteRecursively() })

    val uServer = NativeServer.open(NativeOptions(stateDir = tmp.resolve("uniffi").toString(), durability = NativeDurability.EPHEMERAL, outboundMessages = outbound))
    val jServer = JniBench.openServer(tmp.resolve("jni").toString(), outbound)
    val sdkServer = AppServer.open(tmp.resolve("sdk"), ServerOptions(durability = Durability.EPHEMERAL, outboundMessages = outbound))
    val clientOptions = NativeClientOptions(notificationCapacity = outbound)
    val sdkClient = sdkServer.client(options = ClientOptions(notificationCapacity = outbound))
    val sdkJna = sdkServer.client(options = ClientOptions(notificationCapacity = outbound, jniHotPath = false))
    check(sdkClient.requestBlocking("thread/list").isNotEmpty())

    val uWire = UniffiWire(uServer.connect()).also { it.handshake() }
    val uPoller = UniffiWire(uServer.connect()).also { it.handshake() }
    val uClient = NativeClient.connect(uServer, null, clientOptions)
    val jHandle = JniBench.connect(jServer)
    val jWire = JniWire(jHandle).also { it.handshake() }
    val jPoller = JniWire(JniBench.connect(jServer)).also { it.handshake() }

    val rt = linkedMapOf<String, MutableList<Double>>()
    val drain = linkedMapOf<String, MutableList<Double>>()
    fun record(map: MutableMap<String, MutableList<Double>>, name: String, v: Double) = map.getOrPut(name) { mutableListOf() }.add(v)
    fun perOpMicros(n: Int, body: () -> Unit): Double {
        val started = System.nanoTime()
        repeat(n) { body() }
        return (System.nanoTime() - started) / 1000.0 / n
    }

    for (round in 0..rounds) {
        val warm = round == 0 // the first round warms the JIT and is not recorded
        fun rtRecord(name: String, v: Double) { if (!warm) record(rt, name, v) }
        fun drainRecord(name: String, p: Pair<Int, Long>) { if (!warm) record(drain, name, p.first / (p.second / 1e9)) }

        rtRecord("Rust Client.request (in-process, timed in Rust)", JniBench.rustClientRoundTrips(jServer, rtN) / 1000.0 / rtN)
        rtRecord("JNI send + recv (raw connection)", perOpMicros(rtN) { jWire.send(listLine()); jWire.recv(10_000)!! })
        rtRecord("uniffi/JNA Connection.send + recv (raw connection)", perOpMicros(rtN) { uWire.send(listLine()); uWire.recv(10_000)!! })
        rtRecord("uniffi/JNA Client.requestBlocking", perOpMicros(rtN) { uClient.requestBlocking("thread/list", """{"limit":1}""") })
        rtRecord("Kotlin SDK suspend request, JNI hot path", perOpMicros(rtN) { runBlocking { sdkClient.request("thread/list", """{"limit":1}""") } })
        rtRecord("Kotlin SDK requestBlocking, JNI hot path", perOpMicros(rtN) { sdkClient.requestBlocking("thread/list", """{"limit":1}""") })
        rtRecord("Kotlin SDK suspend request, JNA (jniHotPath=false)", perOpMicros(rtN) { runBlocking { sdkJna.request("thread/list", """{"limit":1}""") } })

        // Drains: each path gets a queue of drainN deltas (plus a few other messages) pre-filled.
        prefill(jWire, jPoller, drainN)
        val packed = JniBench.rustDrain(jHandle)
        drainRecord("Rust Connection.recv per message (timed in Rust)", (packed ushr 40).toInt() to (packed and ((1L shl 40) - 1)))
        prefill(jWire, jPoller, drainN); drainRecord("JNI recv per message", drainPerMessage(jWire))
        prefill(jWire, jPoller, drainN); drainRecord("JNI recvBatch(256)", drainJniBatches(jHandle))
        prefill(uWire, uPoller, drainN); drainRecord("uniffi/JNA Connection.recv per message", drainPerMessage(uWire))

        prefill(uWire, uPoller, drainN)
        run {
            val count = AtomicInteger()
            val done = CountDownLatch(1)
            val started = System.nanoTime()
            val handle = uWire.conn.listen(object : MessageListener {
                override fun onMessages(messages: List<String>) {
                    count.addAndGet(messages.size)
                    if (messages.any { it.contains("\"turn/completed\"") }) done.countDown()
                }
                override fun onClosed() {}
            })
            check(done.await(60, TimeUnit.SECONDS))
            val elapsed = System.nanoTime() - started
            handle.cancel(); handle.destroy()
            drainRecord("uniffi/JNA Connection.listen batches", count.get() to elapsed)
        }

        // The uniffi Client: its Rust pump moves messages into the client's notification queue;
        // the listener drains it in batches (the path the Kotlin SDK's Flow uses).
        run {
            val thread = "client${threadSeq++}"
            uClient.requestBlocking("thread/start", JSONObject().put("threadId", thread).put("agentOptions", JSONObject().put("script", script(drainN))).toString())
            uClient.requestBlocking("turn/start", """{"threadId":"$thread","input":[{"type":"text","text":"go"}]}""")
            awaitIdle(uPoller, thread, drainN)
            val count = AtomicInteger()
            val done = CountDownLatch(1)
            val started = System.nanoTime()
            val handle = uClient.listen(object : NotificationListener {
                override fun onNotifications(messages: List<String>) {
                    count.addAndGet(messages.size)
                    if (messages.any { it.contains("\"turn/completed\"") }) done.countDown()
                }
                override fun onClosed() {}
            })
            check(done.await(60, TimeUnit.SECONDS))
            val elapsed = System.nanoTime() - started
            handle.cancel(); handle.destroy()
            drainRecord("uniffi/JNA Client.listen batches", count.get() to elapsed)
        }

        // The Kotlin SDK: Flow<ServerNotification>, decoded into the generated types, both paths.
        for ((label, c) in listOf("JNI hot path" to sdkClient, "JNA (jniHotPath=false)" to sdkJna)) {
            val thread = "sdk${threadSeq++}"
            val (count, elapsed) = runBlocking {
                c.threadStart(threadId = thread, agentOptions = com.chainlesschain.appserver.protocol.AgentOptions(script = script(drainN)))
                c.turnStart(thread, "go")
                while (c.threadList(limit = 1000).threads.single { it.id == thread }.let { it.status.wire != "idle" || it.revision <= drainN }) Thread.sleep(20)
                var count = 0
                val started = System.nanoTime()
                c.notifications().first { count++; it is ServerNotification.TurnCompleted }
                count to System.nanoTime() - started
            }
            drainRecord("Kotlin SDK Flow<ServerNotification>, $label", count to elapsed)
        }
        System.err.println("round $round done")
    }

    println("round trip (thread/list, median of $rounds rounds x $rtN requests), µs per request:")
    for ((name, xs) in rt) println(String.format("  %-56s %8.1f   (rounds: %s)", name, median(xs), xs.joinToString(" ") { String.format("%.1f", it) }))
    println("notification drain (median of $rounds rounds, ~$drainN queued each), messages/s:")
    for ((name, xs) in drain) println(String.format("  %-56s %10.0f   (rounds: %s)", name, median(xs), xs.joinToString(" ") { String.format("%.0f", it) }))
    val jniRt = median(rt.getValue("JNI send + recv (raw connection)"))
    val jnaRt = median(rt.getValue("uniffi/JNA Connection.send + recv (raw connection)"))
    val jniBatch = median(drain.getValue("JNI recvBatch(256)"))
    val jnaBatch = median(drain.getValue("uniffi/JNA Client.listen batches"))
    val jniPer = median(drain.getValue("JNI recv per message"))
    val jnaPer = median(drain.getValue("uniffi/JNA Connection.recv per message"))
    println(String.format("ratios JNI over uniffi/JNA: round trip %.2fx, batched drain %.2fx, per-message drain %.2fx", jnaRt / jniRt, jniBatch / jnaBatch, jniPer / jnaPer))

    sdkClient.close(); sdkJna.close(); sdkServer.close()
    uClient.disconnect(); uServer.shutdown()
    JniBench.closeConnection(jHandle); JniBench.closeServer(jServer)
}
