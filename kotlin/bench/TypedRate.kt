// Typed notification rate for one long text turn (issue 25 item 10, docs/bench/jvm.md): the same
// scripted turn (one agent message streamed as N deltas) drained three ways, interleaved per round:
//  - raw: the uniffi glue's own listener (batched raw JSON text, no decoding),
//  - typed: the SDK's `client.notifications()` Flow (JNI pump + generated decoders),
//  - turn: the SDK's per-turn handle (`client.turn(...).events`, typed and filtered).
// Rate = notifications of the turn / time from `turn/start` to its `turn/completed`.
// Usage: TypedRateKt [rounds] [deltas]
package com.chainlesschain.appserver.bench

import com.chainlesschain.appserver.AppServer
import com.chainlesschain.appserver.Durability
import com.chainlesschain.appserver.protocol.ServerNotification
import kotlinx.coroutines.flow.takeWhile
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import java.nio.file.Files
import java.util.concurrent.CountDownLatch
import java.util.concurrent.atomic.AtomicInteger
import com.chainlesschain.appserver.ffi.AppServer as NativeServer
import com.chainlesschain.appserver.ffi.ApprovalDecision
import com.chainlesschain.appserver.ffi.ApprovalHandler
import com.chainlesschain.appserver.ffi.ApprovalRequest
import com.chainlesschain.appserver.ffi.Client as NativeClient
import com.chainlesschain.appserver.ffi.ClientOptions as NativeClientOptions
import com.chainlesschain.appserver.ffi.Durability as NativeDurability
import com.chainlesschain.appserver.ffi.NotificationListener
import com.chainlesschain.appserver.ffi.ServerOptions as NativeOptions

private fun longTurnOptions(deltas: Int) =
    """{"script":{"steps":[{"type":"message","text":"${"x".repeat(deltas)}","chunks":$deltas}]}}"""

private object Decline : ApprovalHandler {
    override fun decide(request: ApprovalRequest) = ApprovalDecision.Decline("bench")
}

private fun raw(server: NativeServer, deltas: Int, round: Int): Double {
    val client = NativeClient.connect(server, Decline, NativeClientOptions(null, null, null, 65_536))
    try {
        val tid = "raw$round"
        client.requestBlocking("thread/start", """{"threadId":"$tid","agentOptions":${longTurnOptions(deltas)}}""")
        val count = AtomicInteger()
        val done = CountDownLatch(1)
        val task = client.listen(object : NotificationListener {
            override fun onNotifications(messages: List<String>) {
                for (m in messages) {
                    count.incrementAndGet()
                    if (m.contains("\"turn/completed\"")) done.countDown()
                }
            }
            override fun onClosed() = done.countDown()
        })
        val t0 = System.nanoTime()
        client.requestBlocking("turn/start", """{"threadId":"$tid","input":[{"type":"text","text":"go"}]}""")
        done.await()
        val s = (System.nanoTime() - t0) / 1e9
        task.cancel()
        task.destroy()
        return count.get() / s
    } finally {
        client.disconnect()
        client.destroy()
    }
}

private fun typed(server: AppServer, deltas: Int, round: Int, perTurn: Boolean): Double = runBlocking {
    server.client().use { client ->
        val tid = (if (perTurn) "turn" else "typed") + round
        client.request("thread/start", """{"threadId":"$tid","agentOptions":${longTurnOptions(deltas)}}""")
        var count = 0
        val t0 = System.nanoTime()
        if (perTurn) {
            client.turn(tid, "go").events.collect { count++ }
        } else {
            val flow = client.notifications()
            kotlinx.coroutines.coroutineScope {
                // Undispatched: the collector subscribes before turn/start is sent.
                val job = launch(start = kotlinx.coroutines.CoroutineStart.UNDISPATCHED) {
                    flow.takeWhile { n -> count++; n !is ServerNotification.TurnCompleted }.collect { }
                }
                client.turnStart(tid, "go")
                job.join()
            }
        }
        count / ((System.nanoTime() - t0) / 1e9)
    }
}

fun main(args: Array<String>) {
    val rounds = args.getOrNull(0)?.toInt() ?: 5
    val deltas = args.getOrNull(1)?.toInt() ?: 20_000
    val tmp = Files.createTempDirectory("cc-typed-rate")
    // The SDK first: it decides which library file both JNA and JNI map (NativeLib), so the glue's
    // own server below uses that same file and the SDK's JNI hot path stays on.
    val sdk = AppServer.open(tmp.resolve("sdk")) { durability = Durability.EPHEMERAL; outboundMessages = 65_536 }
    val native = NativeServer.open(NativeOptions(stateDir = tmp.resolve("raw").toString(), durability = NativeDurability.EPHEMERAL, outboundMessages = 65_536), null, null)
    val r = mutableListOf<Double>(); val t = mutableListOf<Double>(); val h = mutableListOf<Double>()
    try {
        for (i in 0 until rounds) {
            r += raw(native, deltas, i)
            t += typed(sdk, deltas, i, perTurn = false)
            h += typed(sdk, deltas, i, perTurn = true)
            if (i == 0) sdk.client().use { check(it.usesJni) { "the SDK is off its JNI hot path" } }
            println("round $i: raw %.0f/s, typed %.0f/s, turn %.0f/s".format(r.last(), t.last(), h.last()))
        }
    } finally {
        sdk.close()
        native.shutdown()
        native.destroy()
        tmp.toFile().deleteRecursively()
    }
    fun med(x: List<Double>) = x.sorted()[x.size / 2]
    println("one text turn of $deltas deltas, median of $rounds: raw text %.0f/s (uniffi listener, JNA), typed %.0f/s (SDK notifications()), per-turn %.0f/s (SDK turn().events)".format(med(r), med(t), med(h)))
}
