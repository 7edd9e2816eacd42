// Where the server lives in a JetBrains plugin: one AppServer per open project, its state under
// the IDE's system directory (so it survives restarts and never lands in the user's repository),
// closed when the project is disposed. Written against two tiny stand-ins for the IntelliJ
// Platform types it needs (ProjectLike, DisposableLike) so it builds and runs without the
// IntelliJ SDK; README.md shows the three lines that change in a real plugin.
package com.example.ccplugin

import com.chainlesschain.appserver.AppServer
import com.chainlesschain.appserver.ApprovalPolicy
import com.chainlesschain.appserver.Client
import com.chainlesschain.appserver.Decision
import com.chainlesschain.appserver.ServerOptions
import com.chainlesschain.appserver.protocol.ServerNotification
import kotlinx.coroutines.CoroutineScope
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.SupervisorJob
import kotlinx.coroutines.cancel
import kotlinx.coroutines.flow.Flow
import java.nio.file.Path

/** In a plugin: `com.intellij.openapi.project.Project` (name, locationHash, basePath). */
interface ProjectLike {
    val name: String
    val locationHash: String
    val basePath: String
}

/** In a plugin: `com.intellij.openapi.Disposable`. */
interface DisposableLike {
    fun dispose()
}

/**
 * In a plugin: `@Service(Service.Level.PROJECT) class AgentProjectService(project: Project,
 * scope: CoroutineScope) : Disposable`, registered by the annotation (or plugin.xml), created
 * on first `project.service<AgentProjectService>()`, disposed with the project.
 */
class AgentProjectService(
    private val project: ProjectLike,
    /** In a plugin: `PathManager.getSystemDir()`. */
    ideSystemDir: Path,
    /** In a plugin: the service's injected scope (cancelled on dispose). */
    private val scope: CoroutineScope = CoroutineScope(SupervisorJob() + Dispatchers.Default),
) : DisposableLike {
    /** One state directory per project, keyed like the IDE's own caches. */
    val stateDir: Path = ideSystemDir.resolve("cc-app-server").resolve(project.name + "." + project.locationHash)

    private val server: AppServer by lazy {
        AppServer.open(
            stateDir,
            // Approvals are bound to the project root: a grant never carries over to another project.
            ServerOptions(policy = ApprovalPolicy.ASK_EVERY_TIME, workspace = project.basePath),
        )
    }

    /** The project's client; approvals go to [askUser] (a dialog on the EDT in a plugin). */
    val client: Client by lazy {
        server.client(approvals = { request ->
            if (request.bindingMatches(ApprovalPolicy.ASK_EVERY_TIME, project.basePath) && askUser(request.tool, request.argumentsJson)) {
                Decision.AcceptOnce
            } else {
                Decision.Decline("declined in the IDE")
            }
        })
    }

    /** Collect in the service scope (tool window, notifications balloon…). */
    fun events(): Flow<ServerNotification> = client.notifications()

    /** In a plugin: `withContext(Dispatchers.EDT) { MessageDialogBuilder.yesNo(…).ask(project) }`. */
    var askUser: suspend (tool: String, argumentsJson: String) -> Boolean = { _, _ -> false }

    @Volatile var disposed = false
        private set

    override fun dispose() {
        scope.cancel()
        // Order matters only for tidiness: closing the server also closes its clients.
        runCatching { client.close() }
        server.close()
        disposed = true
    }
}
