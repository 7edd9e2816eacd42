// One turn's events (`Client.turn`): only the notifications of that thread and turn, ending after
// its `turn/completed`, with `text()` (the assistant's text; a failed turn raises KernelFailed, an
// interrupted one TurnInterrupted) and `completion()` (the `turn/completed` params). The Java form
// is `JavaTurnHandle`: blocking and CompletableFuture methods and an Iterator.
package com.chainlesschain.appserver

import com.chainlesschain.appserver.protocol.ItemContent
import com.chainlesschain.appserver.protocol.ServerNotification
import com.chainlesschain.appserver.protocol.TurnCompletedParams
import com.chainlesschain.appserver.protocol.TurnStatus
import kotlinx.coroutines.channels.ReceiveChannel
import kotlinx.coroutines.flow.Flow
import kotlinx.coroutines.flow.flow
import kotlinx.coroutines.runBlocking
import java.util.concurrent.CompletableFuture
import java.util.concurrent.atomic.AtomicBoolean
import com.chainlesschain.appserver.protocol.Turn as ProtocolTurn

/** The thread id and turn id a notification is about (either may be absent). */
internal fun notificationScope(n: ServerNotification): Pair<String?, String?> = when (n) {
    is ServerNotification.ThreadUpdated -> n.value.params.threadId to null
    is ServerNotification.TurnStarted -> n.value.params.threadId to n.value.params.turn.id
    is ServerNotification.TurnCompleted -> n.value.params.threadId to n.value.params.turn.id
    is ServerNotification.ItemStarted -> n.value.params.threadId to n.value.params.turnId
    is ServerNotification.ItemDelta -> n.value.params.threadId to n.value.params.turnId
    is ServerNotification.ItemCompleted -> n.value.params.threadId to n.value.params.turnId
    is ServerNotification.ToolRequested -> n.value.params.threadId to n.value.params.turnId
    is ServerNotification.ToolResult -> n.value.params.threadId to n.value.params.turnId
    is ServerNotification.ApprovalRequested -> n.value.params.threadId to n.value.params.turnId
    is ServerNotification.ApprovalResolved -> n.value.params.threadId to n.value.params.turnId
    is ServerNotification.GraphEvent -> null to null
    is ServerNotification.Unknown -> n.raw.optJSONObject("params").let { p ->
        p?.optString("threadId", "")?.ifEmpty { null } to p?.optString("turnId", "")?.ifEmpty { null }
    }
}

/**
 * One turn, started by [Client.turn]: [turn] as `turn/start` returned it, and [events], the turn's
 * notifications in order, ending after its `turn/completed` (inclusive). [events] can be collected
 * once; [text] and [completion] read it to the end (and remember the outcome, so both can be
 * called). Close the handle to stop receiving a turn you will not read.
 */
class TurnHandle internal constructor(
    /** The turn as `turn/start` returned it (status `queued` or `running`). */
    val turn: ProtocolTurn,
    private val channel: ReceiveChannel<ServerNotification>,
    private val onDone: () -> Unit,
) : AutoCloseable {
    val threadId: String get() = turn.threadId
    val turnId: String get() = turn.id

    private val collected = AtomicBoolean()
    private val texts = mutableListOf<String>()
    @Volatile private var completed: TurnCompletedParams? = null

    /** This turn's notifications (same thread and turn id), ending after its `turn/completed`. Collect once. */
    val events: Flow<ServerNotification> = flow {
        check(collected.compareAndSet(false, true)) { "the events of turn ${turn.id} were already collected" }
        try {
            while (true) {
                val n = nextEvent() ?: break
                emit(n)
                if (n is ServerNotification.TurnCompleted) break
            }
        } finally {
            close()
        }
    }

    private val closed = AtomicBoolean()

    /** The next event of this turn, or `null` once the turn completed or the client closed. */
    internal suspend fun nextEvent(): ServerNotification? {
        if (completed != null) return null
        while (true) {
            val n = channel.receiveCatching().getOrNull() ?: return null
            if (notificationScope(n).second != turn.id) continue
            record(n)
            if (n is ServerNotification.TurnCompleted) close()
            return n
        }
    }

    private fun record(n: ServerNotification) {
        when (n) {
            is ServerNotification.ItemCompleted ->
                (n.value.params.item.content as? ItemContent.AgentMessage)?.let { synchronized(texts) { texts += it.value.text } }
            is ServerNotification.TurnCompleted -> completed = n.value.params
            else -> Unit
        }
    }

    /**
     * Reads the turn to the end and returns its `turn/completed` params (whatever the status; see
     * [text] for the one that raises). Throws [AppServerException.Closed] if the client closed first.
     */
    suspend fun completion(): TurnCompletedParams {
        collected.set(true)
        while (completed == null) nextEvent() ?: break
        return completed ?: throw AppServerException.Closed("the client closed before turn ${turn.id} completed")
    }

    /**
     * Reads the turn to the end and returns the assistant's text: the `text` of its completed
     * `agentMessage` items, in order, joined with "\n". A turn that ended `failed` throws
     * [AppServerException.KernelFailed]; `interrupted`, [AppServerException.TurnInterrupted].
     */
    suspend fun text(): String {
        val done = completion()
        when (done.turn.status) {
            TurnStatus.Failed -> throw AppServerException.KernelFailed(
                reason = done.error?.code ?: "failed",
                message = done.error?.message ?: "turn ${turn.id} failed",
                turnId = turn.id,
                threadId = turn.threadId,
            )
            TurnStatus.Interrupted -> throw AppServerException.TurnInterrupted(turn.id, turn.threadId)
            else -> Unit
        }
        return synchronized(texts) { texts.joinToString("\n") }
    }

    /** Stops receiving this turn's events (those not yet read are dropped). Idempotent. */
    override fun close() {
        if (!closed.compareAndSet(false, true)) return
        channel.cancel()
        onDone()
    }

    /** This handle for Java: blocking and CompletableFuture methods, and an Iterator. */
    fun java(): JavaTurnHandle = JavaTurnHandle(this)

    internal fun receiveBlocking(): ServerNotification? = runBlocking { nextEvent() }

    internal fun claim(): Boolean = collected.compareAndSet(false, true)
}

/**
 * [TurnHandle] for Java: `for (ServerNotification n : handle) …` iterates the turn's events
 * (blocking), `text()` / `completion()` block, `textAsync()` / `completionAsync()` return
 * CompletableFutures. Iterate at most once.
 */
class JavaTurnHandle internal constructor(private val handle: TurnHandle) : Iterable<ServerNotification>, AutoCloseable {
    fun turn(): ProtocolTurn = handle.turn
    fun threadId(): String = handle.threadId
    fun turnId(): String = handle.turnId

    /** The turn's notifications, blocking in `next()`, ending after its `turn/completed`. */
    override fun iterator(): Iterator<ServerNotification> {
        check(handle.claim()) { "the events of turn ${handle.turnId} were already collected" }
        return object : Iterator<ServerNotification> {
            private var next: ServerNotification? = null
            private var done = false

            override fun hasNext(): Boolean {
                if (next != null) return true
                if (done) return false
                next = handle.receiveBlocking()
                if (next == null) done = true
                if (next is ServerNotification.TurnCompleted) done = true
                return next != null
            }

            override fun next(): ServerNotification {
                if (!hasNext()) throw NoSuchElementException()
                return next!!.also { next = null }
            }
        }
    }

    /** See [TurnHandle.text]; blocks the calling thread. */
    @Throws(AppServerException::class)
    fun text(): String = runBlocking { handle.text() }

    @Throws(AppServerException::class)
    fun completion(): TurnCompletedParams = runBlocking { handle.completion() }

    fun textAsync(): CompletableFuture<String> = CompletableFuture.supplyAsync { runBlocking { handle.text() } }

    fun completionAsync(): CompletableFuture<TurnCompletedParams> =
        CompletableFuture.supplyAsync { runBlocking { handle.completion() } }

    /** The Kotlin handle underneath. */
    fun kotlin(): TurnHandle = handle

    override fun close() = handle.close()
}
