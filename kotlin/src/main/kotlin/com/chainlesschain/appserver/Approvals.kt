// Approvals as the SDK presents them: a request with its binding and parsed arguments, a decision
// type, and the adapter that runs a suspend handler under its own deadline and fails closed
// (declines, with a logged diagnostic) when the handler throws, is slow, or is absent.
package com.chainlesschain.appserver

import com.chainlesschain.appserver.ffi.BindingException
import com.chainlesschain.appserver.ffi.verifyApprovalBinding
import com.chainlesschain.appserver.protocol.ApprovalBinding
import com.chainlesschain.appserver.protocol.ApprovalRisk
import com.chainlesschain.appserver.protocol.ProtocolJson
import kotlinx.coroutines.CoroutineDispatcher
import kotlinx.coroutines.CoroutineScope
import kotlinx.coroutines.SupervisorJob
import kotlinx.coroutines.async
import kotlinx.coroutines.TimeoutCancellationException
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import java.util.logging.Level
import java.util.logging.Logger
import com.chainlesschain.appserver.ffi.ApprovalDecision as NativeDecision
import com.chainlesschain.appserver.ffi.ApprovalHandler as NativeHandler
import com.chainlesschain.appserver.ffi.ApprovalRequest as NativeRequest
import com.chainlesschain.appserver.protocol.ApprovalRequest as PublishedRequest

/** The host's answer to an approval request. */
sealed class Decision {
    /** Run this one call. */
    data object AcceptOnce : Decision()

    /** Run it, and the same operation again for the rest of this turn. */
    data object AcceptForTurn : Decision()

    /** Run it, and the same operation again on this connection while policy and workspace hold. */
    data object AcceptForSession : Decision()

    /** Do not run it; the turn goes on. */
    data class Decline(val reason: String? = null) : Decision()

    /** Do not run it and interrupt the turn. */
    data object Cancel : Decision()

    internal fun toNative(): NativeDecision = when (this) {
        AcceptOnce -> NativeDecision.AcceptOnce
        AcceptForTurn -> NativeDecision.AcceptForTurn
        AcceptForSession -> NativeDecision.AcceptForSession
        is Decline -> NativeDecision.Decline(reason)
        Cancel -> NativeDecision.Cancel
    }

    /** Static factories for Java callers (`Decision.acceptOnce()`). */
    companion object {
        @JvmStatic fun acceptOnce(): Decision = AcceptOnce
        @JvmStatic fun acceptForTurn(): Decision = AcceptForTurn
        @JvmStatic fun acceptForSession(): Decision = AcceptForSession
        @JvmStatic @JvmOverloads fun decline(reason: String? = null): Decision = Decline(reason)
        @JvmStatic fun cancel(): Decision = Cancel
    }
}

/**
 * One `approval/decide` request: which tool with which arguments, how risky, why, and the binding
 * the decision will be tied to (thread, turn, item, digests, nonce, expiry). [published] is the
 * whole request as the wire carries it (the published v1 `ApprovalRequest`).
 */
class ApprovalRequest internal constructor(internal val native: NativeRequest) {
    /** The request as sent: the published `ApprovalRequest` `{id, binding, operation, risk, reason}`. */
    val published: PublishedRequest by lazy {
        decoding("approval request") { PublishedRequest.fromJson(ProtocolJson.parse(native.paramsJson)) }
    }

    /** The request's id (`approval-` + the binding's nonce). */
    val id: String get() = published.id

    /** How much harm the operation could do: read-only tools low, workspace writes medium, commands high. */
    val risk: ApprovalRisk get() = published.risk

    val threadId: String get() = native.binding.threadId
    val turnId: String get() = native.binding.turnId
    val itemId: String get() = native.binding.itemId
    val tool: String get() = native.tool

    /** The tool's arguments as JSON text. */
    val argumentsJson: String get() = native.argumentsJson

    /** The tool's arguments parsed (an org.json value: usually a `JSONObject`). */
    val arguments: Any get() = ProtocolJson.parse(native.argumentsJson)

    /** Why the kernel wants it (the server always says; `"<tool> wants to run"` when the kernel did not). */
    val reason: String? get() = native.reason
    /** What the decision is bound to (thread, turn, item, digests, nonce, expiry): the published `ApprovalBinding`. */
    val binding: ApprovalBinding get() = published.binding

    /** The whole request params as JSON text (what the binding was computed over). */
    val paramsJson: String get() = native.paramsJson

    /**
     * Checks that the binding is about exactly this operation, under the policy and workspace the
     * host believes are in force, and has not expired. A host that shows a prompt calls this first
     * and declines on `false`.
     */
    fun bindingMatches(policy: ApprovalPolicy, workspace: String): Boolean = try {
        verifyApprovalBinding(native, policy.toNative(), workspace)
        true
    } catch (_: BindingException) {
        false
    }

    override fun toString(): String = "ApprovalRequest(tool=$tool, item=$itemId, turn=$turnId)"
}

/** Decides approvals. A suspend function: it may show UI and wait, within the client's deadline. */
fun interface ApprovalHandler {
    suspend fun decide(request: ApprovalRequest): Decision
}

internal val approvalLog: Logger = Logger.getLogger("com.chainlesschain.appserver.approval")

/**
 * The handler of a client opened without one: every approval is declined, with a WARNING saying
 * which tool was refused, so a host that forgot its handler finds out from its log rather than
 * from tools that silently never run.
 */
internal object NoApprovalHandler : NativeHandler {
    const val REASON = "no approval handler is configured on this client"

    override fun decide(request: NativeRequest): NativeDecision {
        approvalLog.warning(
            "approval requested for ${request.tool} (item ${request.binding.itemId}) on a client " +
                "opened without an approval handler; declined (fail closed). Pass one to AppServer.client(approvals = …)",
        )
        return NativeDecision.Decline(REASON)
    }
}

/**
 * The uniffi handler the Rust client calls on its own thread: runs [handler] with a deadline of
 * [deadlineMs]; anything but a decision in time is a decline, logged at WARNING, whose reason says
 * why (the server records it, and the denied tool result carries it as "approval declined: …").
 * The Rust client's own approval timeout is set a little longer, so this one decides first.
 */
internal class SuspendingApprovalHandler(
    private val handler: ApprovalHandler,
    private val deadlineMs: Long,
    private val dispatcher: CoroutineDispatcher,
) : NativeHandler {
    override fun decide(request: NativeRequest): NativeDecision {
        val sdkRequest = ApprovalRequest(request)
        // The handler runs as its own job, so the deadline holds even for a handler that blocks
        // and ignores cancellation: awaiting it is cancellable, the handler itself need not be.
        val decision = handlerScope.async(dispatcher) { handler.decide(sdkRequest) }
        return try {
            runBlocking { withTimeout(deadlineMs) { decision.await() } }.toNative()
        } catch (e: TimeoutCancellationException) {
            approvalLog.warning(
                "approval handler took longer than $deadlineMs ms for ${request.tool} " +
                    "(item ${request.binding.itemId}); declined (fail closed)",
            )
            NativeDecision.Decline("the approval handler did not answer within $deadlineMs ms")
        } catch (e: Throwable) {
            if (e is Error && e !is StackOverflowError) throw e
            approvalLog.log(
                Level.WARNING,
                "approval handler threw for ${request.tool} (item ${request.binding.itemId}); " +
                    "declined (fail closed)",
                e,
            )
            NativeDecision.Decline("the approval handler failed: ${describe(e)}".take(MAX_REASON))
        } finally {
            decision.cancel()
        }
    }

    private companion object {
        val handlerScope = CoroutineScope(SupervisorJob())

        /** The engine's bound for a decline reason it shows the kernel (ShortText, less the prefix). */
        const val MAX_REASON = 1000
    }
}
