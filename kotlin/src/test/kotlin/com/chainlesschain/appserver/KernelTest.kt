// A Kotlin-implemented kernel and tool executor driving real turns: items, a tool through the
// approval gate, failures, interrupt as coroutine cancellation, and the context's lifetime.
package com.chainlesschain.appserver

import com.chainlesschain.appserver.protocol.ItemContent
import com.chainlesschain.appserver.protocol.ItemKind
import com.chainlesschain.appserver.protocol.ItemPhase
import com.chainlesschain.appserver.protocol.ItemStatus
import com.chainlesschain.appserver.protocol.ServerNotification
import com.chainlesschain.appserver.protocol.ToolCall
import com.chainlesschain.appserver.protocol.ToolCallItem
import com.chainlesschain.appserver.protocol.ToolResult
import com.chainlesschain.appserver.protocol.TurnStatus
import kotlinx.coroutines.CancellationException
import kotlinx.coroutines.delay
import kotlinx.coroutines.runBlocking
import org.json.JSONObject
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.assertThrows
import java.util.Collections
import java.util.concurrent.atomic.AtomicBoolean
import java.util.concurrent.atomic.AtomicReference

class KernelTest {
    private val toolCalls = Collections.synchronizedList(mutableListOf<Triple<String, String, String>>())
    private val kept = AtomicReference<Turn>()
    private val sawCancellation = AtomicBoolean()

    private val tools = ToolExecutor { threadId, tool, arguments ->
        toolCalls += Triple(threadId, tool, arguments.toString())
        val args = arguments as JSONObject
        when (tool) {
            "kt.add" -> JSONObject().put("sum", args.getInt("a") + args.getInt("b"))
            else -> throw IllegalArgumentException("unknown tool $tool")
        }
    }

    private val kernel = AgentKernel { turn, input ->
        kept.set(turn)
        when (input.text) {
            "fail" -> throw IllegalStateException("kotlin kernel says no")
            "wait" -> try {
                turn.say("waiting")
                delay(60_000)
            } catch (e: CancellationException) {
                sawCancellation.set(true)
                throw e
            }
            else -> {
                assertEquals("kt", (turn.agentOptions as JSONObject).getString("mode"))
                assertThrows<IllegalArgumentException> {
                    turn.itemDelta("nope", com.chainlesschain.appserver.protocol.ItemDelta.Unknown(JSONObject().put("type", "bogus")))
                }
                val id = turn.newItemId()
                val call = ToolCall(input.text, JSONObject().put("a", 2).put("b", 3))
                turn.itemStarted(ItemContent.ToolCall(ToolCallItem(id, call, ItemStatus.InProgress, null)))
                val result = turn.requestTool(id, call.tool, call.arguments)
                val status = if (result is ToolResult.Ok) ItemStatus.Completed else ItemStatus.Failed
                turn.itemCompleted(ItemContent.ToolCall(ToolCallItem(id, call, status, result)))
                val answer = when (result) {
                    is ToolResult.Ok -> "sum=" + (result.value.output as JSONObject).getInt("sum")
                    is ToolResult.Error -> "error=" + result.value.message
                    is ToolResult.Denied -> "denied"
                }
                turn.say(answer)
            }
        }
    }

    private fun Client.turn(text: String): Pair<TurnStatus, List<ServerNotification>> = runBlocking {
        val id = turnStart("k", text).turn.id
        val seen = collectUntil { completedTurn(it)?.id == id }
        completedTurn(seen.last())!!.status to seen
    }

    private fun said(seen: List<ServerNotification>): List<String> = seen.mapNotNull {
        ((it as? ServerNotification.ItemCompleted)?.value?.params?.item?.content as? ItemContent.AgentMessage)?.value?.text
    }

    @Test
    fun `a kotlin kernel runs a tool through the gate and a kotlin tool executor`() = runBlocking {
        val options = ServerOptions(policy = ApprovalPolicy.AUTO_APPROVE)
        AppServer.open(tempStateDir(), options, kernel, tools).use { server ->
            server.client().use { client ->
                client.threadStart(threadId = "k", agentOptions = com.chainlesschain.appserver.protocol.AgentOptions(extra = mapOf("mode" to "kt")))
                val (status, seen) = client.turn("kt.add")
                assertEquals(TurnStatus.Completed, status)
                assertEquals(listOf("sum=5"), said(seen))
                assertEquals(listOf(Triple("k", "kt.add", """{"a":2,"b":3}""")), toolCalls.toList())
                assertTrue(seen.any { it is ServerNotification.ToolResult })
                // The kernel reported bodies; clients get each inside the published Item envelope.
                val items = seen.mapNotNull {
                    (it as? ServerNotification.ItemStarted)?.value?.params?.item
                        ?: (it as? ServerNotification.ItemCompleted)?.value?.params?.item
                }
                assertEquals(
                    listOf(
                        ItemKind.Tool to ItemPhase.Started, ItemKind.Tool to ItemPhase.Completed,
                        ItemKind.AssistantMessage to ItemPhase.Started, ItemKind.AssistantMessage to ItemPhase.Completed,
                    ),
                    items.map { it.kind to it.status },
                )
                assertTrue(items.all { it.threadId == "k" && (it.content is ItemContent.ToolCall || it.content is ItemContent.AgentMessage) })
                assertTrue(items.last().completedAt != null && items.first().completedAt == null)

                // A throwing tool becomes the tool's error result; the turn goes on.
                val (status2, seen2) = client.turn("kt.unknown")
                assertEquals(TurnStatus.Completed, status2)
                assertEquals(listOf("error=IllegalArgumentException: unknown tool kt.unknown"), said(seen2))

                // A throwing kernel fails the turn with its message.
                val (failed, seen3) = client.turn("fail")
                assertEquals(TurnStatus.Failed, failed)
                // Why it failed travels beside the (published, closed) Turn.
                assertTrue("kotlin kernel says no" in turnError(seen3.last())!!.message)
                assertEquals("failed", completedTurn(seen3.last())!!.terminalEvidence!!.status)

                // The turn object refuses use after runTurn returned.
                val old = kept.get()
                assertTrue(old.isCancelled)
                assertThrows<IllegalStateException> { old.newItemId() }
                assertEquals(2L, server.stats().toolsExecuted)
            }
        }
    }

    @Test
    fun `an interrupt cancels the kernel coroutine`() = runBlocking {
        AppServer.open(tempStateDir(), ServerOptions(), kernel, tools).use { server ->
            server.client().use { client ->
                client.threadStart(threadId = "k")
                val id = client.turnStart("k", "wait").turn.id
                client.collectUntil { it is ServerNotification.ItemCompleted }
                val started = System.nanoTime()
                val result = client.turnInterrupt("k", id)
                assertTrue((System.nanoTime() - started) / 1_000_000 < 5_000)
                assertTrue(result.physicallySettled)
                assertEquals(TurnStatus.Interrupted, result.turn.status)
                assertEquals("cancelled", result.turn.terminalEvidence?.status)
                assertTrue(sawCancellation.get())
            }
        }
    }

    @Test
    fun `tools are denied without approval under the default policy`() = runBlocking {
        AppServer.open(tempStateDir(), ServerOptions(), kernel, tools).use { server ->
            server.client().use { client ->
                client.threadStart(threadId = "k", agentOptions = com.chainlesschain.appserver.protocol.AgentOptions(extra = mapOf("mode" to "kt")))
                val (status, seen) = client.turn("kt.add")
                assertEquals(TurnStatus.Completed, status)
                assertEquals(listOf("denied"), said(seen))
                assertTrue(toolCalls.isEmpty())
            }
        }
    }
}
