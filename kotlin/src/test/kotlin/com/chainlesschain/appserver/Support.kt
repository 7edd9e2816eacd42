// Shared helpers for the JVM tests: temporary state directories, scripts for the built-in
// scripted kernel, and ways to wait for notifications without sleeping.
package com.chainlesschain.appserver

import com.chainlesschain.appserver.protocol.ServerNotification
import com.chainlesschain.appserver.protocol.Turn
import com.chainlesschain.appserver.protocol.TurnError
import kotlinx.coroutines.flow.first
import kotlinx.coroutines.withTimeout
import org.json.JSONArray
import org.json.JSONObject
import java.nio.file.Files
import java.nio.file.Path
import java.util.logging.Handler
import java.util.logging.LogRecord
import java.util.logging.Logger

const val WAIT_MS = 30_000L

/** Every temporary directory the tests made, removed when the test JVM exits. */
private val tempDirs = java.util.concurrent.ConcurrentLinkedQueue<Path>().also { dirs ->
    Runtime.getRuntime().addShutdownHook(Thread { dirs.forEach { it.toFile().deleteRecursively() } })
}

fun tempStateDir(): Path = Files.createTempDirectory("cc-jvm-test").also { tempDirs.add(it) }.resolve("state")

/** A script for the scripted kernel: each step a JSON object. */
fun script(vararg steps: String): JSONObject = JSONObject().put("steps", JSONArray(steps.map { JSONObject(it) }))

val TOOL_STEP = """{"type":"tool","tool":"fs.write","arguments":{"path":"a.txt","text":"x"}}"""
fun messageStep(text: String, chunks: Int = 1) = """{"type":"message","text":"$text","chunks":$chunks}"""
fun sleepStep(ms: Long) = """{"type":"sleep","ms":$ms}"""

fun scriptOptions(script: JSONObject) =
    com.chainlesschain.appserver.protocol.AgentOptions(script = script)

/** Collects notifications until [stop] matches one; returns all seen, the match last. */
suspend fun Client.collectUntil(stop: (ServerNotification) -> Boolean): List<ServerNotification> {
    val seen = mutableListOf<ServerNotification>()
    withTimeout(WAIT_MS) {
        notifications().first {
            seen.add(it)
            stop(it)
        }
    }
    return seen
}

fun completedTurn(n: ServerNotification): Turn? = (n as? ServerNotification.TurnCompleted)?.value?.params?.turn

/** Why a completed turn failed or was interrupted: `turn/completed` carries it beside the turn. */
fun turnError(n: ServerNotification): TurnError? = (n as? ServerNotification.TurnCompleted)?.value?.params?.error

/** Starts a thread with [script] and one turn; returns the turn id. */
suspend fun Client.startScripted(threadId: String, script: JSONObject, text: String = "go"): String {
    threadStart(threadId = threadId, agentOptions = scriptOptions(script))
    return turnStart(threadId, text).turn.id
}

/** Captures java.util.logging records of one logger (and its children) while installed. */
class CapturedLogs(name: String) : Handler(), AutoCloseable {
    private val logger = Logger.getLogger(name)
    val records: MutableList<LogRecord> = java.util.Collections.synchronizedList(mutableListOf())

    init {
        logger.addHandler(this)
    }

    override fun publish(record: LogRecord) {
        records.add(record)
    }

    override fun flush() {}

    override fun close() {
        logger.removeHandler(this)
    }

    fun messages(): List<String> = synchronized(records) { records.map { it.message } }

    fun awaitMessage(contains: String, timeoutMs: Long = 10_000): String {
        val deadline = System.nanoTime() + timeoutMs * 1_000_000
        while (System.nanoTime() < deadline) {
            messages().firstOrNull { it.contains(contains) }?.let { return it }
            Thread.sleep(10)
        }
        throw AssertionError("no log record containing '$contains' in ${messages()}")
    }
}
