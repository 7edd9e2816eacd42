//! Trace and parent ids of rollout events (docs/rollout-format.md, "Trace and parent ids").
//!
//! A host may send a W3C Trace Context `traceparent` with the requests that record a causal
//! tree (thread/start, thread/fork, turn/start, graph/run). Every event that request causes
//! carries its trace id (`traceId`), and `parentId` names the event that caused each one:
//! - `"12"`: the event with that seq in the same log;
//! - `"span:<16 hex>"`: the caller's span (the first event of a traced request);
//! - `"event:<64 hex>"`: the event with that hash in another log (a fork's header names the
//!   source event it was forked at; a graph attempt's turn names its run's event).
//!
//! So a host rebuilds the causal tree of a turn or a run from the rollout alone, and joins it to
//! its own traces (and to the server's `tracing` spans, which carry the same `trace_id`).

/// A request's trace: its trace id and the caller's span (when the caller sent one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// 32 lowercase hex digits, not all zeros.
    pub id: String,
    /// The first event's `parentId`: `span:<16 hex>` of the caller's span, if it sent one.
    pub caller: Option<String>,
}

impl Trace {
    /// A trace of its own (16 random bytes), for a turn or a run whose caller sent none.
    pub fn fresh() -> Trace {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).expect("the OS random source is available");
        Trace {
            id: cc_agent_protocol::hex_lower(&bytes),
            caller: None,
        }
    }

    /// The caller's `traceparent` if it sent one, else a fresh trace.
    pub fn of_request(traceparent: Option<&str>) -> Result<Trace, String> {
        traceparent.map_or_else(|| Ok(Trace::fresh()), parse_traceparent)
    }
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Reads a version-00 `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`, lowercase, neither id all
/// zeros). The error says what is wrong, for a -32602.
pub fn parse_traceparent(text: &str) -> Result<Trace, String> {
    let parts: Vec<&str> = text.split('-').collect();
    let shape_ok = parts.len() == 4
        && parts[0] == "00"
        && [32, 16, 2]
            .iter()
            .zip(&parts[1..])
            .all(|(n, p)| p.len() == *n && is_lower_hex(p));
    if !shape_ok {
        return Err(
            "traceparent: expected a W3C traceparent of version 00: 00-<32 lowercase hex>-<16 lowercase hex>-<2 hex>"
                .into(),
        );
    }
    if parts[1].bytes().all(|b| b == b'0') {
        return Err("traceparent: the trace id is all zeros (invalid in W3C Trace Context)".into());
    }
    if parts[2].bytes().all(|b| b == b'0') {
        return Err(
            "traceparent: the parent id is all zeros (invalid in W3C Trace Context)".into(),
        );
    }
    Ok(Trace {
        id: parts[1].to_string(),
        caller: Some(format!("span:{}", parts[2])),
    })
}

/// `parentId` naming the event `seq` of the same log.
pub fn seq_ref(seq: u64) -> String {
    seq.to_string()
}

/// `parentId` naming the event of another log whose hash is `hash` (64 hex).
pub fn event_ref(hash: &str) -> String {
    format!("event:{hash}")
}

/// The seq a same-log `parentId` names (`None` for a span, another log's event, or nothing).
pub fn parent_seq(parent_id: Option<&str>) -> Option<u64> {
    let p = parent_id?;
    if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    p.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_is_read_strictly() {
        let t =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(t.id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.caller.as_deref(), Some("span:00f067aa0ba902b7"));
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        ] {
            assert!(parse_traceparent(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_fresh_trace_is_32_hex_and_differs() {
        let (a, b) = (Trace::fresh(), Trace::fresh());
        assert_eq!(a.id.len(), 32);
        assert!(is_lower_hex(&a.id) && a.caller.is_none());
        assert_ne!(a.id, b.id);
    }

    #[test]
    fn only_a_decimal_parent_is_a_seq() {
        assert_eq!(parent_seq(Some(&seq_ref(12))), Some(12));
        assert_eq!(parent_seq(Some("span:0000000000000012")), None);
        assert_eq!(parent_seq(Some(&event_ref(&"a".repeat(64)))), None);
        assert_eq!(parent_seq(Some("")), None);
        assert_eq!(parent_seq(None), None);
    }
}
