// Kotlin replay of the shared wire v1 fixtures against the generated bindings (JVM, org.json).
//
// Every file under schema/fixtures/valid must parse, decode with the generated types and re-encode
// to the same JSON (member order ignored, numbers by value); every file under schema/fixtures/invalid
// must be refused by the strict parser or by the generated decoders in conformance mode. The folder
// is the Rust verdict; any disagreement fails the run. Unit checks below pin the behaviours a host
// relies on (missing vs null vs present, Unknown kept, strict decisions refused, keyword members).
package com.chainlesschain.appserver.protocol.test

import com.chainlesschain.appserver.protocol.ApprovalDecision
import com.chainlesschain.appserver.protocol.DEFINITION_NAMES
import com.chainlesschain.appserver.protocol.DecodeMode
import com.chainlesschain.appserver.protocol.GraphEventParams
import com.chainlesschain.appserver.protocol.Item
import com.chainlesschain.appserver.protocol.ItemContent
import com.chainlesschain.appserver.protocol.ItemKind
import com.chainlesschain.appserver.protocol.ItemStatus
import com.chainlesschain.appserver.protocol.JsonField
import com.chainlesschain.appserver.protocol.ProtocolDecodeException
import com.chainlesschain.appserver.protocol.ProtocolJson
import com.chainlesschain.appserver.protocol.ProtocolMessage
import com.chainlesschain.appserver.protocol.SCHEMA_DIGEST
import com.chainlesschain.appserver.protocol.ServerNotification
import com.chainlesschain.appserver.protocol.ThreadListParams
import com.chainlesschain.appserver.protocol.AgentThread
import com.chainlesschain.appserver.protocol.ThreadStartParams
import com.chainlesschain.appserver.protocol.ToolCall
import com.chainlesschain.appserver.protocol.decodeMessage
import com.chainlesschain.appserver.protocol.roundtripDefinition
import org.json.JSONObject
import java.io.File
import kotlin.system.exitProcess

private var passed = 0
private val failures = ArrayList<String>()

private fun check(name: String, ok: Boolean, detail: () -> String = { "" }) {
    if (ok) passed++ else failures.add(name + ": " + detail())
}

private fun refused(block: () -> Unit): ProtocolDecodeException? = try {
    block()
    null
} catch (e: ProtocolDecodeException) {
    e
}

/** Decodes one fixture and encodes it again; throws ProtocolDecodeException when refused. */
private fun roundtrip(doc: Any, isDefinition: Boolean, mode: DecodeMode): Pair<Any, Any> {
    if (!isDefinition) return doc to decodeMessage(doc, mode).toJson()
    val wrapper = doc as? JSONObject ?: throw ProtocolDecodeException("", "a definition fixture is an object")
    if (wrapper.length() != 2 || !wrapper.has("definition") || !wrapper.has("value")) {
        throw ProtocolDecodeException("", "a definition fixture has exactly `definition` and `value`")
    }
    val name = wrapper.opt("definition") as? String ?: throw ProtocolDecodeException("/definition", "not a string")
    val value = wrapper.opt("value")
    val out = roundtripDefinition(name, value, mode)
        ?: throw ProtocolDecodeException("/definition", "no definition named $name in wire v1")
    return value to out
}

private fun replay(root: File) {
    for (folder in listOf("valid", "invalid")) {
        val files = File(root, folder).walkTopDown().filter { it.isFile && it.name.endsWith(".json") }
            .sortedBy { it.relativeTo(root).invariantSeparatorsPath }.toList()
        check("$folder/ has fixtures", files.isNotEmpty()) { "no files under " + File(root, folder) }
        for (f in files) {
            val rel = f.relativeTo(root).invariantSeparatorsPath
            val isDefinition = f.parentFile.name == "definitions"
            if (folder == "valid") {
                try {
                    val doc = ProtocolJson.parse(f.readBytes())
                    for (mode in DecodeMode.values()) {
                        val (input, output) = roundtrip(doc, isDefinition, mode)
                        // Through text as well: what goes on the wire must read back the same.
                        val reparsed = ProtocolJson.parse(ProtocolJson.encode(output))
                        check(rel, ProtocolJson.equal(input, output) && ProtocolJson.equal(input, reparsed)) {
                            "$mode round trip differs:\n  in:  " + ProtocolJson.encode(input) + "\n  out: " + ProtocolJson.encode(output)
                        }
                    }
                } catch (e: ProtocolDecodeException) {
                    check(rel, false) { "valid fixture refused: " + e.message }
                } catch (e: RuntimeException) {
                    check(rel, false) { "crashed: $e" }
                }
            } else {
                try {
                    val doc = ProtocolJson.parse(f.readBytes())
                    roundtrip(doc, isDefinition, DecodeMode.Conformance)
                    check(rel, false) { "invalid fixture accepted" }
                } catch (e: ProtocolDecodeException) {
                    check(rel, true)
                } catch (e: RuntimeException) {
                    check(rel, false) { "crashed instead of refusing: $e" }
                }
            }
        }
    }
}

private fun json(text: String): Any = ProtocolJson.parse(text)

private fun unitChecks() {
    // Missing vs null vs present stay three different things.
    val list = { params: String -> ThreadListParams.fromJson(json(params)) }
    check("cursor absent", list("{}").cursor == JsonField.Absent)
    check("cursor null", list("""{"cursor": null}""").cursor == JsonField.Null)
    check("cursor present", list("""{"cursor": "c1"}""").cursor == JsonField.Value("c1"))
    check("cursor absent stays absent", !list("{}").toJson().has("cursor"))
    check("cursor null stays null", list("""{"cursor": null}""").toJson().opt("cursor") === JSONObject.NULL)
    check("optional non-nullable refuses null", refused { ThreadStartParams.fromJson(json("""{"title": null}""")) } != null)

    // A display union keeps an unknown item content type in receive mode, and it survives a round trip.
    val raw = """{"type": "hologram", "id": "i1", "frames": 3}"""
    val content = ItemContent.fromJson(json(raw))
    check("unknown ItemContent kept", content is ItemContent.Unknown) { content.toString() }
    check("unknown ItemContent round trip", ProtocolJson.equal(content.toJson(), json(raw)))
    check("unknown ItemContent refused in conformance mode", refused { ItemContent.fromJson(json(raw), DecodeMode.Conformance) } != null)
    val status = ItemContent.fromJson(json("""{"type": "toolCall", "id": "i2", "call": {"tool": "t", "arguments": {}}, "status": "paused", "result": null}"""))
    check("unknown ItemStatus kept", status is ItemContent.ToolCall && status.value.status is ItemStatus.Unknown && status.value.status.wire == "paused") { status.toString() }

    // The published Item is a closed envelope around the content.
    val envelope = """{"id": "i2", "threadId": "th1", "turnId": "t1", "parentId": null, "kind": "assistant_message",
        "status": "completed", "content": {"type": "agentMessage", "id": "i2", "text": "hi"},
        "dataPolicy": {"origin": "kernel", "trust": "untrusted_content", "sensitivity": "internal", "allowedSinks": ["host", "rollout"]},
        "createdAt": "2026-01-01T00:00:00.000Z", "completedAt": "2026-01-01T00:00:01.000Z"}"""
    val item = Item.fromJson(json(envelope))
    check("Item envelope", item.kind == ItemKind.AssistantMessage && (item.content as? ItemContent.AgentMessage)?.value?.text == "hi") { item.toString() }
    check("Item envelope round trip", ProtocolJson.equal(item.toJson(), json(envelope)))
    check("Item envelope is closed", refused { Item.fromJson((json(envelope) as JSONObject).put("text", "hi")) }?.pointer == "/text")
    check("unknown content kept inside the envelope",
        Item.fromJson((json(envelope) as JSONObject).put("content", json(raw))).content is ItemContent.Unknown)

    // The published Thread is closed: archived, lastEventSeq and forkedFrom are gone.
    val thread = """{"id": "th1", "status": "archived", "title": null, "parentThreadId": null,
        "createdAt": "2026-01-01T00:00:00.000Z", "updatedAt": "2026-01-01T00:00:00.000Z", "revision": 7, "metadata": {}}"""
    check("Thread decodes", AgentThread.fromJson(json(thread)).revision == 7L)
    for (member in listOf("archived", "lastEventSeq", "forkedFrom")) {
        check("Thread refuses $member", refused { AgentThread.fromJson((json(thread) as JSONObject).put(member, JSONObject.NULL)) }?.pointer == "/$member")
    }

    val note = decodeMessage(json("""{"jsonrpc": "2.0", "method": "graph/updated", "params": {}}"""))
    check("unknown notification kept", note is ProtocolMessage.ServerNotificationMessage && note.value is ServerNotification.Unknown) { note.toString() }
    // Graph notifications are one method tagged by type; a future type is kept.
    val later = decodeMessage(json("""{"jsonrpc": "2.0", "method": "graph/event", "params": {"type": "futureThing", "runId": "r1"}}"""))
    check("unknown graph/event type kept", ((later as? ProtocolMessage.ServerNotificationMessage)?.value as? ServerNotification.GraphEvent)?.value?.params is GraphEventParams.Unknown) { later.toString() }

    // A security-sensitive union refuses an unknown value in every mode, and the old answer shape.
    for (mode in DecodeMode.values()) {
        val e = refused { ApprovalDecision.fromJson(json("""{"kind": "acceptAlways"}"""), mode) }
        check("unknown ApprovalDecision refused ($mode)", e != null && e.pointer == "/kind") { e?.message ?: "accepted" }
        check("old ApprovalDecision shape refused ($mode)", refused { ApprovalDecision.fromJson(json("""{"decision": "acceptOnce"}"""), mode) } != null)
    }
    check("known ApprovalDecision", ApprovalDecision.fromJson(json("""{"kind": "acceptOnce"}""")) is ApprovalDecision.AcceptOnce)

    // Keyword members survive: as free keys in a JsonValue, and refused as extra members of strict objects.
    val call = ToolCall.fromJson(json("""{"tool": "k", "arguments": {"class": 1, "fun": 2, "in": 3, "is": 4, "object": 5, "default": 6, "self": 7}}"""))
    check("keyword keys survive", ProtocolJson.equal(call.toJson(), json("""{"tool": "k", "arguments": {"class": 1, "fun": 2, "in": 3, "is": 4, "object": 5, "default": 6, "self": 7}}""")))
    check("keyword extra member refused on a strict object", refused { ToolCall.fromJson(json("""{"tool": "k", "arguments": 1, "class": "x"}""")) }?.pointer == "/class")

    // Strict JSON: what org.json alone would let through.
    check("trailing comma refused", refused { json("""{"a": 1,}""") } != null)
    check("single quotes refused", refused { json("{'a': 1}") } != null)
    check("lone surrogate refused", refused { json("\"\\ud800\"") } != null)
    check("integral float is an integer", ProtocolJson.equal(json("3.0"), json("3")))
    check("digest embedded", SCHEMA_DIGEST.startsWith("sha256:") && SCHEMA_DIGEST.length == 71)
    check("definitions listed in schema order", DEFINITION_NAMES.first() == "Identifier") { DEFINITION_NAMES.first() }
}

fun main(args: Array<String>) {
    val root = File(if (args.isNotEmpty()) args[0] else "schema/fixtures")
    unitChecks()
    replay(root)
    for (f in failures) println("FAIL $f")
    println("$passed passed, ${failures.size} failed")
    if (failures.isNotEmpty()) exitProcess(1)
}
