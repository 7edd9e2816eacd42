// How a server is opened, in the SDK's own types: enums and records the SDK owns (so no uniffi
// glue type reaches a public signature), a Kotlin builder DSL (`AppServer.open(dir) { … }`), a
// Java builder (`ServerOptions.builder()….build()`) and the engine's counters.
package com.chainlesschain.appserver

import com.chainlesschain.appserver.ffi.ApprovalPolicy as NativePolicy
import com.chainlesschain.appserver.ffi.Durability as NativeDurability
import com.chainlesschain.appserver.ffi.FailedClosedStats as NativeFailedClosed
import com.chainlesschain.appserver.ffi.OpenAiOptions as NativeOpenAi
import com.chainlesschain.appserver.ffi.ServerOptions as NativeServerOptions
import com.chainlesschain.appserver.ffi.ServerProfile as NativeProfile
import com.chainlesschain.appserver.ffi.ServerStats as NativeStats
import com.chainlesschain.appserver.ffi.StoreKind as NativeStoreKind

/** Which store backs a state directory. */
enum class StoreKind {
    /** One JSONL file per thread (the default). */
    JSONL,

    /** One SQLite database. */
    SQLITE,
    ;

    internal fun toNative(): NativeStoreKind = when (this) {
        JSONL -> NativeStoreKind.JSONL
        SQLITE -> NativeStoreKind.SQLITE
    }
}

/** Which set of bounds a server starts from (docs/engine.md, "Small devices"); options set beside it win. */
enum class ServerProfile {
    /** Sized for a desktop (256 connections, 1,024 loaded threads, a 32 MiB tail cache; the default). */
    STANDARD,

    /** For phones and watches: 8 connections, 4 running turns, 16 loaded threads, a 512 KiB tail cache. */
    COMPACT,
    ;

    internal fun toNative(): NativeProfile = when (this) {
        STANDARD -> NativeProfile.STANDARD
        COMPACT -> NativeProfile.COMPACT
    }
}

/** When a rollout append counts as done (docs/rollout-format.md). */
enum class Durability {
    /** Group commit with fdatasync before any host sees the event (the default). */
    SYNC,

    /** Written to the OS, fsynced on flush/close: survives a process crash, not a power loss. */
    BUFFERED,

    /** In memory until flush/close. */
    EPHEMERAL,
    ;

    internal fun toNative(): NativeDurability = when (this) {
        SYNC -> NativeDurability.SYNC
        BUFFERED -> NativeDurability.BUFFERED
        EPHEMERAL -> NativeDurability.EPHEMERAL
    }
}

/** Which tool calls need the host's approval. */
enum class ApprovalPolicy {
    /** Every tool call asks, unless a grant for the same operation still holds (the default). */
    ASK_EVERY_TIME,

    /** Tools run without asking (trusted automation only). */
    AUTO_APPROVE,

    /** No tool ever runs. */
    DENY_ALL,
    ;

    internal fun toNative(): NativePolicy = when (this) {
        ASK_EVERY_TIME -> NativePolicy.ASK_EVERY_TIME
        AUTO_APPROVE -> NativePolicy.AUTO_APPROVE
        DENY_ALL -> NativePolicy.DENY_ALL
    }
}

/** The OpenAI-compatible kernel's settings (docs/kernels.md); `null` keeps each default. */
data class OpenAiOptions @JvmOverloads constructor(
    /** The API root, e.g. `https://api.openai.com/v1` or `http://localhost:11434/v1`. */
    val baseUrl: String,
    val model: String,
    /** Absent: `CC_APP_SERVER_API_KEY`, else `OPENAI_API_KEY`, else none. Never recorded or logged. */
    val apiKey: String? = null,
    /** The system message. */
    val instructions: String? = null,
    val temperature: Double? = null,
    val maxOutputTokens: Int? = null,
    /** Model requests per turn (default 16); exceeded, the turn fails with `maxStepsExceeded`. */
    val maxSteps: Int? = null,
    val requestTimeoutMs: Long? = null,
    val idleTimeoutMs: Long? = null,
    val callDeadlineMs: Long? = null,
    val allowInsecureHttp: Boolean? = null,
) {
    override fun toString(): String =
        "OpenAiOptions(baseUrl=$baseUrl, model=$model, apiKey=${if (apiKey == null) "null" else "<redacted>"})"

    internal fun toNative() = NativeOpenAi(
        baseUrl = baseUrl, model = model, apiKey = apiKey, instructions = instructions,
        temperature = temperature, maxOutputTokens = maxOutputTokens, maxSteps = maxSteps,
        requestTimeoutMs = requestTimeoutMs, idleTimeoutMs = idleTimeoutMs,
        callDeadlineMs = callDeadlineMs, allowInsecureHttp = allowInsecureHttp,
    )
}

/**
 * How a server is opened. Every field is optional; `null` keeps the engine's default (JSONL store,
 * sync durability, ask for every tool, 1 MiB lines, 512 outbound messages, …). Kotlin:
 * `AppServer.open(dir) { durability = Durability.BUFFERED }` or `ServerOptions(durability = …)`;
 * Java: `ServerOptions.builder().durability(Durability.BUFFERED).build()`.
 */
data class ServerOptions(
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
    /** The bounds to start from; [ServerProfile.COMPACT] for phones and watches. */
    val profile: ServerProfile? = null,
) {
    /** A builder holding these values (to change a few of them). */
    fun toBuilder(): Builder = Builder().also { b ->
        b.store = store; b.durability = durability; b.policy = policy; b.workspace = workspace
        b.scriptJson = scriptJson; b.approvalTimeoutMs = approvalTimeoutMs
        b.settleDeadlineMs = settleDeadlineMs; b.maxLineBytes = maxLineBytes
        b.inboundMessages = inboundMessages; b.outboundMessages = outboundMessages
        b.outboundStallMs = outboundStallMs; b.openai = openai; b.workspaceToolsDir = workspaceToolsDir
        b.rolloutKey = rolloutKey; b.acceptUnanchored = acceptUnanchored; b.profile = profile
    }

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
    fun withProfile(v: ServerProfile?) = copy(profile = v)

    override fun toString(): String = "ServerOptions(store=$store, durability=$durability, policy=$policy, " +
        "workspace=$workspace, profile=$profile, rolloutKey=${if (rolloutKey == null) "null" else "<redacted>"}, …)"

    /**
     * Builds [ServerOptions]: in Kotlin as a DSL (`AppServer.open(dir) { store = StoreKind.SQLITE }`),
     * in Java fluently (`ServerOptions.builder().store(StoreKind.SQLITE).build()`).
     */
    class Builder {
        var store: StoreKind? = null
        var durability: Durability? = null
        var policy: ApprovalPolicy? = null
        var workspace: String? = null
        var scriptJson: String? = null
        var approvalTimeoutMs: Long? = null
        var settleDeadlineMs: Long? = null
        var maxLineBytes: Long? = null
        var inboundMessages: Int? = null
        var outboundMessages: Int? = null
        var outboundStallMs: Long? = null
        var openai: OpenAiOptions? = null
        var workspaceToolsDir: String? = null
        var rolloutKey: ByteArray? = null
        var acceptUnanchored: Boolean? = null
        var profile: ServerProfile? = null

        fun store(v: StoreKind?) = apply { store = v }
        fun durability(v: Durability?) = apply { durability = v }
        fun policy(v: ApprovalPolicy?) = apply { policy = v }
        fun workspace(v: String?) = apply { workspace = v }
        fun scriptJson(v: String?) = apply { scriptJson = v }
        fun approvalTimeoutMs(v: Long?) = apply { approvalTimeoutMs = v }
        fun settleDeadlineMs(v: Long?) = apply { settleDeadlineMs = v }
        fun maxLineBytes(v: Long?) = apply { maxLineBytes = v }
        fun inboundMessages(v: Int?) = apply { inboundMessages = v }
        fun outboundMessages(v: Int?) = apply { outboundMessages = v }
        fun outboundStallMs(v: Long?) = apply { outboundStallMs = v }
        fun openai(v: OpenAiOptions?) = apply { openai = v }
        fun workspaceToolsDir(v: String?) = apply { workspaceToolsDir = v }
        fun rolloutKey(v: ByteArray?) = apply { rolloutKey = v }
        fun acceptUnanchored(v: Boolean?) = apply { acceptUnanchored = v }
        fun profile(v: ServerProfile?) = apply { profile = v }

        fun build() = ServerOptions(
            store, durability, policy, workspace, scriptJson, approvalTimeoutMs, settleDeadlineMs,
            maxLineBytes, inboundMessages, outboundMessages, outboundStallMs, openai,
            workspaceToolsDir, rolloutKey, acceptUnanchored, profile,
        )
    }

    internal fun toNative(stateDir: String) = NativeServerOptions(
        stateDir = stateDir, store = store?.toNative(), durability = durability?.toNative(),
        policy = policy?.toNative(), workspace = workspace, scriptJson = scriptJson,
        approvalTimeoutMs = approvalTimeoutMs, settleDeadlineMs = settleDeadlineMs,
        maxLineBytes = maxLineBytes, inboundMessages = inboundMessages,
        outboundMessages = outboundMessages, outboundStallMs = outboundStallMs,
        openai = openai?.toNative(), workspaceToolsDir = workspaceToolsDir,
        rolloutKey = rolloutKey, acceptUnanchored = acceptUnanchored, profile = profile?.toNative(),
    )

    companion object {
        /** A Java-friendly builder: `ServerOptions.builder().policy(ApprovalPolicy.AUTO_APPROVE).build()`. */
        @JvmStatic
        fun builder(): Builder = Builder()
    }
}

/** Approvals that failed closed (the tool did not run), by reason. */
data class FailedClosedStats(
    val noHandler: Long,
    val handlerError: Long,
    val timeout: Long,
    val expired: Long,
    val bindingMismatch: Long,
    val nonceReused: Long,
    val unknownDecision: Long,
    val transportClosed: Long,
)

/** The engine's counters as a host sees them ([AppServer.stats]). */
data class ServerStats(
    /** Tools actually executed (only ever after a valid approval or an auto-approve policy). */
    val toolsExecuted: Long,
    /** Responses from a host that matched no pending server request (late, duplicate, unknown). */
    val ignoredResponses: Long,
    /** Connections closed because their host stopped reading. */
    val closedSlowConsumers: Long,
    /** Listener callbacks (this process, every server) that raised; delivery went on. */
    val listenerErrors: Long,
    /** Log records dropped because the log listener fell behind (this process). */
    val droppedLogRecords: Long,
    val connectionsOpen: Long,
    val connectionsRefused: Long,
    val turnsRunning: Long,
    val turnsQueued: Long,
    val turnsRefusedOverloaded: Long,
    val runnerThreads: Long,
    val inboundQueued: Long,
    val outboundQueued: Long,
    /** Events the store could not write (disk full, I/O error). */
    val recordingFailures: Long,
    val threadsLoaded: Long,
    val storeIndexedThreads: Long,
    val storeLoadedThreads: Long,
    val tailCacheBytes: Long,
    val pipelineWaits: Long,
    val danglingTurnsClosed: Long,
    val failedClosed: FailedClosedStats,
) {
    internal companion object {
        fun of(s: NativeStats) = ServerStats(
            s.toolsExecuted, s.ignoredResponses, s.closedSlowConsumers, s.listenerErrors,
            s.droppedLogRecords, s.connectionsOpen, s.connectionsRefused, s.turnsRunning,
            s.turnsQueued, s.turnsRefusedOverloaded, s.runnerThreads, s.inboundQueued,
            s.outboundQueued, s.recordingFailures, s.threadsLoaded, s.storeIndexedThreads,
            s.storeLoadedThreads, s.tailCacheBytes, s.pipelineWaits, s.danglingTurnsClosed,
            failed(s.failedClosed),
        )

        private fun failed(f: NativeFailedClosed) = FailedClosedStats(
            f.noHandler, f.handlerError, f.timeout, f.expired, f.bindingMismatch, f.nonceReused,
            f.unknownDecision, f.transportClosed,
        )
    }
}
