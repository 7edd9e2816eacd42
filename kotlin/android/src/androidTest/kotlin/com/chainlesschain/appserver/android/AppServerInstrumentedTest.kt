// On a device or emulator: the AAR's native library loads for the device's ABI, a server opens
// under the app's files dir, and a scripted turn with an approval completes through the Flow.
package com.chainlesschain.appserver.android

import androidx.test.ext.junit.runners.AndroidJUnit4
import androidx.test.platform.app.InstrumentationRegistry
import com.chainlesschain.appserver.AppServer
import com.chainlesschain.appserver.Decision
import com.chainlesschain.appserver.protocol.AgentOptions
import com.chainlesschain.appserver.protocol.ProtocolJson
import com.chainlesschain.appserver.protocol.ServerNotification
import com.chainlesschain.appserver.protocol.TurnStatus
import kotlinx.coroutines.flow.first
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import org.junit.Assert.assertEquals
import org.junit.Test
import org.junit.runner.RunWith
import java.io.File

@RunWith(AndroidJUnit4::class)
class AppServerInstrumentedTest {
    @Test
    fun aScriptedTurnWithAnApprovalCompletes() = runBlocking {
        val context = InstrumentationRegistry.getInstrumentation().targetContext
        val dir = File(context.filesDir, "cc-app-server-test-${System.nanoTime()}")
        val script = """{"steps":[{"type":"tool","tool":"fs.write","arguments":{"path":"a.txt","text":"x"}},
            {"type":"message","text":"done","chunks":2}]}"""
        AppServer.open(dir.path).use { server ->
            server.client(approvals = { Decision.AcceptOnce }).use { client ->
                client.threadStart(threadId = "android", agentOptions = AgentOptions(script = ProtocolJson.parse(script)))
                val turn = client.turnStart("android", "go").turn.id
                val done = withTimeout(30_000) {
                    client.notifications().first { it is ServerNotification.TurnCompleted } as ServerNotification.TurnCompleted
                }
                assertEquals(turn, done.value.params.turn.id)
                assertEquals(TurnStatus.Completed, done.value.params.turn.status)
                assertEquals(1L, server.stats().toolsExecuted)
            }
        }
        dir.deleteRecursively()
    }
}
