//! The stdio line framer (`cli/src/framing.rs`) against a three-line model of what docs/cli.md
//! promises: every `\n`-terminated piece is one frame — the line itself when it fits the cap
//! (inclusive), one `TooLong` otherwise — a final piece without `\n` counts when non-empty, the
//! stream stays in sync after an over-long line, and read sizes or `Interrupted` errors never
//! change the result.
#![no_main]

use arbitrary::Arbitrary;
use cc_app_server_fuzz::framing::{Frame, LineFramer};
use libfuzzer_sys::fuzz_target;
use std::io::{self, Read};

#[derive(Debug, Arbitrary)]
struct Input {
    max: u16,
    /// Per-read sizes, cycled (0 becomes an `Interrupted` error).
    steps: Vec<u16>,
    /// Repeat the data to reach past the framer's 64 KiB chunk now and then.
    repeat: u8,
    data: Vec<u8>,
}

struct Trickle<'a> {
    data: &'a [u8],
    steps: &'a [u16],
    i: usize,
    interrupted: bool,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let step = if self.steps.is_empty() {
            usize::MAX
        } else {
            self.steps[self.i % self.steps.len()] as usize
        };
        self.i += 1;
        // Never twice in a row, so a source of only zeros still makes progress.
        if step == 0 && !self.interrupted && !self.data.is_empty() {
            self.interrupted = true;
            return Err(io::Error::from(io::ErrorKind::Interrupted));
        }
        self.interrupted = false;
        let n = step.max(1).min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

#[derive(Debug, PartialEq)]
enum Expect {
    Line(Vec<u8>),
    TooLong,
}

fn model(data: &[u8], max: usize) -> Vec<Expect> {
    let mut out = Vec::new();
    let mut pieces: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
    let last = pieces.pop().unwrap_or_default();
    for p in pieces {
        out.push(if p.len() <= max {
            Expect::Line(p.to_vec())
        } else {
            Expect::TooLong
        });
    }
    if !last.is_empty() {
        out.push(if last.len() <= max {
            Expect::Line(last.to_vec())
        } else {
            Expect::TooLong
        });
    }
    out
}

fuzz_target!(|input: Input| {
    let max = input.max as usize;
    let mut data = input.data.clone();
    if input.repeat > 200 && !data.is_empty() {
        // Up to ~4 chunks' worth: crosses the 64 KiB read buffer at many offsets.
        let times = (256 * 1024 / data.len()).clamp(1, (input.repeat - 200) as usize * 64);
        data = data.repeat(times);
    }
    let steps: Vec<u16> = input.steps.iter().take(64).copied().collect();
    let mut framer = LineFramer::new(
        Trickle {
            data: &data,
            steps: &steps,
            i: 0,
            interrupted: false,
        },
        max,
    );
    let want = model(&data, max);
    let mut got = Vec::new();
    loop {
        match framer
            .next_frame()
            .expect("the source only fails with Interrupted")
        {
            Frame::Eof => break,
            Frame::Line(l) => {
                assert!(l.len() <= max, "a line longer than the cap was delivered");
                assert!(!l.contains(&b'\n'), "a delivered line contains a newline");
                got.push(Expect::Line(l));
            }
            Frame::TooLong { seen } => {
                assert!(seen > max, "TooLong reported at {seen} bytes, cap {max}");
                got.push(Expect::TooLong);
            }
        }
        assert!(
            got.len() <= want.len(),
            "more frames than lines: {got:?} vs {want:?}"
        );
    }
    assert_eq!(got, want);
    // EOF is sticky.
    assert_eq!(framer.next_frame().unwrap(), Frame::Eof);
});
