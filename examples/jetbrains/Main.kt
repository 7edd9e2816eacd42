// Simulates the IDE lifecycle around AgentProjectService: two projects open (two servers, two
// state dirs under the "system dir"), one runs a turn whose tool the user approves, both are
// disposed. scripts/test-jvm.sh runs this from the jar on a plain classpath.
package com.example.ccplugin

import com.chainlesschain.appserver.protocol.AgentOptions
import com.chainlesschain.appserver.protocol.ProtocolJson
import com.chainlesschain.appserver.protocol.ServerNotification
import kotlinx.coroutines.flow.first
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import java.nio.file.Files

fun main(): Unit = runBlocking {
    val systemDir = Files.createTempDirectory("idea-system")
    val projects = listOf("alpha", "beta").map { name ->
        object : ProjectLike {
            override val name = name
            override val locationHash = Integer.toHexString(name.hashCode())
            override val basePath = "/work/$name"
        }
    }
    val services = projects.map { AgentProjectService(it, systemDir) }
    val alpha = services[0]
    alpha.askUser = { tool, _ -> tool == "fs.write" }
    val script = """{"steps":[{"type":"tool","tool":"fs.write","arguments":{"path":"a.txt","text":"x"}},{"type":"message","text":"written","chunks":1}]}"""
    alpha.client.threadStart(threadId = "ide", agentOptions = AgentOptions(script = ProtocolJson.parse(script)))
    alpha.client.turnStart("ide", "write a.txt")
    val done = withTimeout(30_000) { alpha.events().first { it is ServerNotification.TurnCompleted } } as ServerNotification.TurnCompleted
    println("alpha turn ${done.value.params.turn.status.wire}; state in ${systemDir.relativize(alpha.stateDir)}")
    println("beta threads: ${services[1].client.threadList().threads.size}")
    services.forEach { it.dispose() }
    println("disposed: ${services.all { it.disposed }}")
    systemDir.toFile().deleteRecursively()
}
