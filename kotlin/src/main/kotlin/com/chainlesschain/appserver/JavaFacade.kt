// The SDK for plain-Java callers (IntelliJ plugins written in Java, services): blocking methods,
// CompletableFutures, `long` millisecond timeouts and java.util.function callbacks — no coroutine,
// Flow or Kotlin function type in any signature.
package com.chainlesschain.appserver

import com.chainlesschain.appserver.protocol.AgentOptions
import com.chainlesschain.appserver.protocol.GraphRunCancelResult
import com.chainlesschain.appserver.protocol.GraphRunReadResult
import com.chainlesschain.appserver.protocol.GraphRunStartResult
import com.chainlesschain.appserver.protocol.GraphValidateResult
import com.chainlesschain.appserver.protocol.ServerNotification
import com.chainlesschain.appserver.protocol.ThreadArchiveResult
import com.chainlesschain.appserver.protocol.ThreadCompactResult
import com.chainlesschain.appserver.protocol.ThreadForkResult
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

        @JvmStatic
        @JvmOverloads
        @Throws(AppServerException::class)
        fun open(stateDir: java.nio.file.Path, options: ServerOptions = ServerOptions()): JavaAppServer =
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

    /** The rollout store this server writes (list, read, verify threads). */
    fun store(): RolloutStore = server.store()

    /** Changes the approval policy; grants made under the old one lapse. */
    fun setPolicy(policy: ApprovalPolicy) = server.setPolicy(policy)

    /** Changes the workspace approvals are bound to; grants for the old one lapse. */
    fun setWorkspace(workspace: String) = server.setWorkspace(workspace)

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
    /**
     * Starts a thread with [agentOptions] (`new AgentOptions(model, instructions, script)`, e.g. a
     * script for the scripted kernel) and an optional idempotency key.
     */
    @Throws(AppServerException::class)
    fun threadStart(title: String?, threadId: String?, agentOptions: AgentOptions?, idempotencyKey: String?): ThreadStartResult =
        blocking { threadStart(title = title, threadId = threadId, agentOptions = agentOptions, idempotencyKey = idempotencyKey) }
    fun threadStartAsync(title: String?): CompletableFuture<ThreadStartResult> = async { threadStart(title = title) }
    fun threadStartAsync(title: String?, threadId: String?): CompletableFuture<ThreadStartResult> =
        async { threadStart(title = title, threadId = threadId) }
    fun threadStartAsync(title: String?, threadId: String?, agentOptions: AgentOptions?, idempotencyKey: String?): CompletableFuture<ThreadStartResult> =
        async { threadStart(title = title, threadId = threadId, agentOptions = agentOptions, idempotencyKey = idempotencyKey) }

    @Throws(AppServerException::class)
    fun threadRead(threadId: String): ThreadReadResult = blocking { threadRead(threadId) }
    /** One page of the thread's events after [afterEventSeq] (`null`: from the start), at most [limit] (`null`: the server's). */
    @Throws(AppServerException::class)
    fun threadRead(threadId: String, afterEventSeq: Long?, limit: Long?): ThreadReadResult = blocking { threadRead(threadId, afterEventSeq, limit) }
    fun threadReadAsync(threadId: String): CompletableFuture<ThreadReadResult> = async { threadRead(threadId) }
    fun threadReadAsync(threadId: String, afterEventSeq: Long?, limit: Long?): CompletableFuture<ThreadReadResult> =
        async { threadRead(threadId, afterEventSeq, limit) }

    @Throws(AppServerException::class)
    fun threadResume(threadId: String): ThreadResumeResult = blocking { threadResume(threadId) }
    @Throws(AppServerException::class)
    fun threadResume(threadId: String, afterEventSeq: Long?, limit: Long?): ThreadResumeResult = blocking { threadResume(threadId, afterEventSeq, limit) }
    fun threadResumeAsync(threadId: String): CompletableFuture<ThreadResumeResult> = async { threadResume(threadId) }

    @Throws(AppServerException::class)
    fun threadFork(threadId: String, newThreadId: String?, atEventSeq: Long?, title: String?): ThreadForkResult =
        blocking { threadFork(threadId, newThreadId, atEventSeq, title) }
    fun threadForkAsync(threadId: String, newThreadId: String?, atEventSeq: Long?, title: String?): CompletableFuture<ThreadForkResult> =
        async { threadFork(threadId, newThreadId, atEventSeq, title) }

    @Throws(AppServerException::class)
    fun threadArchive(threadId: String): ThreadArchiveResult = blocking { threadArchive(threadId) }
    fun threadArchiveAsync(threadId: String): CompletableFuture<ThreadArchiveResult> = async { threadArchive(threadId) }

    @Throws(AppServerException::class)
    fun threadList(): ThreadListResult = blocking { threadList() }
    /**
     * One page of threads: pass the previous page's `getNextCursor()` as [cursor] (`null` for the
     * first page) until it is `null`; [limit] `null` keeps the server's page size.
     */
    @Throws(AppServerException::class)
    fun threadList(includeArchived: Boolean, cursor: String?, limit: Long?): ThreadListResult =
        blocking { threadList(includeArchived, cursor, limit) }
    fun threadListAsync(): CompletableFuture<ThreadListResult> = async { threadList() }
    fun threadListAsync(includeArchived: Boolean, cursor: String?, limit: Long?): CompletableFuture<ThreadListResult> =
        async { threadList(includeArchived, cursor, limit) }

    @Throws(AppServerException::class)
    fun graphValidate(definitionJson: String, capabilities: List<String>): GraphValidateResult =
        blocking { graphValidate(definitionJson, capabilities) }
    fun graphValidateAsync(definitionJson: String, capabilities: List<String>): CompletableFuture<GraphValidateResult> =
        async { graphValidate(definitionJson, capabilities) }
    @Throws(AppServerException::class)
    fun graphRunStart(definitionJson: String, runId: String?, capabilities: List<String>): GraphRunStartResult =
        blocking { graphRunStart(definitionJson, runId, capabilities) }
    fun graphRunStartAsync(definitionJson: String, runId: String?, capabilities: List<String>): CompletableFuture<GraphRunStartResult> =
        async { graphRunStart(definitionJson, runId, capabilities) }
    @Throws(AppServerException::class)
    fun graphRunRead(runId: String, includeContent: Boolean): GraphRunReadResult =
        blocking { graphRunRead(runId, includeContent) }
    fun graphRunReadAsync(runId: String, includeContent: Boolean): CompletableFuture<GraphRunReadResult> =
        async { graphRunRead(runId, includeContent) }
    @Throws(AppServerException::class)
    fun graphRunCancel(runId: String, reason: String?): GraphRunCancelResult = blocking { graphRunCancel(runId, reason) }
    fun graphRunCancelAsync(runId: String, reason: String?): CompletableFuture<GraphRunCancelResult> =
        async { graphRunCancel(runId, reason) }

    @Throws(AppServerException::class)
    fun threadCompact(threadId: String, summary: String?): ThreadCompactResult = blocking { threadCompact(threadId, summary) }
    fun threadCompactAsync(threadId: String, summary: String?): CompletableFuture<ThreadCompactResult> =
        async { threadCompact(threadId, summary) }

    @Throws(AppServerException::class)
    fun turnStart(threadId: String, text: String): TurnStartResult = blocking { turnStart(threadId, text) }
    @Throws(AppServerException::class)
    fun turnStart(threadId: String, text: String, idempotencyKey: String?): TurnStartResult =
        blocking { turnStart(threadId, text, idempotencyKey) }
    fun turnStartAsync(threadId: String, text: String): CompletableFuture<TurnStartResult> = async { turnStart(threadId, text) }

    /**
     * Starts a turn and returns its events (see [Client.turn]): iterate the handle, or call
     * `text()` (throws KernelFailed / TurnInterrupted) or `completion()`.
     */
    @Throws(AppServerException::class)
    fun turn(threadId: String, text: String): JavaTurnHandle = blocking { turn(threadId, text) }.java()
    fun turnAsync(threadId: String, text: String): CompletableFuture<JavaTurnHandle> = async { turn(threadId, text).java() }

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
    fun subscribe(onNotification: Consumer<ServerNotification>, onClosed: Runnable? = null): Subscription {
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
        return Subscription { runBlocking { job.cancelAndJoinQuietly() } }
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

/**
 * A running [JavaClient.subscribe]: `close()` stops delivery (waiting for a callback in progress)
 * and throws nothing, so `try (Subscription s = client.subscribe(…)) { … }` needs no catch.
 */
class Subscription internal constructor(private val stop: () -> Unit) : AutoCloseable {
    private val closed = java.util.concurrent.atomic.AtomicBoolean()

    /** Stops delivery. Idempotent; never throws. */
    override fun close() {
        if (closed.compareAndSet(false, true)) stop()
    }
}

private suspend fun kotlinx.coroutines.Job.cancelAndJoinQuietly() {
    cancel()
    join()
}
