// The SDK for plain-Java callers (IntelliJ plugins written in Java, services): blocking methods,
// CompletableFutures, `long` millisecond timeouts and java.util.function callbacks — no coroutine,
// Flow or Kotlin function type in any signature.
package com.chainlesschain.appserver

import com.chainlesschain.appserver.ffi.ServerStats
import com.chainlesschain.appserver.protocol.GraphRunCancelResult
import com.chainlesschain.appserver.protocol.GraphRunReadResult
import com.chainlesschain.appserver.protocol.GraphRunStartResult
import com.chainlesschain.appserver.protocol.GraphValidateResult
import com.chainlesschain.appserver.protocol.ServerNotification
import com.chainlesschain.appserver.protocol.ThreadCompactResult
import com.chainlesschain.appserver.protocol.ThreadListResult
import com.chainlesschain.appserver.protocol.ThreadReadResult
import com.chainlesschain.appserver.protocol.ThreadResumeResult
import com.chainlesschain.appserver.protocol.ThreadStartResult
import com.chainlesschain.appserver.protocol.TurnInterruptResult
import com.chainlesschain.appserver.protocol.TurnStartResult
import kotlinx.coroutines.CoroutineScope
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.SupervisorJob
import kotlinx.coroutines.cancel
import kotlinx.coroutines.future.future
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.runInterruptible
import java.util.concurrent.CompletableFuture
import java.util.function.Consumer
import java.util.logging.Level
import java.util.logging.Logger
import java.util.function.Function as JFunction

private val javaLog: Logger = Logger.getLogger("com.chainlesschain.appserver.java")

/** [AppServer] for Java: `try (JavaAppServer server = JavaAppServer.open(dir)) { … }`. */
class JavaAppServer private constructor(private val server: AppServer) : AutoCloseable {
    companion object {
        @JvmStatic
        @JvmOverloads
        @Throws(AppServerException::class)
        fun open(stateDir: String, options: ServerOptions = ServerOptions()): JavaAppServer =
            JavaAppServer(AppServer.open(stateDir, options))
    }

    /** A client that declines every approval. */
    @Throws(AppServerException::class)
    fun client(): JavaClient = JavaClient(server.client(null, ClientOptions()))

    /**
     * A client whose approvals [approvals] decides, on a worker thread, within
     * [ClientOptions.approvalTimeoutMs]; throwing, returning `null` or answering late declines.
     */
    @JvmOverloads
    @Throws(AppServerException::class)
    fun client(approvals: JFunction<ApprovalRequest, Decision>?, options: ClientOptions = ClientOptions()): JavaClient {
        val handler = approvals?.let { fn ->
            ApprovalHandler { request ->
                runInterruptible(Dispatchers.IO) { fn.apply(request) }
                    ?: throw IllegalStateException("the approval function returned null")
            }
        }
        return JavaClient(server.client(handler, options))
    }

    fun stats(): ServerStats = server.stats()

    /** The Kotlin server underneath, for code that mixes both. */
    fun kotlin(): AppServer = server

    override fun close() = server.close()
}

/**
 * [Client] for Java. Blocking methods wait on the calling thread; `…Async` methods return a
 * CompletableFuture completed on a pool thread (cancelling it does not cancel the request, see
 * [Client.request]). Failures are [AppServerException]s (in a future: its cause).
 */
class JavaClient internal constructor(private val client: Client) : AutoCloseable {
    /** True when this client takes the JNI hot path (see [Client.usesJni]). */
    fun usesJni(): Boolean = client.usesJni

    private val scope = CoroutineScope(SupervisorJob() + Dispatchers.Default)

    private fun <T> blocking(block: suspend Client.() -> T): T = runBlocking { client.block() }

    private fun <T> async(block: suspend Client.() -> T): CompletableFuture<T> = scope.future { client.block() }

    @Throws(AppServerException::class)
    fun request(method: String, paramsJson: String): String = client.requestBlocking(method, paramsJson)
    fun requestAsync(method: String, paramsJson: String): CompletableFuture<String> = async { request(method, paramsJson) }

    @Throws(AppServerException::class)
    fun threadStart(title: String?): ThreadStartResult = blocking { threadStart(title = title) }
    @Throws(AppServerException::class)
    fun threadStart(title: String?, threadId: String?): ThreadStartResult = blocking { threadStart(title = title, threadId = threadId) }
    fun threadStartAsync(title: String?): CompletableFuture<ThreadStartResult> = async { threadStart(title = title) }

    @Throws(AppServerException::class)
    fun threadRead(threadId: String): ThreadReadResult = blocking { threadRead(threadId) }
    @Throws(AppServerException::class)
    fun threadResume(threadId: String): ThreadResumeResult = blocking { threadResume(threadId) }
    @Throws(AppServerException::class)
    fun threadList(): ThreadListResult = blocking { threadList() }

    @Throws(AppServerException::class)
    fun graphValidate(definitionJson: String, capabilities: List<String>): GraphValidateResult =
        blocking { graphValidate(definitionJson, capabilities) }
    @Throws(AppServerException::class)
    fun graphRunStart(definitionJson: String, runId: String?, capabilities: List<String>): GraphRunStartResult =
        blocking { graphRunStart(definitionJson, runId, capabilities) }
    @Throws(AppServerException::class)
    fun graphRunRead(runId: String, includeContent: Boolean): GraphRunReadResult =
        blocking { graphRunRead(runId, includeContent) }
    @Throws(AppServerException::class)
    fun graphRunCancel(runId: String, reason: String?): GraphRunCancelResult = blocking { graphRunCancel(runId, reason) }

    @Throws(AppServerException::class)
    fun threadCompact(threadId: String, summary: String?): ThreadCompactResult = blocking { threadCompact(threadId, summary) }

    @Throws(AppServerException::class)
    fun turnStart(threadId: String, text: String): TurnStartResult = blocking { turnStart(threadId, text) }
    fun turnStartAsync(threadId: String, text: String): CompletableFuture<TurnStartResult> = async { turnStart(threadId, text) }

    @Throws(AppServerException::class)
    fun turnInterrupt(threadId: String, turnId: String): TurnInterruptResult = blocking { turnInterrupt(threadId, turnId) }
    fun turnInterruptAsync(threadId: String, turnId: String): CompletableFuture<TurnInterruptResult> =
        async { turnInterrupt(threadId, turnId) }

    /** The next notification within [timeoutMs], or `null`; throws [AppServerException.Closed] once closed and drained. */
    @Throws(AppServerException::class)
    fun nextNotification(timeoutMs: Long): ServerNotification? = client.nextNotification(timeoutMs)

    /**
     * Calls [onNotification] for every notification on a pool thread, in order, until the returned
     * handle is closed or the client closes (then [onClosed] runs, if given). An exception from
     * the callback is logged and delivery goes on. Do not mix with [nextNotification].
     */
    @JvmOverloads
    fun subscribe(onNotification: Consumer<ServerNotification>, onClosed: Runnable? = null): AutoCloseable {
        val job = scope.launch {
            client.notifications().collect { n ->
                try {
                    onNotification.accept(n)
                } catch (e: Exception) {
                    javaLog.log(Level.WARNING, "notification callback threw; delivery continues", e)
                }
            }
            onClosed?.run()
        }
        return AutoCloseable { runBlocking { job.cancelAndJoinQuietly() } }
    }

    val pendingRequests: Long get() = client.pendingRequests
    val isClosed: Boolean get() = client.isClosed

    /** The Kotlin client underneath. */
    fun kotlin(): Client = client

    override fun close() {
        client.close()
        scope.cancel()
    }
}

private suspend fun kotlinx.coroutines.Job.cancelAndJoinQuietly() {
    cancel()
    join()
}
