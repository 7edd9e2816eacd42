// Kotlin-implemented agent kernels and tool executors. The engine calls them on its own threads;
// the adapters here run the suspend functions there, turn an interrupt into coroutine
// cancellation, and map exceptions onto the boundary's error types (a kernel's failure fails the
// turn; a tool's failure becomes the tool's `error` result).
package com.chainlesschain.appserver

import com.chainlesschain.appserver.ffi.KernelException
import com.chainlesschain.appserver.ffi.TurnContext
import com.chainlesschain.appserver.protocol.AgentMessageItem
import com.chainlesschain.appserver.protocol.ItemContent
import com.chainlesschain.appserver.protocol.ItemDelta
import com.chainlesschain.appserver.protocol.ProtocolJson
import com.chainlesschain.appserver.protocol.TextDelta
import com.chainlesschain.appserver.protocol.ToolResult
import kotlinx.coroutines.CancellationException
import kotlinx.coroutines.async
import kotlinx.coroutines.delay
import kotlinx.coroutines.isActive
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import org.json.JSONObject
import com.chainlesschain.appserver.ffi.AgentKernel as NativeKernel
import com.chainlesschain.appserver.ffi.ToolExecutor as NativeTools
import com.chainlesschain.appserver.ffi.TurnInput as NativeInput

/**
 * Runs one turn: emit items through [Turn], ask for tools with [Turn.requestTool] (which passes the
 * approval gate), return when done. Called on an engine thread. An interrupt cancels the
 * coroutine (so `delay` and other suspension points stop it); throwing fails the turn with the
 * exception's message.
 */
fun interface AgentKernel {
    suspend fun runTurn(turn: Turn, input: TurnInput)
}

/** What the user sent for this turn: all text inputs joined, and the wire `UserInput` array. */
data class TurnInput(val text: String, val json: String)

/** Runs an approved tool call; the returned org.json value (or `null`) is the tool's output. */
fun interface ToolExecutor {
    suspend fun execute(threadId: String, tool: String, arguments: Any): Any?
}

/** The engine's side of one running turn; valid only while [AgentKernel.runTurn] runs. */
class Turn internal constructor(private val ctx: TurnContext) {
    val threadId: String = ctx.threadId()
    val turnId: String = ctx.turnId()

    /** The thread's `agentOptions` (an org.json value, `JSONObject.NULL` when none were given). */
    val agentOptions: Any get() = ProtocolJson.parse(kernelCall { ctx.agentOptionsJson() })

    /** True once the turn has been asked to stop. */
    val isCancelled: Boolean get() = ctx.isCancelled()

    fun newItemId(): String = kernelCall { ctx.newItemId() }

    /**
     * Records and announces `item/started`. [item] is the item's body ([ItemContent.AgentMessage],
     * [ItemContent.ToolCall], …); clients receive it as the `content` of the published `Item`
     * envelope (kind, status, data policy, times) the engine builds around it.
     */
    fun itemStarted(item: ItemContent) = kernelCall { ctx.itemStarted(item.toJson().toString()) }

    fun itemDelta(itemId: String, delta: ItemDelta) = kernelCall { ctx.itemDelta(itemId, delta.toJson().toString()) }

    /** Records and announces `item/completed`: the item's final body (see [itemStarted]). */
    fun itemCompleted(item: ItemContent) = kernelCall { ctx.itemCompleted(item.toJson().toString()) }

    /**
     * Asks for a tool through the approval gate and waits for the decision and the run. Returns the
     * wire result ([ToolResult.Denied] when the gate failed closed). Throws [CancellationException]
     * when the user cancelled at the approval or the turn was interrupted.
     */
    fun requestTool(itemId: String, tool: String, arguments: Any): ToolResult {
        val text = kernelCall { ctx.requestTool(itemId, tool, ProtocolJson.encode(arguments)) }
        return decoding("tool result") { ToolResult.fromJson(ProtocolJson.parse(text)) }
    }

    /** Streams [text] as one agent message: item started, one delta, item completed. */
    fun say(text: String) {
        val id = newItemId()
        itemStarted(ItemContent.AgentMessage(AgentMessageItem(id, "")))
        itemDelta(id, ItemDelta.Text(TextDelta(text)))
        itemCompleted(ItemContent.AgentMessage(AgentMessageItem(id, text)))
    }

    private inline fun <T> kernelCall(block: () -> T): T = try {
        block()
    } catch (e: KernelException.Cancelled) {
        throw CancellationException("the turn was cancelled")
    } catch (e: KernelException.Expired) {
        throw IllegalStateException("this Turn belongs to a turn whose runTurn has returned")
    } catch (e: KernelException.Invalid) {
        throw IllegalArgumentException(e.reason)
    } catch (e: KernelException.Failed) {
        throw IllegalStateException(e.reason)
    }
}

/** How often an adapter looks for an interrupt while the kernel coroutine is suspended. */
private const val CANCEL_POLL_MS = 10L

internal class KernelAdapter(private val kernel: AgentKernel) : NativeKernel {
    override fun runTurn(ctx: TurnContext, input: NativeInput) {
        val turn = Turn(ctx)
        runBlocking {
            val work = async { kernel.runTurn(turn, TurnInput(input.text, input.json)) }
            val watcher = launch {
                while (isActive && work.isActive) {
                    if (ctx.isCancelled()) work.cancel(CancellationException("turn interrupted"))
                    delay(CANCEL_POLL_MS)
                }
            }
            try {
                work.await()
            } catch (e: CancellationException) {
                throw KernelException.Cancelled()
            } catch (e: KernelException) {
                throw e
            } catch (e: Exception) {
                throw kernelFailure(e)
            } finally {
                watcher.cancel()
            }
        }
    }
}

internal class ToolAdapter(private val tools: ToolExecutor) : NativeTools {
    override fun execute(threadId: String, tool: String, argumentsJson: String): String = try {
        val output = runBlocking { tools.execute(threadId, tool, ProtocolJson.parse(argumentsJson)) }
        ProtocolJson.encode(output ?: JSONObject.NULL)
    } catch (e: Exception) {
        throw handlerFailure(e)
    }
}
