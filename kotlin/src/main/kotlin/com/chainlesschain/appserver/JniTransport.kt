// The JVM hot path: requests and the notification pump cross into Rust through direct JNI entry
// points (ffi/src/jni.rs) instead of uniffi's JNA calls, which measured 3-10x slower per request
// round trip (docs/bench/jvm.md). Everything else (opening, approvals, kernels,
// tools, logs) stays on uniffi. Both paths drive the same uniffi `Client` object, so there is one
// pending map, one approval router and one notification queue either way.
package com.chainlesschain.appserver

import com.chainlesschain.appserver.ffi.jniAnchor
import com.chainlesschain.appserver.ffi.protocolVersion
import com.sun.jna.Library
import com.sun.jna.NativeLibrary
import org.json.JSONObject
import java.util.logging.Level
import java.util.logging.Logger
import com.chainlesschain.appserver.ffi.Client as NativeClient

internal object JniTransport {
    private val log: Logger = Logger.getLogger("com.chainlesschain.appserver.jni")

    /**
     * True when the JNI entry points are usable: not disabled with `-Dcc.appserver.jni=false`, the
     * library exports them (built with the `jni` feature), and the JVM mapped the very copy of the
     * library that JNA loaded (checked by comparing one static's address through both).
     */
    val available: Boolean by lazy { load() }

    private fun load(): Boolean {
        if (System.getProperty("cc.appserver.jni") == "false") {
            log.info("JNI hot path turned off by -Dcc.appserver.jni=false; requests and notifications go through JNA")
            return false
        }
        return try {
            // The file JNA maps is decided first (NativeLib), so JNI can map the same one.
            NativeLib.prepare()
            protocolVersion()
            val file = NativeLib.file ?: run {
                val loader = NativeClient::class.java.classLoader
                NativeLibrary.getInstance("cc_app_server_ffi", mapOf(Library.OPTION_CLASSLOADER to loader)).file
            }
            if (file != null) System.load(file.absolutePath) else System.loadLibrary("cc_app_server_ffi")
            val same = anchor() == jniAnchor()
            if (!same) fallback("JNI mapped a different copy of libcc_app_server_ffi than JNA", null)
            same
        } catch (e: Throwable) {
            if (e is Error && e !is LinkageError) throw e
            fallback("the JNI entry points could not be loaded (${e.javaClass.simpleName}: ${e.message})", e)
            false
        }
    }

    private fun fallback(why: String, e: Throwable?) {
        log.log(
            Level.WARNING,
            "JNI hot path unavailable: $why; requests and notifications go through JNA instead, " +
                "several times slower per message (a blocking request measured 57 µs instead of 16 µs)",
            e,
        )
    }

    @JvmStatic external fun anchor(): Long
    @JvmStatic external fun clientRelease(handle: Long)
    @JvmStatic external fun request(handle: Long, method: String, paramsJson: String): String
    @JvmStatic external fun nextNotifications(handle: Long, max: Int, timeoutMs: Long): Array<String>?
    /** Waits with no timeout: a batch, an empty array after [stopNotifications], null once closed. */
    @JvmStatic external fun waitNotifications(handle: Long, max: Int): Array<String>?
    /** `true` wakes and stops the waiting pump; `false` arms a new one. */
    @JvmStatic external fun stopNotifications(handle: Long, stop: Boolean)

    /** Turns a hot-path answer (`R` + result, or `E` + error JSON) into a result or a typed exception. */
    fun answer(text: String): String {
        if (text.startsWith("R")) return text.substring(1)
        val e = JSONObject(text.substring(1))
        val reason = e.optString("reason")
        throw when (e.getString("kind")) {
            "overloaded" -> AppServerException.Overloaded(e.getLong("retryAfterMs"))
            "timeout" -> AppServerException.Timeout()
            "closed" -> AppServerException.Closed()
            "lineTooLarge" -> AppServerException.LineTooLarge(e.getLong("size"), e.getLong("max"))
            "protocol" -> protocolException(e.getInt("code"), reason, if (e.isNull("data")) null else e.getString("data"))
            "invalidJson" -> AppServerException.InvalidJson(reason)
            else -> AppServerException.InvalidArgument(reason)
        }
    }
}

/**
 * One client's use of the hot path: a cloned uniffi handle, borrowed by calls and given back once
 * no call is left. Calls after [release] fail with [AppServerException.Closed].
 */
internal class JniClientHandle(native: NativeClient) {
    private val handle: Long = native.uniffiCloneHandle()
    private var calls = 0
    private var released = false
    private val lock = Object()

    fun <T> use(block: (Long) -> T): T {
        synchronized(lock) {
            if (released) throw AppServerException.Closed()
            calls++
        }
        try {
            return block(handle)
        } finally {
            synchronized(lock) {
                calls--
                if (calls == 0) lock.notifyAll()
            }
        }
    }

    /** Waits for calls in flight (the client is already closed, so they end at once), then frees. */
    fun release() {
        synchronized(lock) {
            if (released) return
            released = true
            while (calls > 0) lock.wait()
        }
        JniTransport.clientRelease(handle)
    }
}
