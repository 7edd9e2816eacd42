@file:Suppress("UNUSED_PARAMETER")

package com.chainlesschain.appserver.protocol

import org.json.JSONArray
import org.json.JSONObject
import java.math.BigDecimal
import java.math.BigInteger
import java.nio.ByteBuffer
import java.nio.charset.CharacterCodingException
import java.nio.charset.CodingErrorAction
import java.nio.charset.StandardCharsets

/**
 * How strictly to decode. [Receive] is what a host's event pump uses: display unions and enums keep
 * a value this version does not know as `Unknown`, so a newer server never breaks an older client.
 * [Conformance] refuses everything the schema refuses (what the Rust validator and the shared
 * fixtures mean). Security-sensitive unions and enums refuse unknown values in both modes.
 */
enum class DecodeMode { Receive, Conformance }

/** A refusal: where (a JSON pointer into the decoded value, `""` for the whole value) and why. */
class ProtocolDecodeException(val pointer: String, val reason: String) :
    IllegalArgumentException("at " + (if (pointer.isEmpty()) "(root)" else pointer) + ": " + reason)

/**
 * An optional member that may also be `null`: missing, present as `null`, and present with a value
 * are three different things on the wire and stay three different things here.
 */
sealed class JsonField<out T> {
    /** The member is not on the wire. */
    object Absent : JsonField<Nothing>() {
        override fun toString(): String = "Absent"
    }

    /** The member is on the wire as `null`. */
    object Null : JsonField<Nothing>() {
        override fun toString(): String = "Null"
    }

    /** The member is on the wire with a value. */
    data class Value<out T>(val value: T) : JsonField<T>()

    /** The value, or `null` when absent or `null`. */
    fun orNull(): T? = if (this is Value) value else null
}

/**
 * Strict RFC 8259 JSON for the wire: org.json's own parser is lenient (trailing commas, single
 * quotes, unquoted names, lone surrogates), so messages are parsed here and only the tree is
 * org.json. Limits match the Rust core (serde_json): at most [MAX_DEPTH] nested arrays/objects.
 */
object ProtocolJson {
    const val MAX_DEPTH: Int = 127

    /** Parses one JSON text into org.json values (`JSONObject.NULL` for null). */
    fun parse(text: String): Any = StrictParser(text).document()

    /** Decodes UTF-8 strictly (malformed bytes are refused, not replaced) and parses. */
    fun parse(bytes: ByteArray): Any {
        val text = try {
            StandardCharsets.UTF_8.newDecoder()
                .onMalformedInput(CodingErrorAction.REPORT)
                .onUnmappableCharacter(CodingErrorAction.REPORT)
                .decode(ByteBuffer.wrap(bytes)).toString()
        } catch (e: CharacterCodingException) {
            throw ProtocolDecodeException("", "parse error: not UTF-8 (" + e.javaClass.simpleName + ")")
        }
        return parse(text)
    }

    /** One line of compact JSON. */
    fun encode(value: Any): String = when (value) {
        is JSONObject -> value.toString()
        is JSONArray -> value.toString()
        else -> JSONObject.valueToString(value)
    }

    /** JSON equality: member order ignored, numbers compared by value (`3` equals `3.0`). */
    fun equal(a: Any?, b: Any?): Boolean = jsonEquals(a, b)
}

private class StrictParser(private val s: String) {
    private var i = 0

    fun document(): Any {
        ws()
        val v = value(0)
        ws()
        if (i != s.length) err("unexpected trailing characters")
        return v
    }

    private fun err(reason: String): Nothing = throw ProtocolDecodeException("", "parse error at offset $i: $reason")

    private fun peek(): Char = if (i < s.length) s[i] else '\u0000'

    private fun ws() {
        while (i < s.length && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++
    }

    private fun value(depth: Int): Any {
        if (i >= s.length) err("unexpected end of input")
        return when (s[i]) {
            '{' -> obj(depth + 1)
            '[' -> arr(depth + 1)
            '"' -> str()
            't' -> word("true", true)
            'f' -> word("false", false)
            'n' -> word("null", JSONObject.NULL)
            else -> num()
        }
    }

    private fun word(w: String, v: Any): Any {
        if (!s.startsWith(w, i)) err("invalid literal")
        i += w.length
        return v
    }

    private fun obj(depth: Int): JSONObject {
        if (depth > ProtocolJson.MAX_DEPTH) err("nesting deeper than ${ProtocolJson.MAX_DEPTH} levels")
        i++
        val o = JSONObject()
        ws()
        if (peek() == '}') {
            i++
            return o
        }
        while (true) {
            ws()
            if (peek() != '"') err("expected a member name")
            val k = str()
            ws()
            if (peek() != ':') err("expected ':'")
            i++
            ws()
            o.put(k, value(depth))
            ws()
            when (peek()) {
                ',' -> i++
                '}' -> {
                    i++
                    return o
                }
                else -> err("expected ',' or '}'")
            }
        }
    }

    private fun arr(depth: Int): JSONArray {
        if (depth > ProtocolJson.MAX_DEPTH) err("nesting deeper than ${ProtocolJson.MAX_DEPTH} levels")
        i++
        val a = JSONArray()
        ws()
        if (peek() == ']') {
            i++
            return a
        }
        while (true) {
            ws()
            a.put(value(depth))
            ws()
            when (peek()) {
                ',' -> i++
                ']' -> {
                    i++
                    return a
                }
                else -> err("expected ',' or ']'")
            }
        }
    }

    private fun hex4(): Char {
        if (i + 4 > s.length) err("short \\u escape")
        var v = 0
        for (k in 0 until 4) {
            val d = Character.digit(s[i + k], 16)
            if (d < 0) err("bad \\u escape")
            v = v * 16 + d
        }
        i += 4
        return v.toChar()
    }

    private fun str(): String {
        i++
        val b = StringBuilder()
        while (true) {
            if (i >= s.length) err("unterminated string")
            val c = s[i++]
            when {
                c == '"' -> return b.toString()
                c == '\\' -> {
                    if (i >= s.length) err("unterminated escape")
                    when (s[i++]) {
                        '"' -> b.append('"')
                        '\\' -> b.append('\\')
                        '/' -> b.append('/')
                        'b' -> b.append('\b')
                        'f' -> b.append('\u000C')
                        'n' -> b.append('\n')
                        'r' -> b.append('\r')
                        't' -> b.append('\t')
                        'u' -> {
                            val u = hex4()
                            if (Character.isHighSurrogate(u)) {
                                if (!s.startsWith("\\u", i)) err("lone surrogate escape")
                                i += 2
                                val low = hex4()
                                if (!Character.isLowSurrogate(low)) err("lone surrogate escape")
                                b.append(u).append(low)
                            } else if (Character.isLowSurrogate(u)) {
                                err("lone surrogate escape")
                            } else {
                                b.append(u)
                            }
                        }
                        else -> err("invalid escape")
                    }
                }
                c < ' ' -> err("control character in string")
                else -> b.append(c)
            }
        }
    }

    private fun digits(): Int {
        val start = i
        while (i < s.length && s[i] in '0'..'9') i++
        return i - start
    }

    private fun num(): Any {
        val start = i
        if (peek() == '-') i++
        if (peek() == '0') {
            i++
        } else if (digits() == 0) {
            err("invalid value")
        }
        var integral = true
        if (peek() == '.') {
            i++
            integral = false
            if (digits() == 0) err("invalid number")
        }
        if (peek() == 'e' || peek() == 'E') {
            i++
            integral = false
            if (peek() == '+' || peek() == '-') i++
            if (digits() == 0) err("invalid number")
        }
        val text = s.substring(start, i)
        if (integral) return text.toLongOrNull() ?: BigInteger(text)
        return BigDecimal(text)
    }
}

internal fun ptr(at: String, key: String): String = at + "/" + key.replace("~", "~0").replace("/", "~1")

internal fun ptr(at: String, index: Int): String = "$at/$index"

internal fun fail(at: String, reason: String): Nothing = throw ProtocolDecodeException(at, reason)

internal fun describeValue(j: Any?): String {
    val text = when {
        j == null -> return "nothing"
        j === JSONObject.NULL -> return "null"
        j is String -> JSONObject.quote(j)
        j is JSONObject -> return "an object"
        j is JSONArray -> return "an array"
        else -> j.toString()
    }
    return if (text.length > 80) text.substring(0, 80) + "…" else text
}

internal fun isNull(j: Any?): Boolean = j === JSONObject.NULL

internal fun readObject(j: Any?, at: String): JSONObject =
    j as? JSONObject ?: fail(at, "expected an object, found " + describeValue(j))

internal fun requireMember(o: JSONObject, key: String, at: String): Any =
    if (o.has(key)) o.opt(key) else fail(at, "missing required member " + JSONObject.quote(key))

internal fun refuseUnknownMembers(o: JSONObject, at: String, known: Set<String>) {
    for (k in o.keys()) {
        if (k !in known) fail(ptr(at, k), "unknown member " + JSONObject.quote(k) + " (this object is strict)")
    }
}

internal fun extraMembers(o: JSONObject, known: Set<String>): Map<String, Any> {
    val out = LinkedHashMap<String, Any>()
    for (k in o.keys()) {
        if (k !in known) out[k] = o.opt(k)
    }
    return out
}

internal fun requireExactlyOne(o: JSONObject, at: String, alternatives: List<List<String>>) {
    val matched = alternatives.count { set -> set.all { o.has(it) } }
    if (matched != 1) {
        fail(at, "expected exactly one of " + alternatives.joinToString(", ") { it.joinToString("+") } + ", found $matched")
    }
}

internal fun <T> checkConst(v: T, expected: Any, at: String): T {
    if (!jsonEquals(v, expected)) fail(at, "expected " + describeValue(expected) + ", found " + describeValue(v))
    return v
}

internal fun tagIs(t: Any?, expected: Any): Boolean = jsonEquals(t, expected)

internal inline fun <T> nullOr(j: Any, decode: (Any) -> T): T? = if (isNull(j)) null else decode(j)

internal inline fun <T> optional(o: JSONObject, key: String, decode: (Any) -> T): T? =
    if (o.has(key)) decode(o.opt(key)) else null

internal inline fun <T> optionalNullable(o: JSONObject, key: String, decode: (Any) -> T): JsonField<T> = when {
    !o.has(key) -> JsonField.Absent
    isNull(o.opt(key)) -> JsonField.Null
    else -> JsonField.Value(decode(o.opt(key)))
}

internal fun readString(
    j: Any?,
    at: String,
    minLength: Int = 0,
    maxLength: Int = Int.MAX_VALUE,
    pattern: Regex? = null,
): String {
    val s = j as? String ?: fail(at, "expected a string, found " + describeValue(j))
    // JSON Schema counts Unicode code points, not UTF-16 units.
    val n = s.codePointCount(0, s.length)
    if (n < minLength) fail(at, "shorter than $minLength characters")
    if (n > maxLength) fail(at, "longer than $maxLength characters")
    if (pattern != null && !pattern.containsMatchIn(s)) fail(at, "does not match " + pattern.pattern)
    return s
}

private val LONG_MIN: BigInteger = BigInteger.valueOf(Long.MIN_VALUE)
private val LONG_MAX: BigInteger = BigInteger.valueOf(Long.MAX_VALUE)

/** The exact integer a JSON number denotes (`3.0` is the integer 3), or null when it has a fraction. */
internal fun integralValue(j: Any?): BigInteger? = when (j) {
    is Long -> BigInteger.valueOf(j)
    is Int -> BigInteger.valueOf(j.toLong())
    is BigInteger -> j
    is BigDecimal -> if (j.signum() == 0 || j.stripTrailingZeros().scale() <= 0) j.toBigInteger() else null
    is Double -> if (j.isFinite() && j == Math.floor(j)) BigDecimal(j).toBigInteger() else null
    is Float -> if (j.isFinite() && j == Math.floor(j.toDouble()).toFloat()) BigDecimal(j.toDouble()).toBigInteger() else null
    else -> null
}

internal fun readLong(j: Any?, at: String, minimum: Long = Long.MIN_VALUE, maximum: Long = Long.MAX_VALUE): Long {
    val v = integralValue(j) ?: fail(at, "expected an integer, found " + describeValue(j))
    if (v < BigInteger.valueOf(minimum) || v < LONG_MIN) fail(at, "less than the minimum $minimum")
    if (v > BigInteger.valueOf(maximum) || v > LONG_MAX) fail(at, "greater than the maximum $maximum")
    return v.toLong()
}

internal fun readNumber(j: Any?, at: String): Double {
    val n = j as? Number ?: fail(at, "expected a number, found " + describeValue(j))
    return n.toDouble()
}

internal fun readBoolean(j: Any?, at: String): Boolean =
    j as? Boolean ?: fail(at, "expected a boolean, found " + describeValue(j))

internal fun readJson(j: Any?, at: String): Any = j ?: fail(at, "missing value")

internal fun readLongOrString(
    j: Any?,
    at: String,
    minimum: Long = Long.MIN_VALUE,
    maximum: Long = Long.MAX_VALUE,
    maxLength: Int = Int.MAX_VALUE,
): Any = if (j is String) readString(j, at, maxLength = maxLength) else readLong(j, at, minimum, maximum)

/** `x-max-depth`: arrays and objects nest at most [limit] levels, [j] itself being the first. */
internal fun checkDepth(j: Any?, at: String, limit: Int) {
    fun walk(v: Any?, level: Int, at: String) {
        when (v) {
            is JSONObject -> {
                if (level > limit) fail(at, "nested more than $limit levels of arrays and objects deep")
                for (k in v.keySet()) walk(v.opt(k), level + 1, ptr(at, k))
            }
            is JSONArray -> {
                if (level > limit) fail(at, "nested more than $limit levels of arrays and objects deep")
                for (i in 0 until v.length()) walk(v.opt(i), level + 1, ptr(at, i))
            }
        }
    }
    walk(j, 1, at)
}

internal inline fun <T> readList(
    j: Any?,
    at: String,
    minItems: Int = 0,
    maxItems: Int = Int.MAX_VALUE,
    item: (Any, String) -> T,
): List<T> {
    val a = j as? JSONArray ?: fail(at, "expected an array, found " + describeValue(j))
    if (a.length() < minItems) fail(at, "fewer than $minItems items")
    if (a.length() > maxItems) fail(at, "more than $maxItems items")
    val out = ArrayList<T>(a.length())
    for (i in 0 until a.length()) out.add(item(a.opt(i), ptr(at, i)))
    return out
}

internal inline fun <T> readMap(
    j: Any?,
    at: String,
    maxProperties: Int = Int.MAX_VALUE,
    keyMinLength: Int = 0,
    keyMaxLength: Int = Int.MAX_VALUE,
    value: (Any, String) -> T,
): Map<String, T> {
    val o = readObject(j, at)
    if (o.length() > maxProperties) fail(at, "more than $maxProperties members")
    val out = LinkedHashMap<String, T>()
    for (k in o.keys()) {
        val n = k.codePointCount(0, k.length)
        if (n < keyMinLength || n > keyMaxLength) {
            fail(ptr(at, k), "member name length outside $keyMinLength..$keyMaxLength")
        }
        out[k] = value(o.opt(k), ptr(at, k))
    }
    return out
}

internal inline fun <T> encodeList(v: List<T>, item: (T) -> Any): JSONArray {
    val a = JSONArray()
    for (x in v) a.put(item(x))
    return a
}

internal inline fun <T> encodeMap(v: Map<String, T>, value: (T) -> Any): JSONObject {
    val o = JSONObject()
    for ((k, x) in v) o.put(k, value(x))
    return o
}

private fun numberValue(n: Any): BigDecimal? = when (n) {
    is BigDecimal -> n
    is BigInteger -> BigDecimal(n)
    is Long -> BigDecimal.valueOf(n)
    is Int -> BigDecimal.valueOf(n.toLong())
    is Double -> if (n.isFinite()) BigDecimal(n) else null
    is Float -> if (n.isFinite()) BigDecimal(n.toDouble()) else null
    else -> null
}

internal fun jsonEquals(a: Any?, b: Any?): Boolean {
    if (a === b) return true
    if (a == null || b == null) return false
    if (isNull(a) || isNull(b)) return isNull(a) && isNull(b)
    if (a is Number && b is Number) {
        val x = numberValue(a)
        val y = numberValue(b)
        return x != null && y != null && x.compareTo(y) == 0
    }
    if (a is JSONObject && b is JSONObject) {
        if (a.length() != b.length()) return false
        for (k in a.keys()) {
            if (!b.has(k) || !jsonEquals(a.opt(k), b.opt(k))) return false
        }
        return true
    }
    if (a is JSONArray && b is JSONArray) {
        if (a.length() != b.length()) return false
        for (i in 0 until a.length()) {
            if (!jsonEquals(a.opt(i), b.opt(i))) return false
        }
        return true
    }
    return a == b
}
