//! Serialising an event exactly once on the write path: the payload is walked one time into its
//! RFC 8785 (JCS) members, and those same bytes make the hash input, the line on disk, the SQLite
//! payload column and (spliced by the engine) the notification. Before this, a delta was
//! serialised three or four times between the kernel and the host.
//!
//! The line keeps the payload's `type` member first (readers and people look for it there) and
//! the other members in JCS order; the hash input is the plain JCS form. Both are assembled from
//! the same member texts, so they cannot disagree.

use serde_json::{Map, Value};

/// The payload, once: every member as `"key":value` JCS text, back to back in one buffer (one
/// allocation per event, not two per member), and each member's place in it, in JCS key order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EncodedPayload {
    /// The members' texts in the order the payload had them; for a payload that is not an
    /// object, its JCS text alone.
    text: String,
    /// Each member's (start, end of key, end) in `text`, in JCS key order.
    spans: Vec<(usize, usize, usize)>,
    object: bool,
    /// Index of the `type` member in `spans`, if any.
    type_at: Option<usize>,
}

impl EncodedPayload {
    /// Encodes an object payload (anything else is encoded as its JCS text alone).
    pub fn new(payload: &Value) -> EncodedPayload {
        let mut text = String::with_capacity(128);
        let Value::Object(map) = payload else {
            write_value(payload, &mut text);
            return EncodedPayload {
                text,
                spans: Vec::new(),
                object: false,
                type_at: None,
            };
        };
        let mut spans = Vec::with_capacity(map.len());
        for (k, v) in map {
            let start = text.len();
            write_string(k, &mut text);
            let key_end = text.len();
            text.push(':');
            write_value(v, &mut text);
            spans.push((start, key_end, text.len()));
        }
        sort_members(map, &text, &mut spans);
        let type_at = spans
            .iter()
            .position(|&(s, k, _)| &text[s..k] == "\"type\"");
        EncodedPayload {
            text,
            spans,
            object: true,
            type_at,
        }
    }

    /// `{"type":"itemDelta","turnId":…,"itemId":…,"delta":{"type":"text","text":…}}` encoded
    /// straight from its parts, byte for byte what `new` gives for that value (a test holds the
    /// two equal): the hot path of a streaming turn, with no value tree to build, walk and free.
    pub fn text_delta(turn_id: &str, item_id: &str, text: &str) -> EncodedPayload {
        let mut out = String::with_capacity(text.len() + turn_id.len() + item_id.len() + 72);
        let mut member = |key: &str, value: &dyn Fn(&mut String)| {
            let start = out.len();
            out.push_str(key);
            let key_end = out.len();
            out.push(':');
            value(&mut out);
            (start, key_end, out.len())
        };
        let ty = member("\"type\"", &|o| o.push_str("\"itemDelta\""));
        let turn = member("\"turnId\"", &|o| write_string(turn_id, o));
        let item = member("\"itemId\"", &|o| write_string(item_id, o));
        let delta = member("\"delta\"", &|o| {
            o.push_str("{\"text\":");
            write_string(text, o);
            o.push_str(",\"type\":\"text\"}");
        });
        EncodedPayload {
            text: out,
            // JCS order: delta, itemId, turnId, type.
            spans: vec![delta, item, turn, ty],
            object: true,
            type_at: Some(3),
        }
    }

    fn member(&self, i: usize) -> &str {
        let (s, _, e) = self.spans[i];
        &self.text[s..e]
    }

    /// The JCS text (what the hash covers).
    pub fn write_jcs(&self, out: &mut String) {
        if !self.object {
            out.push_str(&self.text);
            return;
        }
        out.push('{');
        for i in 0..self.spans.len() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(self.member(i));
        }
        out.push('}');
    }

    /// The text written on the line: `type` first, then the other members in JCS order.
    pub fn write_line(&self, out: &mut Vec<u8>) {
        if !self.object {
            out.extend_from_slice(self.text.as_bytes());
            return;
        }
        out.push(b'{');
        let mut first = true;
        let mut put = |out: &mut Vec<u8>, member: &str| {
            if !first {
                out.push(b',');
            }
            first = false;
            out.extend_from_slice(member.as_bytes());
        };
        if let Some(t) = self.type_at {
            put(out, self.member(t));
        }
        for i in 0..self.spans.len() {
            if Some(i) != self.type_at {
                put(out, self.member(i));
            }
        }
        out.push(b'}');
    }

    /// Bytes of the encoded members (for sizing buffers).
    pub fn len_hint(&self) -> usize {
        self.text.len() + self.spans.len() + 2
    }
}

/// Sorts encoded members by their keys' UTF-16 code units (RFC 8785 §3.2.3); keys that need no
/// escape (all of ours) compare the same byte-wise, so the UTF-16 comparison runs only when a key
/// needs it.
fn sort_members(map: &Map<String, Value>, text: &str, spans: &mut [(usize, usize, usize)]) {
    let key = |&(s, k, _): &(usize, usize, usize)| &text[s..k];
    // A key of printable ASCII without a quote or a backslash is written as itself, so its text
    // orders as its UTF-16 code units do; an escaped one (a control character, a quote) would not.
    let plain = |k: &String| {
        k.bytes()
            .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    };
    if map.keys().all(plain) {
        spans.sort_unstable_by(|a, b| key(a).cmp(key(b)));
    } else {
        // Compare the raw keys, found again by decoding the encoded text.
        spans.sort_by(|a, b| {
            let ka: String = serde_json::from_str(key(a)).unwrap_or_default();
            let kb: String = serde_json::from_str(key(b)).unwrap_or_default();
            ka.encode_utf16().cmp(kb.encode_utf16())
        });
    }
}

pub(crate) use cc_agent_protocol::jcs::{write_string, write_value};

/// Decimal digits of `n` without the formatting machinery or a temporary string (a seq in every
/// sealed line, a count in every listed thread).
pub fn push_u64(out: &mut String, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.push_str(std::str::from_utf8(&buf[i..]).expect("ASCII digits"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn jcs(v: &Value) -> String {
        let mut s = String::new();
        write_value(v, &mut s);
        s
    }

    #[test]
    fn matches_the_reference_canonicalisation() {
        let cases = [
            json!({"\u{fb01}": 1, "\u{1F600}": 2, "b": 3, "a": {"z": 1, "y": 2}}),
            serde_json::from_str::<Value>("[1.0, -0.0, 1e21, 1e-7, 0.1, 100, -5, 1.5e300]")
                .unwrap(),
            json!("a\"b\\c\n\u{1}\u{7f}é/\t\r\u{8}\u{c}\u{1f}"),
            json!({"type": "itemDelta", "turnId": "t", "itemId": "i", "delta": {"type": "text", "text": "x\ny"}}),
            json!({"nested": [{"b": null, "a": true}, [], {}], "n": 18446744073709551615u64, "m": -9007199254740991i64}),
            // ASCII keys whose escapes would sort them differently from their raw text.
            json!({"a\u{1}": 1, "a ": 2, "a\"": 3, "a#": 4, "a\\": 5, "a]": 6, "type": "t",
                   "in": {"a\u{1}": 1, "a ": 2, "a\"": 3, "a\\": 5, "a]": 6}}),
            json!({}),
        ];
        for v in cases {
            assert_eq!(jcs(&v), cc_agent_protocol::jcs::canonicalize(&v), "{v}");
            let p = EncodedPayload::new(&v);
            let mut s = String::new();
            p.write_jcs(&mut s);
            assert_eq!(s, cc_agent_protocol::jcs::canonicalize(&v), "{v}");
        }
    }

    #[test]
    fn push_u64_writes_decimal_digits() {
        for n in [0u64, 7, 9, 10, 99, 100, 1_234_567_890, u64::MAX] {
            let mut s = String::from("x");
            push_u64(&mut s, n);
            assert_eq!(s, format!("x{n}"));
        }
    }

    #[test]
    fn the_line_form_puts_type_first_and_parses_to_the_same_value() {
        let v = json!({"turnId": "t", "type": "itemDelta", "itemId": "i", "delta": {"type": "text", "text": "é\"x"}});
        let p = EncodedPayload::new(&v);
        let mut line = Vec::new();
        p.write_line(&mut line);
        let text = String::from_utf8(line).unwrap();
        assert!(text.starts_with("{\"type\":\"itemDelta\","), "{text}");
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), v);
        assert!(p.len_hint() >= text.len());
    }
}

#[cfg(test)]
mod shed_tests {
    use crate::{CheckedEvent, NewEvent};
    use serde_json::json;

    /// A shed payload comes back whole from `into_inner` (for a store that seals from the
    /// parsed form); a kind something looks into is never shed.
    #[test]
    fn a_shed_payload_comes_back_whole_and_only_hot_kinds_are_shed() {
        let delta = json!({"type": "itemDelta", "turnId": "t", "itemId": "i", "delta": {"type": "text", "text": "a\u{1}\"é"}});
        let mut c = CheckedEvent::new(NewEvent::new(delta.clone())).unwrap();
        c.shed_payload();
        assert!(c.event().payload.is_null());
        assert_eq!(c.into_inner().payload, delta);
        let resolved = json!({
            "type": "approvalResolved", "turnId": "t1", "itemId": "tool-1",
            "nonce": "0123456789abcdef0123456789abcdef", "outcome": "declined",
            "decision": {"kind": "decline"}, "failure": null
        });
        let mut c = CheckedEvent::new(NewEvent::new(resolved.clone())).unwrap();
        c.shed_payload();
        assert_eq!(c.event().payload, resolved, "not a hot kind: kept");
    }
}

#[cfg(test)]
mod text_delta_tests {
    use super::EncodedPayload;
    use crate::{CheckedEvent, NewEvent, MAX_TEXT_CHARS};
    use serde_json::{json, Value};

    fn value(turn: &str, item: &str, text: &str) -> Value {
        json!({"type": "itemDelta", "turnId": turn, "itemId": item, "delta": {"type": "text", "text": text}})
    }

    /// The direct encoding is byte for byte the generic one: the same hash input, the same line.
    #[test]
    fn a_text_delta_encodes_exactly_as_its_value_does() {
        let texts = [
            "",
            "plain",
            "a\"b\\c\n\u{1}\u{7f}é/\t\r\u{8}\u{c}\u{1f}",
            "\u{1F600} \u{fb01} \u{2028}\u{2029}",
            &"x".repeat(10_000),
        ];
        for text in texts {
            for (turn, item) in [("tu-1", "tu-1-i1"), ("T", "i_9-"), (&*"a".repeat(128), "b")] {
                let direct = EncodedPayload::text_delta(turn, item, text);
                assert_eq!(
                    direct,
                    EncodedPayload::new(&value(turn, item, text)),
                    "{text:?}"
                );
            }
        }
    }

    /// Accepted directly exactly when the schema accepts it; refused ones go the generic way.
    #[test]
    fn a_text_delta_is_checked_directly_as_the_schema_checks_it() {
        let long_ok = "é".repeat(MAX_TEXT_CHARS); // 2,000,000 bytes, at the character bound
        let long_bad = "x".repeat(MAX_TEXT_CHARS + 1);
        let id128 = "a".repeat(128);
        let id129 = "a".repeat(129);
        let cases: Vec<(&str, &str, &str)> = vec![
            ("t", "i", "ok"),
            (&id128, &id128, "ok"),
            ("t", "i", &long_ok),
            ("t", "i", &long_bad),
            (&id129, "i", "x"),
            ("t", &id129, "x"),
            ("", "i", "x"),
            ("t", "", "x"),
            ("_t", "i", "x"),
            ("t", "-i", "x"),
            ("t", "../x", "x"),
            ("t", "a b", "x"),
            ("t", "é", "x"),
            ("t\n", "i", "x"),
        ];
        for (turn, item, text) in cases {
            let generic = CheckedEvent::new(NewEvent::new(value(turn, item, text)));
            let direct = CheckedEvent::text_delta(turn, item, text);
            assert_eq!(
                direct.is_some(),
                generic.is_ok(),
                "turn {turn:?} item {item:?} text of {} chars",
                text.chars().count()
            );
            if let (Some(d), Ok(mut g)) = (direct, generic) {
                g.shed_payload();
                assert!(d.event().payload.is_null());
                assert_eq!(d.into_inner().payload, g.into_inner().payload);
            }
        }
    }

    #[test]
    fn the_text_bound_is_the_schemas() {
        let text = &cc_agent_protocol::schema()["$defs"]["Text"];
        assert_eq!(text["maxLength"].as_u64(), Some(MAX_TEXT_CHARS as u64));
    }
}
