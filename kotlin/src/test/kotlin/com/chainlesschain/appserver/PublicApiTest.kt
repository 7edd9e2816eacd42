// The SDK's public API as the JVM sees it: `javap -public` over every public class of the SDK
// package must never name the uniffi glue (com.chainlesschain.appserver.ffi), and no generated
// protocol type may shadow a name a Kotlin or Java file sees without an import (java.lang.*,
// kotlin.* and Kotlin's other default imports, read from the JDK and the Kotlin stdlib).
// Runs under JUnit against the build's classes and, through main(), against the built jar
// (scripts/test-jvm.sh: `-Dcc.api.classes=<jar>`).
package com.chainlesschain.appserver

import org.junit.jupiter.api.Test
import java.io.File
import java.lang.reflect.Modifier
import java.net.URI
import java.nio.file.FileSystems
import java.nio.file.Files
import java.util.zip.ZipFile
import kotlin.reflect.KVisibility
import kotlin.reflect.jvm.javaConstructor
import kotlin.reflect.jvm.kotlinFunction

private const val SDK = "com/chainlesschain/appserver/"
private const val PROTOCOL = "com/chainlesschain/appserver/protocol/"
private const val GLUE = "com.chainlesschain.appserver.ffi."

/** The jar (or class directory) under test: the built jar when given, else this build's classes. */
private fun classesRoot(): File = System.getProperty("cc.api.classes")?.let(::File)
    ?: File(AppServer::class.java.protectionDomain.codeSource.location.toURI())

/** Class names (binary, with `$`) directly in [prefix] of [root]. */
private fun classesIn(root: File, prefix: String): List<String> {
    val entries = if (root.isDirectory) {
        root.walk().filter { it.isFile }.map { it.relativeTo(root).invariantSeparatorsPath }.toList()
    } else {
        ZipFile(root).use { z -> z.entries().toList().map { it.name } }
    }
    return entries.filter { it.startsWith(prefix) && it.endsWith(".class") && '/' !in it.removePrefix(prefix) }
        .map { it.removeSuffix(".class").replace('/', '.') }
        .sorted()
}

private fun kotlinKind(c: Class<*>): Int? = c.getAnnotation(Metadata::class.java)?.kind

/** Public to a Kotlin reader too: `internal` classes and members are public in bytecode. */
private fun kotlinPublic(c: Class<*>): Boolean {
    var k: Class<*>? = c
    while (k != null) {
        if (!Modifier.isPublic(k.modifiers)) return false
        if (kotlinKind(k) == 1 && k.kotlin.visibility != KVisibility.PUBLIC) return false
        k = k.enclosingClass
    }
    return true
}

/** Every public signature of the SDK package that names the glue, as `class: javap line`. */
fun glueInPublicSignatures(root: File = classesRoot()): List<String> {
    val loader = java.net.URLClassLoader(arrayOf(root.toURI().toURL()), AppServer::class.java.classLoader)
    val classes = classesIn(root, SDK).map { Class.forName(it, false, loader) }.filter { kotlinPublic(it) && !it.isSynthetic }
    val javap = ProcessBuilder(listOf(File(System.getProperty("java.home"), "bin/javap").path, "-public", "-cp", root.path) + classes.map { it.name })
        .redirectErrorStream(true).start()
    val text = javap.inputStream.bufferedReader().readText()
    check(javap.waitFor() == 0) { "javap failed: $text" }
    val byName = classes.associateBy { it.name }
    val leaks = mutableListOf<String>()
    var current: Class<*>? = null
    for (line in text.lines()) {
        val header = Regex("""^\S.*\b(?:class|interface|enum)\s+([\w.$]+)""").find(line)
        if (header != null && !line.startsWith("Compiled")) {
            current = byName[header.groupValues[1]]
            if (current != null && GLUE in line) leaks += "${current.name}: ${line.trim()}"
            continue
        }
        val c = current ?: continue
        if (GLUE !in line) continue
        val member = Regex("""([\w$]+)\(""").find(line)?.groupValues?.get(1) ?: ""
        if ('$' in member || "DefaultConstructorMarker" in line) continue // Kotlin `internal` / synthetic
        val isConstructor = member == c.simpleName || member == c.name.substringAfterLast('.')
        val public = when {
            isConstructor -> c.kotlin.constructors.any { k ->
                k.visibility == KVisibility.PUBLIC && k.javaConstructor?.parameterTypes?.any { it.name.startsWith(GLUE) } == true
            }
            kotlinKind(c) == 2 -> c.declaredMethods.filter { it.name == member }.any { m ->
                m.kotlinFunction?.visibility == KVisibility.PUBLIC
            }
            else -> true
        }
        if (public) leaks += "${c.name}: ${line.trim()}"
    }
    return leaks
}

/** The names a Kotlin/JVM file sees without an import: java.lang.*, kotlin.*, kotlin.collections.*, … */
fun defaultImportedNames(): Set<String> {
    val names = sortedSetOf<String>()
    // java.lang: every top-level class of the package in the running JDK.
    FileSystems.getFileSystem(URI.create("jrt:/")).let { jrt ->
        Files.list(jrt.getPath("/modules/java.base/java/lang")).use { s ->
            s.map { it.fileName.toString() }.filter { it.endsWith(".class") && '$' !in it && it != "module-info.class" }
                .forEach { names += it.removeSuffix(".class") }
        }
    }
    // Kotlin's default imports on the JVM, from the stdlib jar: classes, and the typealiases and
    // functions (upper-case top-level names, e.g. kotlin.collections.ArrayList) of its facades.
    val packages = listOf("kotlin", "kotlin.annotation", "kotlin.collections", "kotlin.comparisons", "kotlin.io",
        "kotlin.ranges", "kotlin.sequences", "kotlin.text", "kotlin.jvm")
    val stdlib = File(Unit::class.java.protectionDomain.codeSource.location.toURI())
    for (pkg in packages) {
        for (name in classesIn(stdlib, pkg.replace('.', '/') + "/")) {
            val simple = name.substringAfterLast('.')
            if ('$' in simple) continue
            val meta = runCatching { Class.forName(name, false, Unit::class.java.classLoader) }.getOrNull()?.getAnnotation(Metadata::class.java)
            if (meta != null && (meta.kind == 2 || meta.kind == 4 || meta.kind == 5)) {
                meta.data2.filter { it.length > 1 && it.firstOrNull()?.isUpperCase() == true && it.all { ch -> ch.isLetterOrDigit() } }.forEach { names += it }
            } else {
                names += simple
            }
        }
    }
    // The compiler's built-in types (Int, Any, List, IntArray, …) have no class file: the stdlib
    // names them through the Java classes they map to (ClassReference.qualifiedName), and each
    // read-only collection has its Mutable twin.
    val javaClasses = mutableListOf<Class<*>>(Any::class.java)
    javaClasses += listOf(Integer.TYPE, java.lang.Long.TYPE, java.lang.Short.TYPE, java.lang.Byte.TYPE, Character.TYPE,
        java.lang.Boolean.TYPE, java.lang.Float.TYPE, java.lang.Double.TYPE).flatMap { listOf(it, java.lang.reflect.Array.newInstance(it, 0).javaClass) }
    for (pkg in listOf("java/lang", "java/util")) {
        FileSystems.getFileSystem(URI.create("jrt:/")).let { jrt ->
            Files.list(jrt.getPath("/modules/java.base/$pkg")).use { s ->
                s.map { it.fileName.toString() }.filter { it.endsWith(".class") && '$' !in it && it != "module-info.class" }.toList()
            }.forEach { f -> runCatching { javaClasses += Class.forName(pkg.replace('/', '.') + "." + f.removeSuffix(".class")) } }
        }
    }
    javaClasses += java.util.Map.Entry::class.java
    for (c in javaClasses) {
        val fq = c.kotlin.qualifiedName ?: continue
        val pkg = fq.substringBeforeLast('.')
        if (pkg !in packages && !fq.startsWith("kotlin.collections.")) continue
        val simple = fq.removePrefix("$pkg.")
        names += simple.substringBefore('.')
        if (pkg == "kotlin.collections") names += "Mutable" + simple.substringBefore('.')
    }
    return names
}

/** Every top-level public name of the generated protocol package: classes and typealiases. */
fun protocolNames(root: File = classesRoot()): Set<String> {
    val loader = java.net.URLClassLoader(arrayOf(root.toURI().toURL()), AppServer::class.java.classLoader)
    val names = sortedSetOf<String>()
    for (name in classesIn(root, PROTOCOL)) {
        val simple = name.substringAfterLast('.')
        if ('$' in simple) continue
        val c = Class.forName(name, false, loader)
        val meta = c.getAnnotation(Metadata::class.java)
        if (meta?.kind == 2) {
            // A file facade: its typealiases are in the metadata's string table (upper-case names).
            meta.data2.filter { it.length > 1 && it.firstOrNull()?.isUpperCase() == true && it.all { ch -> ch.isLetterOrDigit() || ch == '_' } && '_' !in it }
                .forEach { names += it }
        } else if (Modifier.isPublic(c.modifiers)) {
            names += simple
        }
    }
    return names
}

/** The glue check, without JUnit (the plain-classpath run has none): throws on a leak. */
fun checkNoGlue() {
    val leaks = glueInPublicSignatures()
    check(leaks.isEmpty()) { "public signatures naming the glue:\n" + leaks.joinToString("\n") }
}

/** The platform-name check, without JUnit: throws on a clash (or on lists that cannot be right). */
fun checkNoShadowing() {
    val platform = defaultImportedNames()
    // The lists are real: they hold the names that once clashed, and a built-in type.
    check("Thread" in platform && "Metadata" in platform && "InternalError" in platform && "Int" in platform) { "$platform" }
    val ours = protocolNames()
    check("AgentThread" in ours && "ThreadMetadata" in ours && "ServerNotification" in ours) { "$ours" }
    val clashes = ours.intersect(platform)
    check(clashes.isEmpty()) { "generated names that shadow a default import: $clashes" }
}

class PublicApiTest {
    @Test
    fun `no public signature of the SDK names the uniffi glue`() = checkNoGlue()

    @Test
    fun `no generated protocol type shadows a default-imported name`() = checkNoShadowing()
}

/** For the run from the built jar: both checks, `public-api: N passed, M failed`. */
fun main() {
    var passed = 0
    var failed = 0
    for ((name, check) in listOf<Pair<String, () -> Unit>>(
        "glue" to ::checkNoGlue,
        "platform names" to ::checkNoShadowing,
    )) {
        try {
            check()
            passed++
            println("ok $name")
        } catch (e: Throwable) {
            failed++
            println("FAILED $name: ${e.message}")
        }
    }
    println("public-api: $passed passed, $failed failed")
    kotlin.system.exitProcess(if (failed == 0) 0 else 1)
}
