// A connected client: suspend functions for every wire v1 request, typed with the generated
// protocol types, and `notifications()` as a Flow fed by one native listener shared by every
// collector. The protocol state (pending map, timeouts, approval routing) stays in the one Rust
// client; this layer only adapts it to coroutines.
package com.chainlesschain.appserver

import com.chainlesschain.appserver.ffi.NotificationListener
import com.chainlesschain.appserver.ffi.TaskHandle
import com.chainlesschain.appserver.protocol.AgentOptions
import com.chainlesschain.appserver.protocol.GraphDefinition
import com.chainlesschain.appserver.protocol.GraphRunCancelParams
import com.chainlesschain.appserver.protocol.GraphRunCancelResult
import com.chainlesschain.appserver.protocol.GraphRunGrant
import com.chainlesschain.appserver.protocol.GraphRunOptions
import com.chainlesschain.appserver.protocol.GraphRunReadParams
import com.chainlesschain.appserver.protocol.GraphRunReadResult
import com.chainlesschain.appserver.protocol.GraphRunStartParams
import com.chainlesschain.appserver.protocol.GraphRunStartResult
import com.chainlesschain.appserver.protocol.GraphValidateParams
import com.chainlesschain.appserver.protocol.GraphValidateResult
import com.chainlesschain.appserver.protocol.JsonValue
import com.chainlesschain.appserver.protocol.InitializeResult
import com.chainlesschain.appserver.protocol.JsonField
import com.chainlesschain.appserver.protocol.ProtocolDecodeException
import com.chainlesschain.appserver.protocol.ProtocolJson
import com.chainlesschain.appserver.protocol.ServerNotification
import com.chainlesschain.appserver.protocol.TextInput
import com.chainlesschain.appserver.protocol.ThreadArchiveParams
import com.chainlesschain.appserver.protocol.ThreadArchiveResult
import com.chainlesschain.appserver.protocol.ThreadCompactParams
import com.chainlesschain.appserver.protocol.ThreadCompactResult
import com.chainlesschain.appserver.protocol.ThreadForkParams
import com.chainlesschain.appserver.protocol.ThreadForkResult
import com.chainlesschain.appserver.protocol.ThreadListParams
import com.chainlesschain.appserver.protocol.ThreadListResult
import com.chainlesschain.appserver.protocol.ThreadReadParams
import com.chainlesschain.appserver.protocol.ThreadReadResult
import com.chainlesschain.appserver.protocol.ThreadResumeParams
import com.chainlesschain.appserver.protocol.ThreadResumeResult
import com.chainlesschain.appserver.protocol.ThreadStartParams
import com.chainlesschain.appserver.protocol.ThreadStartResult
import com.chainlesschain.appserver.protocol.TurnInterruptParams
import com.chainlesschain.appserver.protocol.TurnInterruptResult
import com.chainlesschain.appserver.protocol.TurnStartParams
import com.chainlesschain.appserver.protocol.TurnStartResult
import com.chainlesschain.appserver.protocol.UserInput
import kotlinx.coroutines.channels.SendChannel
import kotlinx.coroutines.completeWith
import kotlinx.coroutines.channels.awaitClose
import kotlinx.coroutines.channels.trySendBlocking
import kotlinx.coroutines.flow.Flow
import kotlinx.coroutines.flow.buffer
import kotlinx.coroutines.flow.callbackFlow
import org.json.JSONObject
import java.util.logging.Level
import java.util.logging.Logger
import com.chainlesschain.appserver.ffi.Client as NativeClient

private val clientLog: Logger = Logger.getLogger("com.chainlesschain.appserver.client")

/** A connected, initialized client. Thread-safe: share one per server, or open several. */
class Client internal constructor(
    internal val native: NativeClient,
    private val options: ClientOptions,
    useJni: Boolean = true,
) : AutoCloseable {
    private val hub = NotificationHub()
    @Volatile private var closed = false

    /** The JNI hot path for requests and notifications, when the library has it (see JniTransport). */
    private val jni: JniClientHandle? = if (useJni && JniTransport.available) JniClientHandle(native) else null

    /**
     * True when requests and notifications take the JNI hot path rather than JNA (a blocking
     * request measured 16 µs against 57 µs, docs/kotlin.md; receives differ more). Off only when asked for (`ClientOptions(jniHotPath = false)`,
     * `-Dcc.appserver.jni=false`) or when the hot path could not load, which is logged as a
     * WARNING on `com.chainlesschain.appserver.jni` with the reason.
     */
    val usesJni: Boolean get() = jni != null

    /** The server's `initialize` answer: versions, features, identity, schema digest. */
    val initializeResult: InitializeResult =
        decoding("initialize result") { InitializeResult.fromJson(ProtocolJson.parse(native.initializeResult())) }

    /**
     * The escape hatch: sends [method] with [paramsJson] (a JSON object, empty for `{}`) and
     * returns the result as JSON text. Suspends without blocking a thread. Cancelling the calling
     * coroutine returns at once; the request itself still completes (within the request timeout)
     * and its result is dropped — stop work with [turnInterrupt], not by cancelling.
     */
    suspend fun request(method: String, paramsJson: String = "{}"): String {
        val hot = jni ?: return native { native.request(method, paramsJson) }
        // The blocking JNI call runs on a pool thread; awaiting it is what the caller's coroutine
        // does, so cancelling the caller returns at once while the request completes (within the
        // request timeout) and its answer is dropped — the same contract as the JNA path.
        val answer = kotlinx.coroutines.CompletableDeferred<String>()
        requestPool.execute {
            answer.completeWith(runCatching { JniTransport.answer(hot.use { JniTransport.request(it, method, paramsJson) }) })
        }
        return answer.await()
    }

    /** [request] for a blocking caller (Java facade, plain threads). */
    fun requestBlocking(method: String, paramsJson: String = "{}"): String {
        val hot = jni ?: return native { native.requestBlocking(method, paramsJson) }
        return JniTransport.answer(hot.use { JniTransport.request(it, method, paramsJson) })
    }

    private suspend fun call(method: String, params: JSONObject): Any =
        decoding("$method result") { ProtocolJson.parse(request(method, params.toString())) }

    suspend fun threadStart(
        title: String? = null,
        threadId: String? = null,
        metadata: Map<String, Any>? = null,
        agentOptions: AgentOptions? = null,
        idempotencyKey: String? = null,
        traceparent: String? = null,
    ): ThreadStartResult = threadStart(ThreadStartParams(threadId, title, metadata, agentOptions, idempotencyKey, traceparent))

    suspend fun threadStart(params: ThreadStartParams): ThreadStartResult =
        call("thread/start", params.toJson()).let { decoding("thread/start result") { ThreadStartResult.fromJson(it) } }

    suspend fun threadRead(threadId: String, afterEventSeq: Long? = null, limit: Long? = null): ThreadReadResult =
        call("thread/read", ThreadReadParams(threadId, afterEventSeq, limit).toJson())
            .let { decoding("thread/read result") { ThreadReadResult.fromJson(it) } }

    suspend fun threadResume(threadId: String, afterEventSeq: Long? = null, limit: Long? = null): ThreadResumeResult =
        call("thread/resume", ThreadResumeParams(threadId, afterEventSeq, limit).toJson())
            .let { decoding("thread/resume result") { ThreadResumeResult.fromJson(it) } }

    suspend fun threadFork(
        threadId: String,
        newThreadId: String? = null,
        atEventSeq: Long? = null,
        title: String? = null,
        idempotencyKey: String? = null,
    ): ThreadForkResult =
        call("thread/fork", ThreadForkParams(threadId, newThreadId, atEventSeq, title, idempotencyKey).toJson())
            .let { decoding("thread/fork result") { ThreadForkResult.fromJson(it) } }

    suspend fun threadList(includeArchived: Boolean? = null, cursor: String? = null, limit: Long? = null): ThreadListResult {
        val params = ThreadListParams(includeArchived, if (cursor == null) JsonField.Absent else JsonField.Value(cursor), limit)
        return call("thread/list", params.toJson()).let { decoding("thread/list result") { ThreadListResult.fromJson(it) } }
    }

    suspend fun threadArchive(threadId: String): ThreadArchiveResult =
        call("thread/archive", ThreadArchiveParams(threadId).toJson())
            .let { decoding("thread/archive result") { ThreadArchiveResult.fromJson(it) } }

    /**
     * Compacts the thread: later turns see [summary] instead of the history before it (every event
     * stays in the rollout). Without [summary] the server's kernel writes it (the OpenAI-compatible
     * one can; others fail with [ProtocolException] -32602).
     */
    suspend fun threadCompact(threadId: String, summary: String? = null): ThreadCompactResult =
        call("thread/compact", ThreadCompactParams(threadId, summary).toJson())
            .let { decoding("thread/compact result") { ThreadCompactResult.fromJson(it) } }

    /** Compiles a graph without running it; `errors` name each rule broken with a JSON pointer. */
    suspend fun graphValidate(definition: GraphDefinition, grant: GraphRunGrant? = null): GraphValidateResult =
        call("graph/validate", GraphValidateParams(definition, grant).toJson())
            .let { decoding("graph/validate result") { GraphValidateResult.fromJson(it) } }

    /**
     * [graphValidate] for a definition given as JSON text (decoded first: a malformed one names
     * where), checked against a grant of [capabilities] (nothing is granted unless listed, so a
     * run needs at least `agent` for agent nodes and `tool:<name>` or `tool:*` for tool nodes).
     */
    suspend fun graphValidate(definitionJson: String, capabilities: List<String> = emptyList()): GraphValidateResult =
        graphValidate(graphDefinition(definitionJson), GraphRunGrant(capabilities))

    /**
     * Compiles and starts a durable graph run; it reports through `graph/event` notifications
     * ([ServerNotification.GraphEvent], whose params are a `GraphEventParams.NodeUpdated` or
     * `GraphEventParams.RunUpdated`; docs/graph.md).
     */
    suspend fun graphRunStart(
        definition: GraphDefinition,
        runId: String? = null,
        inputs: Map<String, JsonValue>? = null,
        grant: GraphRunGrant? = null,
        options: GraphRunOptions? = null,
        idempotencyKey: String? = null,
    ): GraphRunStartResult =
        call("graph/run/start", GraphRunStartParams(definition, runId, inputs, grant, options, idempotencyKey).toJson())
            .let { decoding("graph/run/start result") { GraphRunStartResult.fromJson(it) } }

    /** [graphRunStart] for a definition given as JSON text, granting [capabilities] only. */
    suspend fun graphRunStart(
        definitionJson: String,
        runId: String? = null,
        capabilities: List<String> = emptyList(),
    ): GraphRunStartResult =
        graphRunStart(graphDefinition(definitionJson), runId, grant = GraphRunGrant(capabilities))

    /** A run's state; message values, effect results and outputs only with [includeContent]. */
    suspend fun graphRunRead(
        runId: String,
        includeContent: Boolean? = null,
        afterEventSeq: Long? = null,
        limit: Long? = null,
    ): GraphRunReadResult =
        call("graph/run/read", GraphRunReadParams(runId, includeContent, afterEventSeq, limit).toJson())
            .let { decoding("graph/run/read result") { GraphRunReadResult.fromJson(it) } }

    /** Cancels a run: every outstanding attempt is fenced, so a late result cannot cross it. */
    suspend fun graphRunCancel(runId: String, reason: String? = null): GraphRunCancelResult =
        call("graph/run/cancel", GraphRunCancelParams(runId, reason).toJson())
            .let { decoding("graph/run/cancel result") { GraphRunCancelResult.fromJson(it) } }

    private fun graphDefinition(json: String): GraphDefinition =
        try {
            GraphDefinition.fromJson(org.json.JSONObject(json))
        } catch (e: org.json.JSONException) {
            throw AppServerException.InvalidJson("graph definition: ${e.message}")
        } catch (e: ProtocolDecodeException) {
            throw AppServerException.InvalidJson("graph definition at ${e.pointer}: ${e.reason}")
        }

    /**
     * Starts a turn on [threadId] with [text]; returns at once (the turn runs asynchronously).
     * [traceparent]: a W3C trace context (`00-<trace id>-<span id>-<flags>`) every event of the turn
     * is recorded under, its first naming your span (else the turn starts a trace of its own).
     */
    suspend fun turnStart(
        threadId: String,
        text: String,
        idempotencyKey: String? = null,
        traceparent: String? = null,
    ): TurnStartResult =
        turnStart(TurnStartParams(threadId, listOf(UserInput.Text(TextInput(text))), idempotencyKey, traceparent))

    suspend fun turnStart(params: TurnStartParams): TurnStartResult =
        call("turn/start", params.toJson()).let { decoding("turn/start result") { TurnStartResult.fromJson(it) } }

    /**
     * Interrupts a turn and answers only when the kernel has physically stopped; otherwise fails
     * with [ProtocolException] code -32010 (never a false "cancelled"). Why the turn ended is the
     * result's `error`, beside the (published, closed) `turn`.
     */
    suspend fun turnInterrupt(threadId: String, turnId: String): TurnInterruptResult =
        call("turn/interrupt", TurnInterruptParams(threadId, turnId).toJson())
            .let { decoding("turn/interrupt result") { TurnInterruptResult.fromJson(it) } }

    /**
     * Every server notification, decoded with the generated types (receive mode: a `method` this
     * version does not know arrives as [ServerNotification.Unknown], as sent, and so does a known
     * one this version cannot decode — the stream never breaks on a newer server).
     *
     * Cold and shareable: each collector sees every notification from when it starts; all
     * collectors share one native listener, started by the first and released when the last one
     * stops (cancelled, finished, or threw). Notifications that arrive while nobody collects wait
     * in the native client for the next collector. A collector that throws ends only its own
     * collection. Each collector may fall [ClientOptions.collectorBuffer] notifications behind;
     * past that, delivery waits for it (nothing is dropped), and the native buffers behind it fill.
     * The flow completes when the client closes.
     */
    fun notifications(): Flow<ServerNotification> = callbackFlow {
        val subscriber = hub.subscribe(channel)
        awaitClose { hub.unsubscribe(subscriber) }
    }.buffer(maxOf(options.collectorBuffer, BACKLOG_MAX))

    /**
     * Polls one notification, waiting up to [timeoutMs]: `null` on timeout, [AppServerException.Closed]
     * once the client is closed and drained. Do not mix with [notifications]: each notification goes to
     * exactly one reader.
     */
    fun nextNotification(timeoutMs: Long): ServerNotification? {
        val hot = jni ?: return native { native.nextNotification(timeoutMs) }?.let { decodeNotification(it) }
        if (timeoutMs < 0) throw AppServerException.InvalidArgument("timeoutMs must not be negative (got $timeoutMs)")
        val batch = hot.use { JniTransport.nextNotifications(it, 1, timeoutMs) } ?: throw AppServerException.Closed()
        return batch.firstOrNull()?.let { decodeNotification(it) }
    }

    /** Requests now waiting for an answer. */
    val pendingRequests: Long get() = if (closed) 0 else native { native.pendingRequests() }

    /** True once closed: by [close], a server shutdown, or a connection the server dropped. */
    val isClosed: Boolean get() = closed || native { native.isClosed() }

    /** True while a native listener feeds [notifications] (for tests and diagnostics). */
    internal val hasNativeListener: Boolean get() = hub.hasListener()

    /**
     * Closes the client now: requests in flight end with [AppServerException.Closed], collectors
     * receive what was already delivered and complete. Idempotent. Frees the native client.
     */
    override fun close() {
        synchronized(this) {
            if (closed) return
            closed = true
        }
        native.disconnect()
        hub.clientClosed()
        jni?.release()
        native.destroy()
    }

    /** A running delivery into the hub: uniffi's listener thread, or the JNI pump. */
    private interface Delivery {
        fun cancel()
        fun isFinished(): Boolean
    }

    private class UniffiDelivery(private val handle: TaskHandle) : Delivery {
        override fun cancel() {
            handle.cancel()
            handle.destroy()
        }

        override fun isFinished(): Boolean = handle.isFinished()
    }

    /**
     * The JNI pump: waits (with no timeout, so an idle client costs no wake-up) for batches of up
     * to 256 notifications and hands them to the hub; [cancel] wakes it through the native stop
     * flag. A batch it has taken is always handed over, even
     * when it was told to stop meanwhile: the hub keeps it for the next collector.
     */
    private class JniPump(private val handle: JniClientHandle, private val hub: NotificationListener) :
        Thread("cc-jni-notifications"), Delivery {
        @Volatile private var stopping = false

        init {
            isDaemon = true
            // Armed here, before the thread starts: a cancel can only come after this.
            handle.use { JniTransport.stopNotifications(it, false) }
        }

        override fun run() {
            while (!stopping) {
                val batch = try {
                    handle.use { JniTransport.waitNotifications(it, PUMP_BATCH) }
                } catch (e: AppServerException.Closed) {
                    null
                }
                when {
                    batch == null -> {
                        hub.onClosed()
                        return
                    }
                    batch.isNotEmpty() -> hub.onNotifications(batch.asList())
                }
            }
        }

        override fun cancel() {
            stopping = true
            try {
                handle.use { JniTransport.stopNotifications(it, true) }
            } catch (e: AppServerException.Closed) {
                // Released: the client is closed, so the pump has already seen the end.
            }
            if (currentThread() !== this) join()
        }

        override fun isFinished(): Boolean = !isAlive
    }

    /** One native listener fanned out to every collector; see [notifications]. */
    private inner class NotificationHub : NotificationListener {
        /**
         * Two locks: [lifecycle] orders starting and stopping the delivery (held while a stop waits
         * for the delivery thread, so a new collector cannot start a second delivery that overtakes
         * the old one); [lock] guards the subscriber list and the backlog and is the only one the
         * delivery thread takes, so a stop waiting for that thread can never deadlock with it.
         */
        private val lifecycle = Any()
        private val lock = Any()
        private val subscribers = ArrayList<Sink>()
        @Volatile private var handle: Delivery? = null

        /** Delivered while nobody collected (the window while the last delivery stopped). */
        private val backlog = ArrayDeque<ServerNotification>()
        private var closed = false

        fun hasListener(): Boolean = handle?.isFinished() == false

        fun subscribe(channel: SendChannel<ServerNotification>): Sink = subscribe(ChannelSink(channel))

        fun subscribe(sink: Sink): Sink {
            synchronized(lifecycle) {
                synchronized(lock) {
                    // No delivery runs while the backlog is non-empty, so these go first, in order.
                    while (backlog.isNotEmpty()) {
                        if (!sink.offerNow(backlog.first())) break
                        backlog.removeFirst()
                    }
                    if (closed) {
                        sink.close()
                        return sink
                    }
                    subscribers.add(sink)
                }
                if (handle == null) {
                    handle = try {
                        val hot = jni
                        if (hot != null) JniPump(hot, this).also { it.start() } else UniffiDelivery(native.listen(this))
                    } catch (e: Exception) {
                        // The client closed (ClientException.Closed) or was freed: nothing more will come.
                        onClosed()
                        null
                    }
                }
            }
            return sink
        }

        fun unsubscribe(sink: Sink) {
            synchronized(lifecycle) {
                val stopping = synchronized(lock) {
                    subscribers.remove(sink)
                    sink.close()
                    if (subscribers.isNotEmpty()) return
                    handle.also { handle = null }
                }
                // Waits for the delivery thread (woken at once), at most one hand-over (into the backlog).
                stopping?.cancel()
            }
        }

        fun clientClosed() {
            // A running delivery sees the closed client, hands over what it holds and calls
            // onClosed; with none running, close the collectors here.
            synchronized(lifecycle) {
                if (handle == null) onClosed()
            }
        }

        override fun onNotifications(messages: List<String>) {
            val decoded = messages.mapNotNull { decodeNotification(it) }
            val targets = synchronized(lock) {
                if (subscribers.isEmpty()) {
                    backlog.addAll(decoded)
                    return
                }
                subscribers.toList()
            }
            var finished: MutableList<Sink>? = null
            for (n in decoded) {
                for (s in targets) {
                    // Blocks this (delivery) thread while a collector is [collectorBuffer] behind:
                    // backpressure, not loss. A collector that has stopped fails fast and is skipped.
                    if (!s.deliver(n)) (finished ?: mutableListOf<Sink>().also { finished = it }).add(s)
                }
            }
            // A per-turn sink that has seen its turn/completed leaves; unsubscribing may stop this
            // very delivery thread, so it runs on another one.
            finished?.let { done -> requestPool.execute { done.forEach { unsubscribe(it) } } }
        }

        override fun onClosed() {
            synchronized(lock) {
                closed = true
                for (s in subscribers) s.close()
                subscribers.clear()
            }
        }
    }

    /** Where the hub delivers: a [notifications] collector or one [turn]'s events. */
    internal interface Sink {
        /** Hands [n] over (may block: backpressure); false once this sink wants no more. */
        fun deliver(n: ServerNotification): Boolean

        /** Hands [n] over without blocking (the backlog); false when it does not fit now. */
        fun offerNow(n: ServerNotification): Boolean

        fun close()
    }

    private class ChannelSink(private val channel: SendChannel<ServerNotification>) : Sink {
        override fun deliver(n: ServerNotification): Boolean {
            channel.trySendBlocking(n)
            return true
        }

        override fun offerNow(n: ServerNotification): Boolean = channel.trySend(n).isSuccess

        override fun close() {
            channel.close()
        }
    }

    /**
     * Starts a turn and returns its events ([TurnHandle]): subscribes BEFORE it sends `turn/start`,
     * so nothing of the turn is missed, then keeps only notifications of [threadId] and the started
     * turn (thread-level ones without a turn id are skipped), ending after its `turn/completed`.
     * Approvals still go to the client's approval handler. The turn's events are buffered for the
     * handle (unbounded, one turn's worth: the engine bounds a turn's output) so an unread handle
     * never stalls other collectors; close the handle to drop them early.
     */
    suspend fun turn(
        threadId: String,
        text: String,
        idempotencyKey: String? = null,
        traceparent: String? = null,
    ): TurnHandle = turn(TurnStartParams(threadId, listOf(UserInput.Text(TextInput(text))), idempotencyKey, traceparent))

    /** [turn] with full `turn/start` params (several inputs, an idempotency key). */
    suspend fun turn(params: TurnStartParams): TurnHandle {
        val sink = TurnSink(params.threadId)
        hub.subscribe(sink)
        val started = try {
            turnStart(params)
        } catch (e: Throwable) {
            hub.unsubscribe(sink)
            throw e
        }
        sink.turnId = started.turn.id
        return TurnHandle(started.turn, sink.channel) { hub.unsubscribe(sink) }
    }

    /** One turn's events: every notification of its thread (the handle filters by turn id). */
    private class TurnSink(private val threadId: String) : Sink {
        val channel = kotlinx.coroutines.channels.Channel<ServerNotification>(kotlinx.coroutines.channels.Channel.UNLIMITED)
        @Volatile var turnId: String? = null

        override fun deliver(n: ServerNotification): Boolean {
            val (thread, turn) = notificationScope(n)
            if (thread != threadId || turn == null) return true
            channel.trySend(n)
            // Done once its own turn/completed is in; before turn/start answers, turnId is unknown.
            return !(n is ServerNotification.TurnCompleted && turn == turnId)
        }

        override fun offerNow(n: ServerNotification): Boolean {
            deliver(n)
            return true
        }

        override fun close() {
            channel.close()
        }
    }

    internal val collectorBuffer: Int get() = options.collectorBuffer
}

/** Decodes one notification message; never throws (an undecodable one is kept as Unknown). */
internal fun decodeNotification(text: String): ServerNotification? {
    val json = try {
        ProtocolJson.parse(text)
    } catch (e: ProtocolDecodeException) {
        clientLog.log(Level.WARNING, "dropping a notification that is not JSON", e)
        return null
    }
    return try {
        ServerNotification.fromJson(json)
    } catch (e: ProtocolDecodeException) {
        clientLog.log(Level.FINE, "notification kept as Unknown: ${e.message}")
        (json as? JSONObject)?.let { ServerNotification.Unknown(it) }
    }
}

/** Requests on the JNI path block a thread each; the Rust client bounds how many run at once. */
private val requestPool: java.util.concurrent.ExecutorService = java.util.concurrent.Executors.newCachedThreadPool { r ->
    Thread(r, "cc-jni-request").apply { isDaemon = true }
}

private const val PUMP_BATCH = 256

/** A collector's buffer is at least one native batch, so a backlog always fits ahead of live deliveries. */
private const val BACKLOG_MAX = 256
