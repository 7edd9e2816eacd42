//! RFC 8785 (JSON Canonicalization Scheme): the one byte form we hash, so that a digest never
//! depends on key order, whitespace or number spelling.

use serde_json::Value;

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

fn write_value(value: &Value, out: &mut String) {
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
            keys.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
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

fn write_number(n: &serde_json::Number, out: &mut String) {
    if let Some(i) = n.as_i64() {
        out.push_str(&i.to_string());
    } else if let Some(u) = n.as_u64() {
        out.push_str(&u.to_string());
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

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
