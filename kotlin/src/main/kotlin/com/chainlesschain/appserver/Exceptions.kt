// Typed failures of the SDK: every client request ends in a result or one of these, each carrying
// the JSON-RPC code it stands for, so Kotlin `when`, Java `catch` and logs all agree.
package com.chainlesschain.appserver

import com.chainlesschain.appserver.ffi.ClientException
import com.chainlesschain.appserver.ffi.HandlerException
import com.chainlesschain.appserver.ffi.KernelException
import com.chainlesschain.appserver.ffi.ServerException
import com.chainlesschain.appserver.ffi.StoreException
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

    /** The server could not open its rollout store (permissions, lock, corruption): see the message. */
    class Store(reason: String) : AppServerException(reason, ErrorCode.INTERNAL)
}

/**
 * The server answered with a JSON-RPC error: [code] (e.g. `-32004` not found, `-32009` conflict,
 * `-32602` invalid params) and its message; [dataJson] is the error's `data` as JSON text, if any.
 */
class ProtocolException(code: Int, message: String, val dataJson: String?) :
    AppServerException(message, code)

internal fun ClientException.toSdk(): AppServerException = when (this) {
    is ClientException.Overloaded -> AppServerException.Overloaded(retryAfterMs)
    is ClientException.Timeout -> AppServerException.Timeout()
    is ClientException.Closed -> AppServerException.Closed()
    is ClientException.LineTooLarge -> AppServerException.LineTooLarge(size, max)
    is ClientException.Protocol -> ProtocolException(code.toInt(), reason, data)
    is ClientException.InvalidJson -> AppServerException.InvalidJson(reason, this)
    is ClientException.InvalidArgument -> AppServerException.InvalidArgument(reason)
}

internal fun ServerException.toSdk(): AppServerException = when (this) {
    is ServerException.InvalidConfig -> AppServerException.InvalidArgument(reason)
    is ServerException.Store -> AppServerException.Store(reason)
    is ServerException.ShutDown -> AppServerException.Closed("the server is shut down; open a new one")
}

internal fun StoreException.toSdk(): AppServerException = when (this) {
    is StoreException.Closed -> AppServerException.Closed("the rollout store is closed; open it again")
    is StoreException.InvalidArgument -> AppServerException.InvalidArgument(reason)
    is StoreException.NotFound -> ProtocolException(ErrorCode.NOT_FOUND, reason, null)
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
