//! The OpenAI-compatible kernel's SSE decoder (`core/kernel/src/openai/sse.rs`, compiled in by path: it
//! is self-contained, and core's `openai` feature would pull tokio, reqwest and rustls into every
//! target) fed arbitrary bytes in arbitrary chunkings. It must never panic; what it decodes — the
//! events, and the error if the stream is refused — must not depend on where the reads split
//! the bytes; and it never holds more than `MAX_LINE_BYTES` of an unfinished line or of an
//! unfinished event. The decoded events then go through `parse_chunk`, `is_progress` and the
//! tool-call assembler, which must not panic either.
//!
//! The bound is the fuzzer's (0 to 4095 bytes, through `SseDecoder::with_max_line_bytes`; the
//! kernel's is `MAX_LINE_BYTES`, 4 MiB, the same code), so small inputs reach it and pass it.
//!
//! Input: byte 0 = n (mod 16), bytes 1-2 = the bound (little-endian, mod 4096), then n chunk
//! lengths (0 counts as 1; cycled), then the stream.
#![no_main]

#[path = "../../core/kernel/src/openai/sse.rs"]
#[allow(dead_code)]
mod sse;

use libfuzzer_sys::fuzz_target;
use sse::{parse_chunk, SseDecoder, SseEvent, ToolCallAssembler};

/// What a whole stream decoded to: every event delivered, then the error that stopped it.
#[derive(Debug, PartialEq)]
struct Outcome {
    events: Vec<String>,
    error: Option<String>,
}

/// Holds the decoder to its memory bound and collects what one call returned.
fn take(
    got: Result<Vec<SseEvent>, String>,
    d: &SseDecoder,
    max: usize,
    events: &mut Vec<String>,
) -> Result<(), String> {
    let (line, data) = d.buffered();
    assert!(
        line <= max,
        "an unfinished line of {line} bytes, bound {max}"
    );
    assert!(
        data <= max,
        "an unfinished event of {data} bytes, bound {max}"
    );
    for SseEvent::Data(data) in got? {
        assert!(
            data.len() <= max,
            "an event of {} bytes, bound {max}",
            data.len()
        );
        events.push(data);
    }
    Ok(())
}

fn decode<'a>(max: usize, chunks: impl Iterator<Item = &'a [u8]>) -> Outcome {
    let mut d = SseDecoder::with_max_line_bytes(max);
    let mut events = Vec::new();
    for chunk in chunks {
        let got = d.feed(chunk);
        if let Err(e) = take(got, &d, max, &mut events) {
            return Outcome {
                events,
                error: Some(e),
            };
        }
    }
    let got = d.finish();
    let error = take(got, &d, max, &mut events).err();
    Outcome { events, error }
}

/// Splits `data` into pieces of the given lengths, cycled.
fn pieces<'a>(data: &'a [u8], lengths: &'a [u8]) -> impl Iterator<Item = &'a [u8]> {
    let mut rest = data;
    let mut i = 0;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let n = (lengths[i % lengths.len()] as usize).max(1).min(rest.len());
        i += 1;
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Some(head)
    })
}

fuzz_target!(|input: &[u8]| {
    let [n, lo, hi, rest @ ..] = input else {
        return;
    };
    let n = (n % 16) as usize;
    let max = u16::from_le_bytes([*lo, *hi]) as usize % 4096;
    if rest.len() < n {
        return;
    }
    let (lengths, stream) = rest.split_at(n);
    // The reference reads one line (its end included) at a time: every event that completes
    // before an error is delivered, as with one-byte reads, which it must equal.
    let reference = decode(max, stream.split_inclusive(|&b| b == b'\n' || b == b'\r'));
    assert_eq!(
        decode(max, stream.chunks(1)),
        reference,
        "one-byte reads differ"
    );
    let whole = decode(max, std::iter::once(stream));
    let lengths = if lengths.is_empty() { &[7] } else { lengths };
    let split = decode(max, pieces(stream, lengths));
    for (name, got) in [("whole", &whole), ("split", &split)] {
        assert_eq!(
            got.error, reference.error,
            "{name}: the error depends on the split"
        );
        if got.error.is_none() {
            assert_eq!(
                got.events, reference.events,
                "{name}: the events depend on the split"
            );
        } else {
            // An error discards the events of the read it happened in: a prefix is delivered.
            assert!(
                reference.events.starts_with(&got.events),
                "{name}: events that line-by-line decoding did not produce"
            );
        }
    }
    let mut calls = ToolCallAssembler::default();
    for data in reference.events.iter().take(4096) {
        match parse_chunk(data) {
            Ok(Some(chunk)) => {
                let _ = chunk.is_progress();
                for d in &chunk.tool_calls {
                    if calls.add(d).is_err() {
                        break;
                    }
                }
            }
            Ok(None) | Err(_) => {}
        }
    }
    for call in calls.finish("fz") {
        assert!(call.arguments.len() <= sse::MAX_ARGUMENT_BYTES);
        assert!(!call.too_long || call.arguments.is_empty());
    }
});
