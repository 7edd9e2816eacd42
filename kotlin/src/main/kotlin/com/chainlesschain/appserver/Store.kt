// The rollout store as the SDK presents it: list, page and verify threads with the SDK's own
// records (nested here so they never clash with the protocol's `RolloutEvent`), failures as
// AppServerException (NotFound, StoreLocked, StoreUnsafe, StoreDamaged, Closed).
package com.chainlesschain.appserver

import java.nio.file.Path
import com.chainlesschain.appserver.ffi.RolloutStore as NativeStore

/**
 * A rollout store: the one a server writes ([AppServer.store]) or one opened on its own for a
 * state directory no server is using ([open]). Closing the server's store is a no-op; close one
 * you opened.
 */
class RolloutStore internal constructor(private val native: NativeStore, private val owned: Boolean) : AutoCloseable {
    companion object {
        /** Opens the store of [stateDir] alone (no server on it: a second open fails with StoreLocked). */
        @JvmStatic
        @JvmOverloads
        @Throws(AppServerException::class)
        fun open(stateDir: String, kind: StoreKind? = null, key: ByteArray? = null, acceptUnanchored: Boolean? = null): RolloutStore {
            NativeLib.prepare()
            return RolloutStore(native { NativeStore.open(stateDir, kind?.toNative(), key, acceptUnanchored) }, owned = true)
        }

        @JvmStatic
        @JvmOverloads
        @Throws(AppServerException::class)
        fun open(stateDir: Path, kind: StoreKind? = null, key: ByteArray? = null, acceptUnanchored: Boolean? = null): RolloutStore =
            open(stateDir.toString(), kind, key, acceptUnanchored)
    }

    /** One thread as listed. */
    data class ThreadSummary(
        val threadId: String,
        val title: String?,
        val createdAt: String,
        val updatedAt: String,
        val archived: Boolean,
        val lastSeq: Long,
        val headHash: String,
    )

    /** A thread the store holds evidence of but cannot open or verify, and why. */
    data class Unreadable(val threadId: String, val reason: String)

    /** A page of [list]; pass [nextCursor] back for the next one (absent on the last). */
    data class ThreadPage(val threads: List<ThreadSummary>, val nextCursor: String?, val unreadable: List<Unreadable>)

    /** One stored event: the indexing fields, plus the whole event (wire `RolloutEvent`) as JSON. */
    data class Event(val seq: Long, val hash: String, val prevHash: String, val time: String, val kind: String, val json: String)

    /** A page of [read]. */
    data class EventPage(val events: List<Event>, val hasMore: Boolean)

    /** The result of checking one thread's whole chain and its head anchor. */
    data class VerifyReport(
        val threadId: String,
        val ok: Boolean,
        val events: Long,
        val headSeq: Long,
        val headHash: String,
        val firstBadSeq: Long?,
        val reason: String?,
        val repairs: List<String>,
        val warnings: List<String>,
        val keyed: Boolean,
        val authenticatedThrough: Long?,
    )

    @JvmOverloads
    @Throws(AppServerException::class)
    fun list(includeArchived: Boolean = false, cursor: String? = null, limit: Int = 100): ThreadPage {
        val p = native { native.list(includeArchived, cursor, limit) }
        return ThreadPage(
            p.threads.map { ThreadSummary(it.threadId, it.title, it.createdAt, it.updatedAt, it.archived, it.lastSeq, it.headHash) },
            p.nextCursor,
            p.unreadable.map { Unreadable(it.threadId, it.reason) },
        )
    }

    @JvmOverloads
    @Throws(AppServerException::class)
    fun read(threadId: String, afterSeq: Long = 0, limit: Int = 100): EventPage {
        val p = native { native.read(threadId, afterSeq, limit) }
        return EventPage(p.events.map { Event(it.seq, it.hash, it.prevHash, it.time, it.kind, it.json) }, p.hasMore)
    }

    @Throws(AppServerException::class)
    fun verify(threadId: String): VerifyReport {
        val r = native { native.verify(threadId) }
        return VerifyReport(
            r.threadId, r.ok, r.events, r.headSeq, r.headHash, r.firstBadSeq, r.reason, r.repairs,
            r.warnings, r.keyed, r.authenticatedThrough,
        )
    }

    /** Closes a store opened with [open] and frees it; a server's own store stays open. Idempotent. */
    override fun close() {
        if (!owned) return
        synchronized(this) {
            try {
                native.closeStore()
            } catch (_: Exception) {
                // Already closed.
            }
            native.destroy()
        }
    }
}
