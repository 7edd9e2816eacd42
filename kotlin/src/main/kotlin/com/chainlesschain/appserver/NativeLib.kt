// Where the native library comes from, decided once and before anything loads it, so that JNA
// (the uniffi glue) and JNI (the hot path, JniTransport) map the very same file.
//
// Left alone, JNA extracts the jar's library to a temporary file and deletes it once loaded, so a
// second load of that file (the JNI one) fails and the hot path turns off. Instead the SDK copies
// the library out of the jar itself, once, into a private cache directory (0700, named after the
// library's SHA-256, verified before reuse), and points uniffi's library override at that file.
package com.chainlesschain.appserver

import com.sun.jna.Platform
import java.io.File
import java.nio.file.AtomicMoveNotSupportedException
import java.nio.file.Files
import java.nio.file.Path
import java.nio.file.StandardCopyOption
import java.nio.file.attribute.PosixFilePermissions
import java.security.MessageDigest
import java.util.logging.Level
import java.util.logging.Logger

internal object NativeLib {
    private val log: Logger = Logger.getLogger("com.chainlesschain.appserver.jni")

    /** uniffi's Kotlin glue loads the file this property names, when set. */
    const val OVERRIDE = "uniffi.component.cc_app_server.libraryOverride"

    /** Overrides where the jar's library is copied to (default: the user's cache directory). */
    const val DIR_PROPERTY = "cc.appserver.nativeDir"

    /**
     * The library file both paths load: the host's own override, the jar's library copied to the
     * cache, or `null` when JNA is left to find it (`jna.library.path` set, or no library in the
     * jar for this platform) — then JNI asks JNA which file it mapped.
     */
    val file: File? by lazy { locate() }

    /** Decides the library before the glue loads it. Cheap after the first call. */
    fun prepare() {
        file
    }

    private fun locate(): File? {
        System.getProperty(OVERRIDE)?.let { return File(it) }
        // A host that chose where JNA looks keeps its choice; JNA does not delete such a file.
        if (System.getProperty("jna.library.path") != null) return null
        val resource = "${Platform.RESOURCE_PREFIX}/${System.mapLibraryName("cc_app_server_ffi")}"
        val bytes = NativeLib::class.java.classLoader?.getResourceAsStream(resource)?.use { it.readBytes() }
            ?: return null
        return try {
            val copy = copyOut(bytes, File(resource).name)
            System.setProperty(OVERRIDE, copy.absolutePath)
            copy
        } catch (e: Exception) {
            log.log(
                Level.WARNING,
                "could not copy the native library out of the jar (${e.message}); JNA extracts it to a " +
                    "temporary file instead, and the JNI hot path will be off (requests several times slower; " +
                    "set -D$DIR_PROPERTY to a writable directory)",
                e,
            )
            null
        }
    }

    private fun copyOut(bytes: ByteArray, name: String): File {
        val digest = MessageDigest.getInstance("SHA-256").digest(bytes).joinToString("") { "%02x".format(it) }
        val root = cacheRoot()
        val dir = root.resolve(digest.take(32))
        createPrivate(root, dir)
        val target = dir.resolve(name)
        if (Files.isRegularFile(target) && sha256(target) == digest) return target.toFile()
        val tmp = Files.createTempFile(dir, ".$name.", ".tmp")
        try {
            Files.write(tmp, bytes)
            try {
                Files.move(tmp, target, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING)
            } catch (e: AtomicMoveNotSupportedException) {
                Files.move(tmp, target, StandardCopyOption.REPLACE_EXISTING)
            }
        } finally {
            Files.deleteIfExists(tmp)
        }
        if (sha256(target) != digest) throw IllegalStateException("the copy at $target does not match the jar's library")
        return target.toFile()
    }

    private fun sha256(path: Path): String =
        MessageDigest.getInstance("SHA-256").digest(Files.readAllBytes(path)).joinToString("") { "%02x".format(it) }

    private fun cacheRoot(): Path {
        System.getProperty(DIR_PROPERTY)?.let { return Path.of(it) }
        val home = System.getProperty("user.home")
        val base = when {
            Platform.isMac() -> Path.of(home, "Library", "Caches")
            Platform.isWindows() -> System.getenv("LOCALAPPDATA")?.let { Path.of(it) } ?: Path.of(home, "AppData", "Local")
            else -> System.getenv("XDG_CACHE_HOME")?.takeIf { it.isNotEmpty() }?.let { Path.of(it) } ?: Path.of(home, ".cache")
        }
        return base.resolve("cc-app-server").resolve("native")
    }

    /** Creates [dir] under [root], both readable and writable by the user only where POSIX allows. */
    private fun createPrivate(root: Path, dir: Path) {
        Files.createDirectories(dir)
        if (Platform.isWindows()) return
        for (p in listOf(root, dir)) {
            runCatching { Files.setPosixFilePermissions(p, PosixFilePermissions.fromString("rwx------")) }
        }
    }
}
