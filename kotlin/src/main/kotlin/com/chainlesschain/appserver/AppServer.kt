// The SDK's entry point: one in-process server per state directory, closed with the host (an IDE
// project, an Android process, a service). Wraps the uniffi `AppServer` so Kotlin callers get
// defaults, typed exceptions, a Kotlin kernel/tool executor and the JUL log bridge.
package com.chainlesschain.appserver

import java.nio.file.Path
import com.chainlesschain.appserver.ffi.AppServer as NativeServer
import com.chainlesschain.appserver.ffi.ClientOptions as NativeClientOptions
import com.chainlesschain.appserver.ffi.Client as NativeClient

/** Client-side bounds; `null` keeps the default (docs/engine.md, "Default bounds"). */
data class ClientOptions @JvmOverloads constructor(
    /** A request unanswered this long fails with [AppServerException.Timeout] (default 120 s). */
    val requestTimeoutMs: Long? = null,
    /** Requests in flight at once; one more fails with [AppServerException.Overloaded] (default 256). */
    val maxPending: Int? = null,
    /** The approval handler's deadline; later (or throwing) declines (default 30 s). */
    val approvalTimeoutMs: Long = 30_000,
    /** Notifications the native client buffers for the host (default 4096). */
    val notificationCapacity: Int? = null,
    /** Notifications each [Client.notifications] collector may fall behind before delivery waits for it. */
    val collectorBuffer: Int = 1024,
    /**
     * Requests and notifications cross into the library through its direct JNI entry points when
     * it has them (docs/bench/jvm.md); `false` keeps them on uniffi's JNA calls, like every other
     * call. For diagnosis and benchmarks; `-Dcc.appserver.jni=false` does the same process-wide.
     */
    val jniHotPath: Boolean = true,
) {
    fun withRequestTimeoutMs(v: Long?) = copy(requestTimeoutMs = v)
    fun withMaxPending(v: Int?) = copy(maxPending = v)
    fun withApprovalTimeoutMs(v: Long) = copy(approvalTimeoutMs = v)

    internal fun toNative() = NativeClientOptions(
        requestTimeoutMs = requestTimeoutMs,
        maxPending = maxPending,
        // The native deadline is a backstop a little past ours, so the SDK decides (and logs) first.
        approvalTimeoutMs = if (approvalTimeoutMs > Long.MAX_VALUE - APPROVAL_GRACE_MS) Long.MAX_VALUE else approvalTimeoutMs + APPROVAL_GRACE_MS,
        notificationCapacity = notificationCapacity,
    )

    internal companion object {
        const val APPROVAL_GRACE_MS = 2_000L
    }
}

/**
 * An in-process CC App Server over one state directory. Open one per directory (a second open of
 * the same directory fails while this one holds its lock) and [close] it with its owner.
 */
class AppServer private constructor(internal val native: NativeServer) : AutoCloseable {
    @Volatile private var closed = false

    companion object {
        /**
         * Opens the server on [stateDir] (created 0700; refused if others can write to it), repairing
         * torn tails and settling turns a previous process left running. [kernel] replaces the
         * built-in scripted kernel, [tools] the echo tool executor.
         */
        @JvmStatic
        @JvmOverloads
        @Throws(AppServerException::class)
        fun open(
            stateDir: String,
            options: ServerOptions = ServerOptions(),
            kernel: AgentKernel? = null,
            tools: ToolExecutor? = null,
        ): AppServer {
            if (options.approvalTimeoutMs != null && options.approvalTimeoutMs < 0) {
                throw AppServerException.InvalidArgument("approvalTimeoutMs must not be negative")
            }
            NativeLib.prepare()
            AppServerLogging.installDefault()
            val native = native {
                NativeServer.open(
                    options.toNative(stateDir),
                    kernel?.let { KernelAdapter(it) },
                    tools?.let { ToolAdapter(it) },
                )
            }
            return AppServer(native)
        }

        @JvmStatic
        @JvmOverloads
        fun open(
            stateDir: Path,
            options: ServerOptions = ServerOptions(),
            kernel: AgentKernel? = null,
            tools: ToolExecutor? = null,
        ): AppServer = open(stateDir.toString(), options, kernel, tools)

        /**
         * [open] with the options built in place:
         * `AppServer.open(dir) { durability = Durability.BUFFERED; policy = ApprovalPolicy.AUTO_APPROVE }`.
         * (Java: `AppServer.open(dir, ServerOptions.builder()….build())`.)
         */
        @JvmSynthetic
        fun open(
            stateDir: String,
            kernel: AgentKernel? = null,
            tools: ToolExecutor? = null,
            configure: ServerOptions.Builder.() -> Unit,
        ): AppServer = open(stateDir, ServerOptions.Builder().apply(configure).build(), kernel, tools)

        @JvmSynthetic
        fun open(
            stateDir: Path,
            kernel: AgentKernel? = null,
            tools: ToolExecutor? = null,
            configure: ServerOptions.Builder.() -> Unit,
        ): AppServer = open(stateDir.toString(), kernel, tools, configure)
    }

    /**
     * A connected client with the `initialize` handshake done. [approvals] decides tool approvals
     * (a suspend function with a deadline of [ClientOptions.approvalTimeoutMs]); without one,
     * every approval is declined.
     */
    @JvmOverloads
    fun client(approvals: ApprovalHandler? = null, options: ClientOptions = ClientOptions()): Client {
        if (options.approvalTimeoutMs < 0) {
            throw AppServerException.InvalidArgument("approvalTimeoutMs must not be negative")
        }
        if (options.collectorBuffer < 1) {
            throw AppServerException.InvalidArgument("collectorBuffer must be at least 1")
        }
        val handler = approvals?.let {
            SuspendingApprovalHandler(it, options.approvalTimeoutMs, kotlinx.coroutines.Dispatchers.Default)
        } ?: NoApprovalHandler
        val native = native { NativeClient.connect(this.native, handler, options.toNative()) }
        return Client(native, options, options.jniHotPath)
    }

    /** The engine's counters (tools executed, listener errors, dropped log records, …). */
    fun stats(): ServerStats = ServerStats.of(native { native.stats() })

    /** The rollout store this server writes, to list, read and verify threads (closing it is a no-op). */
    fun store(): RolloutStore = RolloutStore(native { native.store() }, owned = false)

    /** Changes the approval policy; grants made under the old one lapse. */
    fun setPolicy(policy: ApprovalPolicy) {
        native { native.setPolicy(policy.toNative()) }
    }

    /** Changes the workspace approvals are bound to; grants for the old one lapse. */
    fun setWorkspace(workspace: String) {
        native { native.setWorkspace(workspace) }
    }

    val isClosed: Boolean get() = closed

    /**
     * Interrupts live turns (waiting for each to settle), closes every client and flushes the
     * store, then frees the native server. Idempotent.
     */
    @Synchronized
    override fun close() {
        if (closed) return
        closed = true
        native.shutdown()
        native.destroy()
    }
}
