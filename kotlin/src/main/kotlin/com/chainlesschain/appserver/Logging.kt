// The engine's diagnostics (Rust `tracing`) routed to java.util.logging: JUL ships with every JVM
// and Android maps it to logcat, IntelliJ routes it into idea.log, and SLF4J/Logback users bridge
// it with jul-to-slf4j — so the jar needs no logging dependency of its own.
package com.chainlesschain.appserver

import com.chainlesschain.appserver.ffi.LogLevel
import com.chainlesschain.appserver.ffi.LogListener
import com.chainlesschain.appserver.ffi.LogRecord
import com.chainlesschain.appserver.ffi.droppedLogRecords
import com.chainlesschain.appserver.ffi.setLogListener
import java.util.logging.Level
import java.util.logging.Logger

/**
 * Where the native engine's log records go. [AppServer.open] calls [install] with
 * [Level.WARNING] the first time, unless the host configured logging itself before (call
 * [install] or [disable] before the first open to choose).
 *
 * Records arrive on the library's `cc-log-delivery` thread through a bounded queue of 1024; a
 * host that falls behind loses records, counted in [droppedRecords], never blocks the engine.
 * Each record is logged to the JUL logger named after its Rust target with `::` as `.`
 * (`cc_app_server.ffi`, `cc_app_server.approval`, …); the SDK itself logs under
 * `com.chainlesschain.appserver`.
 */
object AppServerLogging {
    @Volatile private var configured = false

    init {
        // The first thing to touch the library may be logging: it decides which file loads.
        NativeLib.prepare()
    }

    /** Routes records at [level] and above (JUL levels: SEVERE…FINEST) to java.util.logging. */
    @JvmStatic
    @Synchronized
    fun install(level: Level = Level.WARNING): Boolean {
        configured = true
        return setLogListener(JulListener, nativeLevel(level))
    }

    /** Stops delivering native records (the engine then skips them at the cost of one atomic load). */
    @JvmStatic
    @Synchronized
    fun disable() {
        configured = true
        setLogListener(null, LogLevel.ERROR)
    }

    /** Records dropped because the JVM side fell more than the queue's capacity behind. */
    @JvmStatic
    fun droppedRecords(): Long = droppedLogRecords()

    @Synchronized
    internal fun installDefault() {
        if (!configured) install(Level.WARNING)
    }

    internal fun nativeLevel(level: Level): LogLevel = when {
        level.intValue() >= Level.SEVERE.intValue() -> LogLevel.ERROR
        level.intValue() >= Level.WARNING.intValue() -> LogLevel.WARN
        level.intValue() >= Level.INFO.intValue() -> LogLevel.INFO
        level.intValue() >= Level.FINE.intValue() -> LogLevel.DEBUG
        else -> LogLevel.TRACE
    }

    internal fun julLevel(level: LogLevel): Level = when (level) {
        LogLevel.ERROR -> Level.SEVERE
        LogLevel.WARN -> Level.WARNING
        LogLevel.INFO -> Level.INFO
        LogLevel.DEBUG -> Level.FINE
        LogLevel.TRACE -> Level.FINER
    }

    private object JulListener : LogListener {
        override fun onLog(record: LogRecord) {
            val logger = Logger.getLogger(record.target.replace("::", "."))
            val level = julLevel(record.level)
            if (!logger.isLoggable(level)) return
            val jul = java.util.logging.LogRecord(level, record.message)
            jul.loggerName = logger.name
            // Otherwise JUL infers this bridge as the source of every record.
            jul.sourceClassName = record.target
            jul.sourceMethodName = null
            jul.instant = java.time.Instant.ofEpochMilli(record.unixMs)
            logger.log(jul)
        }
    }
}
