//! Line framing for the stdio transport: splits a byte stream into `\n`-terminated lines without
//! ever holding more than the line cap, so a peer that sends a gigabyte without a newline costs us
//! one cap's worth of memory, gets one error, and the stream stays in sync after its next newline.

use std::io::{self, Read};

/// Bytes asked of the source per read: large enough to amortise syscalls, small next to the cap.
const CHUNK: usize = 64 * 1024;

/// What the framer found next.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// One line, without its `\n` (a final line without `\n` at end of input counts too).
    Line(Vec<u8>),
    /// A line longer than the cap. Reported as soon as the cap is passed; the rest of that line is
    /// then discarded up to and including its `\n`. `seen` is how many bytes were seen so far.
    TooLong { seen: usize },
    /// End of input.
    Eof,
}

/// Reads lines of at most `max` bytes (not counting the `\n`) from `src`.
pub struct LineFramer<R> {
    src: R,
    chunk: Box<[u8]>,
    start: usize,
    end: usize,
    line: Vec<u8>,
    max: usize,
    /// Inside an over-long line that was already reported: drop bytes until the next `\n`.
    discarding: bool,
    eof: bool,
}

impl<R: Read> LineFramer<R> {
    pub fn new(src: R, max: usize) -> Self {
        LineFramer {
            src,
            chunk: vec![0u8; CHUNK].into_boxed_slice(),
            start: 0,
            end: 0,
            line: Vec::new(),
            max,
            discarding: false,
            eof: false,
        }
    }

    /// The next frame. I/O errors other than `Interrupted` are returned as is.
    pub fn next_frame(&mut self) -> io::Result<Frame> {
        loop {
            if self.start < self.end {
                let window = &self.chunk[self.start..self.end];
                match window.iter().position(|&b| b == b'\n') {
                    Some(i) => {
                        let piece_end = self.start + i;
                        let piece = self.start..piece_end;
                        self.start = piece_end + 1;
                        if self.discarding {
                            self.discarding = false;
                            continue;
                        }
                        let len = self.line.len() + piece.len();
                        if len > self.max {
                            self.line.clear();
                            return Ok(Frame::TooLong { seen: len });
                        }
                        self.line.extend_from_slice(&self.chunk[piece]);
                        return Ok(Frame::Line(std::mem::take(&mut self.line)));
                    }
                    None => {
                        let n = window.len();
                        self.start = self.end;
                        if self.discarding {
                            continue;
                        }
                        let len = self.line.len() + n;
                        if len > self.max {
                            self.line = Vec::new();
                            self.discarding = true;
                            return Ok(Frame::TooLong { seen: len });
                        }
                        let (s, e) = (self.end - n, self.end);
                        self.line.extend_from_slice(&self.chunk[s..e]);
                    }
                }
            }
            if self.eof {
                return Ok(Frame::Eof);
            }
            match self.src.read(&mut self.chunk) {
                Ok(0) => {
                    self.eof = true;
                    self.start = 0;
                    self.end = 0;
                    if !self.discarding && !self.line.is_empty() {
                        return Ok(Frame::Line(std::mem::take(&mut self.line)));
                    }
                    return Ok(Frame::Eof);
                }
                Ok(n) => {
                    self.start = 0;
                    self.end = n;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source that hands out at most `step` bytes per read, to cross chunk boundaries.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.step.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    fn frames(data: &[u8], max: usize, step: usize) -> Vec<Frame> {
        let mut f = LineFramer::new(Trickle { data, step }, max);
        let mut out = Vec::new();
        loop {
            let frame = f.next_frame().unwrap();
            let done = frame == Frame::Eof;
            out.push(frame);
            if done {
                return out;
            }
        }
    }

    #[test]
    fn splits_lines_and_keeps_a_final_unterminated_one() {
        for step in [1, 3, 1000] {
            assert_eq!(
                frames(b"ab\n\ncd\nef", 10, step),
                vec![
                    Frame::Line(b"ab".to_vec()),
                    Frame::Line(vec![]),
                    Frame::Line(b"cd".to_vec()),
                    Frame::Line(b"ef".to_vec()),
                    Frame::Eof
                ]
            );
        }
    }

    #[test]
    fn cap_is_exact_and_the_stream_resyncs() {
        for step in [1, 2, 5, 4096] {
            let data = b"12345\n123456\nok\n1234567890123\nlast\n";
            let got = frames(data, 5, step);
            assert_eq!(got[0], Frame::Line(b"12345".to_vec()), "step {step}");
            assert!(
                matches!(got[1], Frame::TooLong { seen } if seen >= 6),
                "{got:?}"
            );
            assert_eq!(got[2], Frame::Line(b"ok".to_vec()));
            assert!(matches!(got[3], Frame::TooLong { .. }));
            assert_eq!(got[4], Frame::Line(b"last".to_vec()));
            assert_eq!(got[5], Frame::Eof);
            assert_eq!(got.len(), 6);
        }
    }

    #[test]
    fn never_buffers_more_than_the_cap() {
        let mut data = vec![b'x'; 10 * CHUNK];
        data.extend_from_slice(b"\nok\n");
        let mut f = LineFramer::new(&data[..], 1000);
        assert!(matches!(f.next_frame().unwrap(), Frame::TooLong { .. }));
        assert!(f.line.capacity() <= 1000 + CHUNK);
        assert_eq!(f.next_frame().unwrap(), Frame::Line(b"ok".to_vec()));
        assert_eq!(f.next_frame().unwrap(), Frame::Eof);
    }

    #[test]
    fn over_long_final_line_without_newline_is_reported_once() {
        assert_eq!(
            frames(b"abcdefgh", 3, 2),
            vec![Frame::TooLong { seen: 4 }, Frame::Eof]
        );
    }
}
