// Gates on what a Java caller sees and on the native log bridge: no mangled (inline-class, e.g.
// ULong) method names anywhere in the public API of the SDK or the uniffi glue, the renamed
// `close` methods, the natives loaded from the jar's resources, and engine logs reaching JUL.
package com.chainlesschain.appserver

import com.chainlesschain.appserver.ffi.ListenerException
import com.chainlesschain.appserver.ffi.NotificationListener
import com.chainlesschain.appserver.ffi.libraryVersion
import com.chainlesschain.appserver.ffi.protocolVersion
import com.chainlesschain.appserver.ffi.schemaDigest
import kotlinx.coroutines.runBlocking
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.io.File
import java.lang.reflect.Modifier
import java.util.logging.Level
import java.util.zip.ZipFile
import com.chainlesschain.appserver.ffi.Client as NativeClient

class SurfaceTest {
    /** Every class of the main output (classes dir or jar), by binary name. */
    private fun mainClasses(): List<String> {
        val root = File(AppServer::class.java.protectionDomain.codeSource.location.toURI())
        val names = if (root.isDirectory) {
            root.walkTopDown().filter { it.name.endsWith(".class") }.map { it.relativeTo(root).path }.toList()
        } else {
            ZipFile(root).use { z -> z.entries().asSequence().map { it.name }.filter { it.endsWith(".class") }.toList() }
        }
        return names.map { it.removeSuffix(".class").replace(File.separatorChar, '.').replace('/', '.') }
    }

    /** Internal machinery of the generated glue (FFI converters, buffers, vtables) is not API. */
    private fun isGlueInternal(simpleName: String) = listOf("FfiConverter", "Uniffi", "RustBuffer", "ForeignBytes", "IntegrityChecking")
        .any { simpleName.startsWith(it) } || simpleName.startsWith("uniffi")

    @Test
    fun `no mangled names in the public API a Java caller sees`() {
        val offenders = mutableListOf<String>()
        var checked = 0
        for (name in mainClasses()) {
            if (!name.startsWith("com.chainlesschain.appserver.") || name.startsWith("com.chainlesschain.appserver.protocol.")) continue
            val cls = Class.forName(name, false, javaClass.classLoader)
            if (!Modifier.isPublic(cls.modifiers) || cls.isSynthetic || isGlueInternal(cls.simpleName)) continue
            if (cls.enclosingClass?.let { isGlueInternal(it.simpleName) } == true) continue
            for (m in cls.declaredMethods) {
                if (!Modifier.isPublic(m.modifiers) || m.isSynthetic) continue
                checked++
                val types = m.parameterTypes.toList() + m.returnType
                // Kotlin mangles a function whose signature has an inline class (ULong, UInt, Duration, Result…).
                if ('-' in m.name) offenders += "${cls.name}.${m.name}"
                if (types.any { it.name.startsWith("kotlin.U") && it.name.length <= 13 }) offenders += "${cls.name}.${m.name} (unsigned type)"
            }
        }
        assertTrue(checked > 200, "only $checked public methods found; is the glue compiled in?")
        assertEquals(emptyList<String>(), offenders)
    }

    @Test
    fun `the uniffi close clash is renamed and the natives load from the jar resources`() {
        val names = NativeClient::class.java.methods.map { it.name }.toSet()
        assertTrue("disconnect" in names && "close" in names && "destroy" in names, names.toString())
        assertTrue(NativeClient::class.java.methods.single { it.name == "close" }.parameterCount == 0)
        assertEquals(null, System.getProperty("jna.library.path"))
        assertEquals(1, protocolVersion())
        assertTrue(schemaDigest().startsWith("sha256:"))
        assertEquals(System.getProperty("cc.expectedVersion") ?: libraryVersion(), libraryVersion())
        assertTrue(javaClass.classLoader.getResource("linux-x86-64/libcc_app_server_ffi.so") != null)
    }

    @Test
    fun `requests and notifications take the JNI hot path unless it is turned off`() = runBlocking {
        val jnaRun = System.getProperty("cc.appserver.jni") == "false"
        assertEquals(!jnaRun, JniTransport.available, "the jar's library has the jni feature")
        AppServer.open(tempStateDir()).use { server ->
            server.client().use { hot ->
                assertEquals(!jnaRun, hot.usesJni)
                hot.threadStart(threadId = "hot")
            }
            server.client(options = ClientOptions(jniHotPath = false)).use { jna ->
                assertEquals(false, jna.usesJni)
                // Both paths drive the same engine and see the same threads.
                assertEquals(listOf("hot"), jna.threadList().threads.map { it.id })
            }
        }
    }

    @Test
    fun `engine logs reach java util logging and a throwing native listener is counted`() = runBlocking {
        CapturedLogs("cc_app_server").use { logs ->
            assertTrue(AppServerLogging.install(Level.WARNING))
            AppServer.open(tempStateDir()).use { server ->
                server.client().use { client ->
                    val before = server.stats().listenerErrors
                    // A raw uniffi listener that throws: the library logs it (target cc_app_server::ffi)
                    // and keeps delivering.
                    val calls = java.util.concurrent.atomic.AtomicInteger()
                    val handle = client.native.listen(object : NotificationListener {
                        override fun onNotifications(messages: List<String>) {
                            calls.incrementAndGet()
                            throw ListenerException.Failed("listener bug")
                        }

                        override fun onClosed() {}
                    })
                    // Two separate batches: the second must still be delivered after the first threw.
                    client.startScripted("a", script(messageStep("one")))
                    val deadline = System.nanoTime() + WAIT_MS * 1_000_000
                    while (calls.get() < 1 && System.nanoTime() < deadline) Thread.sleep(5)
                    client.startScripted("b", script(messageStep("two")))
                    val line = logs.awaitMessage("listener failed; delivery continues")
                    assertTrue("listener bug" in line, line)
                    assertEquals("cc_app_server.ffi", logs.records.first { it.message == line }.loggerName)
                    assertEquals(Level.WARNING, logs.records.first { it.message == line }.level)
                    while (server.stats().listenerErrors < before + 2 && System.nanoTime() < deadline) Thread.sleep(10)
                    assertTrue(calls.get() >= 2, "delivery stopped after a throwing call")
                    assertTrue(server.stats().listenerErrors >= before + 2)
                    handle.cancel()
                    handle.destroy()
                }
            }
        }
    }
}
