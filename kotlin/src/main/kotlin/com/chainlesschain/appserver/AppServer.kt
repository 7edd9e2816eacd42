// The SDK's entry point: one in-process server per state directory, closed with the host (an IDE
// project, an Android process, a service). Wraps the uniffi `AppServer` so Kotlin callers get
// defaults, typed exceptions, a Kotlin kernel/tool executor and the JUL log bridge.
package com.chainlesschain.appserver

import com.chainlesschain.appserver.ffi.ServerStats
import java.nio.file.Path
import com.chainlesschain.appserver.ffi.AppServer as NativeServer
import com.chainlesschain.appserver.ffi.ClientOptions as NativeClientOptions
import com.chainlesschain.appserver.ffi.Client as NativeClient
import com.chainlesschain.appserver.ffi.RolloutStore as NativeStore
import com.chainlesschain.appserver.ffi.ServerOptions as NativeServerOptions

typealias ApprovalPolicy = com.chainlesschain.appserver.ffi.ApprovalPolicy
typealias StoreKind = com.chainlesschain.appserver.ffi.StoreKind
typealias Durability = com.chainlesschain.appserver.ffi.Durability
/** The OpenAI-compatible kernel's settings: `OpenAiOptions(baseUrl, model, apiKey = …)`. */
typealias OpenAiOptions = com.chainlesschain.appserver.ffi.OpenAiOptions

/**
 * How a server is opened. Every field is optional; `null` keeps the engine's default (JSONL store,
 * sync durability, ask for every tool, 1 MiB lines, 512 outbound messages, …). Java callers use the
 * `with…` methods: `new ServerOptions().withPolicy(ApprovalPolicy.AUTO_APPROVE)`.
 */
data class ServerOptions @JvmOverloads constructor(
    val store: StoreKind? = null,
    val durability: Durability? = null,
    val policy: ApprovalPolicy? = null,
    /** What approvals are bound to (the workspace digest), e.g. the project root. */
    val workspace: String? = null,
    /** JSON script for the built-in scripted kernel (used when no [AgentKernel] is given). */
    val scriptJson: String? = null,
    /** How long the engine waits for an approval before failing closed. */
    val approvalTimeoutMs: Long? = null,
    /** How long an interrupt waits for a kernel to physically stop. */
    val settleDeadlineMs: Long? = null,
    val maxLineBytes: Long? = null,
    val inboundMessages: Int? = null,
    val outboundMessages: Int? = null,
    /** How long a client that reads nothing while its queue is full keeps its connection (30 s). */
    val outboundStallMs: Long? = null,
    /** Run turns on an OpenAI-compatible model instead of the scripted kernel (docs/kernels.md). */
    val openai: OpenAiOptions? = null,
    /** Run approved tools with the workspace tool set confined to this existing directory. */
    val workspaceToolsDir: String? = null,
    /** Keyed tamper evidence: exactly 32 bytes from the host's key store; never written anywhere. */
    val rolloutKey: ByteArray? = null,
    /** Open threads whose head anchor is missing or damaged instead of refusing them. */
    val acceptUnanchored: Boolean? = null,
) {
    fun withStore(v: StoreKind?) = copy(store = v)
    fun withDurability(v: Durability?) = copy(durability = v)
    fun withPolicy(v: ApprovalPolicy?) = copy(policy = v)
    fun withWorkspace(v: String?) = copy(workspace = v)
    fun withScriptJson(v: String?) = copy(scriptJson = v)
    fun withApprovalTimeoutMs(v: Long?) = copy(approvalTimeoutMs = v)
    fun withInboundMessages(v: Int?) = copy(inboundMessages = v)
    fun withOutboundStallMs(v: Long?) = copy(outboundStallMs = v)
    fun withOpenai(v: OpenAiOptions?) = copy(openai = v)
    fun withWorkspaceToolsDir(v: String?) = copy(workspaceToolsDir = v)
    fun withRolloutKey(v: ByteArray?) = copy(rolloutKey = v)
    fun withAcceptUnanchored(v: Boolean?) = copy(acceptUnanchored = v)

    internal fun toNative(stateDir: String) = NativeServerOptions(
        stateDir = stateDir, store = store, durability = durability, policy = policy,
        workspace = workspace, scriptJson = scriptJson, approvalTimeoutMs = approvalTimeoutMs,
        settleDeadlineMs = settleDeadlineMs, maxLineBytes = maxLineBytes,
        inboundMessages = inboundMessages, outboundMessages = outboundMessages,
        outboundStallMs = outboundStallMs, openai = openai, workspaceToolsDir = workspaceToolsDir,
        rolloutKey = rolloutKey, acceptUnanchored = acceptUnanchored,
    )
}

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
    fun stats(): ServerStats = native.stats()

    /** The rollout store this server writes, to list, read and verify threads. */
    fun store(): NativeStore = native.store()

    /** Changes the approval policy; grants made under the old one lapse. */
    fun setPolicy(policy: ApprovalPolicy) = native.setPolicy(policy)

    /** Changes the workspace approvals are bound to; grants for the old one lapse. */
    fun setWorkspace(workspace: String) = native.setWorkspace(workspace)

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
