//! RFC 8785 (JSON Canonicalization Scheme): the one byte form we hash, so that a digest never
//! depends on key order, whitespace or number spelling.

use serde_json::{Number, Value};
use std::fmt::Write as _;

/// Serialises `value` in its RFC 8785 canonical form.
///
/// Object members are sorted by their UTF-16 code units, strings use the minimal JSON escapes, and
/// numbers use the ECMAScript `Number.prototype.toString` form (integers beyond 2^53 are kept
/// exactly as serde_json holds them, since our schema bounds every integer well below that).
pub fn canonicalize(value: &Value) -> String {
    let mut out = String::new();
    write_value(value, &mut out);
    out
}

/// Canonical bytes, for hashing.
pub fn canonical_bytes(value: &Value) -> Vec<u8> {
    canonicalize(value).into_bytes()
}

/// Appends the RFC 8785 text of `value` to `out` (what `canonicalize` returns, without a
/// fresh allocation: the rollout's encoder writes events with it).
pub fn write_value(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            if keys.iter().all(|k| k.is_ascii()) {
                keys.sort_unstable();
            } else {
                keys.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
            }
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                write_value(&map[key], out);
            }
            out.push('}');
        }
    }
}

fn write_number(n: &Number, out: &mut String) {
    if let Some(i) = n.as_i64() {
        let _ = write!(out, "{i}");
    } else if let Some(u) = n.as_u64() {
        let _ = write!(out, "{u}");
    } else if let Some(f) = n.as_f64() {
        if f == 0.0 {
            // -0 canonicalises to 0.
            out.push('0');
        } else {
            let mut buf = ryu_js::Buffer::new();
            out.push_str(buf.format_finite(f));
        }
    }
}

/// Whether any byte is a control character, `"` or `\\`: eight bytes at a time (the classic
/// "has a byte less than n" and "has a zero byte" word tricks, exact as a yes/no answer).
fn needs_escape(bytes: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let has_zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS != 0;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let x = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        if x.wrapping_sub(ONES * 0x20) & !x & HIGHS != 0
            || has_zero(x ^ (ONES * b'"' as u64))
            || has_zero(x ^ (ONES * b'\\' as u64))
        {
            return true;
        }
    }
    chunks
        .remainder()
        .iter()
        .any(|&b| b < 0x20 || b == b'"' || b == b'\\')
}

/// Appends `s` as a JSON string with only the escapes RFC 8785 allows; runs without escapes are
/// copied whole.
pub fn write_string(s: &str, out: &mut String) {
    let bytes = s.as_bytes();
    // Most strings (ids, times, text) need no escape: one vectorisable scan, one copy.
    if !needs_escape(bytes) {
        out.reserve(s.len() + 2);
        out.push('"');
        out.push_str(s);
        out.push('"');
        return;
    }
    out.push('"');
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &str = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            0x0C => "\\f",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0..=0x1F => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if esc.is_empty() {
            let _ = write!(out, "\\u{:04x}", b);
        } else {
            out.push_str(esc);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_escape_scan_finds_every_byte_that_needs_one_at_every_position() {
        for len in 0..20 {
            for at in 0..len {
                for b in (0u8..0x20).chain([b'"', b'\\']) {
                    let mut v = vec![b'a'; len];
                    v[at] = b;
                    assert!(needs_escape(&v), "{len} {at} {b}");
                }
                let mut v = vec![b'a'; len];
                for (i, c) in [0x20u8, 0x7f, b'/', b'!', b'#', b'[', b']', b'~']
                    .iter()
                    .cycle()
                    .take(len)
                    .enumerate()
                {
                    v[i] = *c;
                }
                assert!(!needs_escape(&v), "{v:?}");
            }
        }
        assert!(!needs_escape("é€😀 plain".as_bytes()));
    }

    #[test]
    fn a_canonical_number_parses_back_to_itself() {
        // serde_json's default float parser is fast but not correctly rounded: it read this
        // shortest form one unit in the last place off, so the reopened event's hash differed
        // (found by the libFuzzer `validate` target). The workspace enables `float_roundtrip`.
        for text in [
            "-7.3200166666666674e+50",
            "7.3200166666666674e+50",
            "2.2250738585072014e-308",
            "5e-324",
            "1.7976931348623157e+308",
        ] {
            let v: Value = serde_json::from_str(text).unwrap();
            assert_eq!(canonicalize(&v), text);
        }
    }

    #[test]
    fn sorts_keys_by_utf16_code_units() {
        // U+1F600 (surrogate pair D83D..) sorts before U+FB01 in UTF-16 but after it in UTF-8.
        let v = json!({"\u{fb01}": 1, "\u{1F600}": 2, "b": 3, "a": {"z": 1, "y": 2}});
        assert_eq!(
            canonicalize(&v),
            "{\"a\":{\"y\":2,\"z\":1},\"b\":3,\"\u{1F600}\":2,\"\u{fb01}\":1}"
        );
    }

    #[test]
    fn numbers_use_ecmascript_form() {
        let v: Value =
            serde_json::from_str("[1.0, -0.0, 1e21, 1e-7, 0.1, 100, -5, 1.5e300]").unwrap();
        assert_eq!(canonicalize(&v), "[1,0,1e+21,1e-7,0.1,100,-5,1.5e+300]");
    }

    #[test]
    fn strings_use_minimal_escapes() {
        let v = json!("a\"b\\c\n\u{1}\u{7f}é/");
        assert_eq!(canonicalize(&v), "\"a\\\"b\\\\c\\n\\u0001\u{7f}é/\"");
    }
}
