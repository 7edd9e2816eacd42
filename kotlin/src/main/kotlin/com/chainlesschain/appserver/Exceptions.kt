// Typed failures of the SDK: every client request ends in a result or one of these, each carrying
// the JSON-RPC code it stands for, so Kotlin `when`, Java `catch` and logs all agree.
package com.chainlesschain.appserver

import com.chainlesschain.appserver.ffi.ClientException
import com.chainlesschain.appserver.ffi.HandlerException
import com.chainlesschain.appserver.ffi.KernelException
import com.chainlesschain.appserver.ffi.ServerException
import com.chainlesschain.appserver.ffi.StoreException
import com.chainlesschain.appserver.ffi.StoreFailure
import com.chainlesschain.appserver.protocol.ErrorCode
import com.chainlesschain.appserver.protocol.ProtocolDecodeException

/**
 * Why a request (or an open) did not produce a result. [code] is the JSON-RPC error code
 * (`-32001` overloaded, `-32010` timeout, …); [ProtocolException] is the server's own answer.
 */
sealed class AppServerException(message: String, val code: Int, cause: Throwable? = null) :
    Exception(message, cause) {

    /** Too many requests in flight, or the server's queue is full: wait [retryAfterMs] and retry. */
    class Overloaded(val retryAfterMs: Long) :
        AppServerException("overloaded; retry after $retryAfterMs ms", ErrorCode.OVERLOADED)

    /** No answer within the request timeout. Never read this as success: the request may still run. */
    class Timeout : AppServerException("no answer within the request timeout", ErrorCode.INTERRUPTED)

    /** The client (or the server) is closed. Open a new client to go on. */
    class Closed(message: String = "the client is closed") : AppServerException(message, ErrorCode.INTERNAL)

    /** The request is larger than the server's line limit; nothing was sent. */
    class LineTooLarge(val size: Long, val max: Long) :
        AppServerException("request of $size bytes exceeds the $max-byte limit", ErrorCode.INVALID_REQUEST)

    /** Parameters or a result were not the JSON expected. */
    class InvalidJson(reason: String, cause: Throwable? = null) :
        AppServerException("invalid JSON: $reason", ErrorCode.PARSE, cause)

    /** An argument was out of range (a negative timeout, a zero count, an empty state dir…). */
    class InvalidArgument(reason: String) : AppServerException("invalid argument: $reason", ErrorCode.INVALID_PARAMS)

    /**
     * The rollout store failed (I/O, SQLite, …): see the message. The subclasses say which failure
     * it was, so a host can offer the right fix: [StoreLocked], [StoreUnsafe], [StoreDamaged].
     */
    open class Store(reason: String) : AppServerException(reason, ErrorCode.INTERNAL)

    /** Another store holds the state directory (a second open in this process, or another process). */
    class StoreLocked(reason: String) : Store(reason)

    /** The state directory is not a private directory (a regular file, a symlink, group/world access). */
    class StoreUnsafe(reason: String) : Store(reason)

    /** A log is corrupt or does not match its head anchor: restore it from a backup. */
    class StoreDamaged(reason: String) : Store(reason)

    /** The thread, turn, run or item does not exist (server -32004, or the store's NotFound). */
    class NotFound(message: String, dataJson: String? = null) : ProtocolException(ErrorCode.NOT_FOUND, message, dataJson)

    /** The request conflicts with the current state: a busy thread, a reused idempotency key (-32009). */
    class Conflict(message: String, dataJson: String? = null) : ProtocolException(ErrorCode.CONFLICT, message, dataJson)

    /** The server refused the request's parameters (-32602). */
    class InvalidParams(message: String, dataJson: String? = null) : ProtocolException(ErrorCode.INVALID_PARAMS, message, dataJson)

    /**
     * A turn ended `failed` ([TurnHandle.text] / [TurnHandle.completion]): [reason] is the turn
     * error's code (`kernelFailed`, `kernelPanicked`, `recordingFailed`, `outputLimit`, …), the
     * message its message.
     */
    class KernelFailed(val reason: String, message: String, val turnId: String, val threadId: String) :
        AppServerException(message, ErrorCode.INTERNAL)

    /** A turn ended `interrupted` (only from [TurnHandle.text]). */
    class TurnInterrupted(val turnId: String, val threadId: String, message: String = "turn $turnId was interrupted") :
        AppServerException(message, ErrorCode.INTERRUPTED)
}

/**
 * The server answered with a JSON-RPC error: [code] (e.g. `-32004` not found, `-32009` conflict,
 * `-32602` invalid params) and its message; [dataJson] is the error's `data` as JSON text, if any.
 * The common codes arrive as the subclasses [AppServerException.NotFound],
 * [AppServerException.Conflict] and [AppServerException.InvalidParams].
 */
open class ProtocolException(code: Int, message: String, val dataJson: String?) :
    AppServerException(message, code)

/** The class of a server's JSON-RPC error. */
internal fun protocolException(code: Int, message: String, dataJson: String?): ProtocolException = when (code) {
    ErrorCode.NOT_FOUND -> AppServerException.NotFound(message, dataJson)
    ErrorCode.CONFLICT -> AppServerException.Conflict(message, dataJson)
    ErrorCode.INVALID_PARAMS -> AppServerException.InvalidParams(message, dataJson)
    else -> ProtocolException(code, message, dataJson)
}

internal fun ClientException.toSdk(): AppServerException = when (this) {
    is ClientException.Overloaded -> AppServerException.Overloaded(retryAfterMs)
    is ClientException.Timeout -> AppServerException.Timeout()
    is ClientException.Closed -> AppServerException.Closed()
    is ClientException.LineTooLarge -> AppServerException.LineTooLarge(size, max)
    is ClientException.Protocol -> protocolException(code.toInt(), reason, data)
    is ClientException.InvalidJson -> AppServerException.InvalidJson(reason, this)
    is ClientException.InvalidArgument -> AppServerException.InvalidArgument(reason)
}

internal fun ServerException.toSdk(): AppServerException = when (this) {
    is ServerException.InvalidConfig -> AppServerException.InvalidArgument(reason)
    is ServerException.Store -> when (kind) {
        StoreFailure.LOCKED -> AppServerException.StoreLocked(reason)
        StoreFailure.UNSAFE -> AppServerException.StoreUnsafe(reason)
        StoreFailure.DAMAGED -> AppServerException.StoreDamaged(reason)
        StoreFailure.IO -> AppServerException.Store(reason)
    }
    is ServerException.ShutDown -> AppServerException.Closed("the server is shut down; open a new one")
    is ServerException.Overloaded -> AppServerException.Overloaded(retryAfterMs)
}

internal fun StoreException.toSdk(): AppServerException = when (this) {
    is StoreException.Closed -> AppServerException.Closed("the rollout store is closed; open it again")
    is StoreException.InvalidArgument -> AppServerException.InvalidArgument(reason)
    is StoreException.NotFound -> AppServerException.NotFound(reason)
    is StoreException.Locked -> AppServerException.StoreLocked(reason)
    is StoreException.UnsafeStateDir -> AppServerException.StoreUnsafe(reason)
    is StoreException.Corrupt, is StoreException.AnchorMismatch -> AppServerException.StoreDamaged(message ?: toString())
    else -> AppServerException.Store(message ?: toString())
}

/** Runs a native call, turning the glue's exceptions into the SDK's. */
internal inline fun <T> native(block: () -> T): T = try {
    block()
} catch (e: ClientException) {
    throw e.toSdk()
} catch (e: ServerException) {
    throw e.toSdk()
} catch (e: StoreException) {
    throw e.toSdk()
} catch (e: IllegalStateException) {
    // The uniffi handle was freed by close(): a call racing with it, or one after it.
    if (e.message?.endsWith("object has already been destroyed") == true) throw AppServerException.Closed()
    throw e
}

/** A result the generated types refuse is the server breaking the protocol, not the caller's bug. */
internal inline fun <T> decoding(what: String, block: () -> T): T = try {
    block()
} catch (e: ProtocolDecodeException) {
    throw AppServerException.InvalidJson("$what: ${e.message}", e)
}

/** Names a host exception for a log line or a kernel/tool error, without a stack trace. */
internal fun describe(e: Throwable): String =
    e.javaClass.simpleName + (e.message?.let { ": $it" } ?: "")

internal fun handlerFailure(e: Throwable) = HandlerException.Failed(describe(e))

internal fun kernelFailure(e: Throwable) = KernelException.Failed(describe(e))
