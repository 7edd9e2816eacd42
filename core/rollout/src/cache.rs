//! The tail cache: the newest events of recently used threads, kept as the exact JSON text of
//! each event, so `thread/read`/`thread/resume` of recent history and the turn-boundary scan a
//! thread needs when it is first touched are served from memory. Events enter it from a commit
//! (already checked) or from a disk read (checked once, on the way in), never unchecked.
//!
//! Bounded three ways: events and bytes per thread, and bytes overall; beyond the overall budget
//! the least recently used threads' tails are dropped whole. A tail is always a contiguous run of
//! seqs ending at the thread's published head, so "is this range cached" is a comparison.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

/// What one cached line costs beyond its bytes (the Arc's counters, the queue slot).
const ENTRY_OVERHEAD: usize = 32;
/// What one cached thread costs beyond its lines (map entry, id, counters).
const THREAD_OVERHEAD: usize = 128;

/// The cache's bounds (`StoreOptions::tail_cache_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLimits {
    /// Events kept per thread.
    pub events_per_thread: usize,
    /// Bytes kept per thread (its lines and its header).
    pub bytes_per_thread: usize,
    /// Bytes kept over all threads; beyond it the least recently used tails go.
    pub total_bytes: usize,
}

struct Tail {
    /// Seq of `lines[0]`; with no lines, the seq after the head (so the tail still says where
    /// the head is and covers reads that start there).
    first: u64,
    lines: VecDeque<Arc<str>>,
    /// The thread's header (seq 1), kept apart: every load of a thread's options reads it.
    header: Option<Arc<str>>,
    bytes: usize,
    used: u64,
}

impl Tail {
    fn last(&self) -> u64 {
        self.first + self.lines.len() as u64 - 1
    }

    fn cost(&self) -> usize {
        self.bytes + THREAD_OVERHEAD
    }
}

struct Inner {
    threads: HashMap<String, Tail>,
    bytes: usize,
    clock: u64,
    evicted_threads: u64,
}

pub(crate) struct TailCache {
    inner: Mutex<Inner>,
    limits: CacheLimits,
}

/// A cached range: the lines of seqs `first..`, and the head seq the tail ends at.
pub(crate) struct Hit {
    pub lines: Vec<Arc<str>>,
    pub head: u64,
}

fn line_cost(line: &str) -> usize {
    line.len() + ENTRY_OVERHEAD
}

impl TailCache {
    pub fn new(limits: CacheLimits) -> Self {
        TailCache {
            inner: Mutex::new(Inner {
                threads: HashMap::new(),
                bytes: 0,
                clock: 0,
                evicted_threads: 0,
            }),
            limits,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn enabled(&self) -> bool {
        self.limits.events_per_thread > 0
            && self.limits.bytes_per_thread > 0
            && self.limits.total_bytes > 0
    }

    /// Events `first_seq..` were committed (the new head is the last of them): extends the
    /// thread's tail, or restarts it if it no longer joins.
    pub fn committed(&self, id: &str, first_seq: u64, lines: &[Arc<str>]) {
        if !self.enabled() || lines.is_empty() {
            return;
        }
        let mut g = self.lock();
        g.clock += 1;
        let used = g.clock;
        let inner = &mut *g;
        let tail = inner.threads.entry(id.to_string()).or_insert_with(|| {
            inner.bytes += THREAD_OVERHEAD;
            Tail {
                first: first_seq,
                lines: VecDeque::new(),
                header: None,
                bytes: 0,
                used,
            }
        });
        tail.used = used;
        if tail.first + tail.lines.len() as u64 != first_seq {
            // Does not join (the tail was dropped meanwhile and restarted elsewhere): start over.
            let freed: usize = tail.lines.iter().map(|l| line_cost(l)).sum();
            tail.lines.clear();
            tail.bytes -= freed;
            inner.bytes -= freed;
            tail.first = first_seq;
        }
        for l in lines {
            tail.bytes += line_cost(l);
            inner.bytes += line_cost(l);
            tail.lines.push_back(Arc::clone(l));
        }
        Self::trim(tail, &mut inner.bytes, self.limits);
        self.evict(&mut g);
    }

    /// Older events `first_seq..` read (and checked) from disk, ending right before the cached
    /// tail, or at the head `head` when the thread has none: joins them at the front, newest
    /// first, within the per-thread bounds.
    pub fn read_from_disk(&self, id: &str, first_seq: u64, lines: &[Arc<str>], head: u64) {
        if !self.enabled() || lines.is_empty() {
            return;
        }
        let end = first_seq + lines.len() as u64 - 1;
        let mut g = self.lock();
        g.clock += 1;
        let used = g.clock;
        let inner = &mut *g;
        match inner.threads.get_mut(id) {
            Some(tail) if tail.first == end + 1 => {
                tail.used = used;
                for l in lines.iter().rev() {
                    if tail.lines.len() >= self.limits.events_per_thread
                        || tail.bytes + line_cost(l) > self.limits.bytes_per_thread
                    {
                        break;
                    }
                    tail.bytes += line_cost(l);
                    inner.bytes += line_cost(l);
                    tail.lines.push_front(Arc::clone(l));
                    tail.first -= 1;
                }
            }
            Some(_) => return,
            None if end == head => {
                let mut tail = Tail {
                    first: end + 1,
                    lines: VecDeque::new(),
                    header: None,
                    bytes: 0,
                    used,
                };
                for l in lines.iter().rev() {
                    if tail.lines.len() >= self.limits.events_per_thread
                        || tail.bytes + line_cost(l) > self.limits.bytes_per_thread
                    {
                        break;
                    }
                    tail.bytes += line_cost(l);
                    tail.lines.push_front(Arc::clone(l));
                    tail.first -= 1;
                }
                inner.bytes += tail.cost();
                inner.threads.insert(id.to_string(), tail);
            }
            None => return,
        }
        self.evict(&mut g);
    }

    /// The lines of seqs `after+1 ..= after+limit` (clipped at the head), if the tail holds
    /// them all.
    pub fn get(&self, id: &str, after: u64, limit: usize) -> Option<Hit> {
        let mut g = self.lock();
        g.clock += 1;
        let used = g.clock;
        let tail = g.threads.get_mut(id)?;
        if after + 1 < tail.first {
            return None;
        }
        tail.used = used;
        let head = tail.last();
        let lines = if after >= head {
            Vec::new()
        } else {
            let from = (after + 1 - tail.first) as usize;
            let n = ((head - after) as usize).min(limit);
            tail.lines.range(from..from + n).cloned().collect()
        };
        Some(Hit { lines, head })
    }

    /// The newest `limit` cached events before seq `before` (which must be inside or just after
    /// the tail): (first seq, lines).
    pub fn before(&self, id: &str, before: u64, limit: usize) -> Option<(u64, Vec<Arc<str>>)> {
        let mut g = self.lock();
        g.clock += 1;
        let used = g.clock;
        let tail = g.threads.get_mut(id)?;
        if tail.lines.is_empty() || before <= tail.first || before > tail.last() + 1 {
            return None;
        }
        tail.used = used;
        let end = (before - tail.first) as usize; // exclusive index
        let start = end.saturating_sub(limit);
        Some((
            tail.first + start as u64,
            tail.lines.range(start..end).cloned().collect(),
        ))
    }

    /// The thread's header line, if cached.
    pub fn header(&self, id: &str) -> Option<Arc<str>> {
        let mut g = self.lock();
        let tail = g.threads.get_mut(id)?;
        if let Some(h) = &tail.header {
            return Some(Arc::clone(h));
        }
        (tail.first == 1)
            .then(|| tail.lines.front().cloned())
            .flatten()
    }

    /// Keeps a header read from disk (only for a thread that already has a tail, or a new one).
    pub fn put_header(&self, id: &str, line: Arc<str>, head: u64) {
        if !self.enabled() || line_cost(&line) > self.limits.bytes_per_thread / 2 {
            return;
        }
        let mut g = self.lock();
        g.clock += 1;
        let used = g.clock;
        let inner = &mut *g;
        let tail = inner.threads.entry(id.to_string()).or_insert_with(|| {
            inner.bytes += THREAD_OVERHEAD;
            Tail {
                first: head + 1,
                lines: VecDeque::new(),
                header: None,
                bytes: 0,
                used,
            }
        });
        if tail.header.is_none() {
            tail.bytes += line_cost(&line);
            inner.bytes += line_cost(&line);
            tail.header = Some(line);
        }
        self.evict(&mut g);
    }

    /// The thread is gone (a creation that never completed was discarded).
    pub fn forget(&self, id: &str) {
        let mut g = self.lock();
        if let Some(t) = g.threads.remove(id) {
            g.bytes -= t.cost();
        }
    }

    /// (threads with a tail, bytes held, threads whose tail was dropped for the budget).
    pub fn usage(&self) -> (usize, usize, u64) {
        let g = self.lock();
        (g.threads.len(), g.bytes, g.evicted_threads)
    }

    fn trim(tail: &mut Tail, total: &mut usize, limits: CacheLimits) {
        while !tail.lines.is_empty()
            && (tail.lines.len() > limits.events_per_thread || tail.bytes > limits.bytes_per_thread)
        {
            let l = tail.lines.pop_front().expect("non-empty");
            tail.first += 1;
            if tail.first == 2
                && tail.header.is_none()
                && line_cost(&l) <= limits.bytes_per_thread / 4
            {
                // The header leaves the tail but stays, apart (every load reads it).
                tail.header = Some(l);
                continue;
            }
            tail.bytes -= line_cost(&l);
            *total -= line_cost(&l);
        }
        if tail.bytes > limits.bytes_per_thread {
            if let Some(h) = tail.header.take() {
                tail.bytes -= line_cost(&h);
                *total -= line_cost(&h);
            }
        }
    }

    /// Drops whole tails, least recently used first, until the cache is back under 7/8 of its
    /// budget (so the scan for the oldest is paid once per many inserts).
    fn evict(&self, g: &mut Inner) {
        if g.bytes <= self.limits.total_bytes {
            return;
        }
        let target = self.limits.total_bytes / 8 * 7;
        let mut by_age: Vec<(u64, String)> =
            g.threads.iter().map(|(k, t)| (t.used, k.clone())).collect();
        by_age.sort_unstable();
        for (_, k) in by_age {
            if g.bytes <= target {
                break;
            }
            if let Some(t) = g.threads.remove(&k) {
                g.bytes -= t.cost();
                g.evicted_threads += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(n: usize) -> Arc<str> {
        Arc::from("x".repeat(n))
    }

    fn limits(events: usize, thread_bytes: usize, total: usize) -> CacheLimits {
        CacheLimits {
            events_per_thread: events,
            bytes_per_thread: thread_bytes,
            total_bytes: total,
        }
    }

    #[test]
    fn the_event_bound_keeps_exactly_the_newest() {
        let c = TailCache::new(limits(4, 1 << 20, 1 << 20));
        c.committed("t", 1, &[line(10), line(10), line(10), line(10)]);
        let hit = c.get("t", 0, 10).expect("4 events: the bound, all kept");
        assert_eq!((hit.lines.len(), hit.head), (4, 4));
        c.committed("t", 5, &[line(10)]);
        assert!(c.get("t", 0, 10).is_none(), "5th event: seq 1 left");
        let hit = c.get("t", 1, 10).unwrap();
        assert_eq!((hit.lines.len(), hit.head), (4, 5));
        // A read past the head is served (empty) without the disk.
        assert_eq!(c.get("t", 5, 10).unwrap().lines.len(), 0);
    }

    #[test]
    fn the_thread_byte_bound_is_exact() {
        let per = line_cost(&line(100));
        let c = TailCache::new(limits(100, 3 * per, 1 << 20));
        c.committed("t", 1, &[line(100), line(100), line(100)]);
        assert_eq!(c.get("t", 0, 10).unwrap().lines.len(), 3, "at the bound");
        c.committed("t", 4, &[line(100)]);
        let hit = c.get("t", 1, 10).unwrap();
        assert_eq!(hit.lines.len(), 3, "one byte past it drops the oldest");
        assert!(c.get("t", 0, 10).is_none());
    }

    #[test]
    fn the_total_budget_drops_the_least_recently_used_thread() {
        let per = line_cost(&line(1000)) + THREAD_OVERHEAD;
        let c = TailCache::new(limits(10, 1 << 20, 3 * per));
        c.committed("a", 1, &[line(1000)]);
        c.committed("b", 1, &[line(1000)]);
        c.committed("c", 1, &[line(1000)]);
        assert_eq!(c.usage().0, 3, "three threads fit the budget exactly");
        assert!(c.get("a", 0, 1).is_some()); // a is now the most recently used
        c.committed("d", 1, &[line(1000)]);
        assert!(c.get("b", 0, 1).is_none(), "b was the least recently used");
        assert!(c.get("a", 0, 1).is_some());
        assert!(c.get("d", 0, 1).is_some());
        assert!(c.usage().1 <= 3 * per);
    }

    #[test]
    fn disk_reads_join_at_the_front_and_commits_at_the_back() {
        let c = TailCache::new(limits(10, 1 << 20, 1 << 20));
        c.read_from_disk("t", 5, &[line(1), line(2)], 6);
        let hit = c.get("t", 4, 10).unwrap();
        assert_eq!((hit.lines.len(), hit.head), (2, 6));
        c.read_from_disk("t", 2, &[line(1), line(1), line(1)], 6);
        assert_eq!(c.get("t", 1, 10).unwrap().lines.len(), 5);
        // A read that does not join is not kept.
        c.read_from_disk("u", 1, &[line(1)], 9);
        assert!(c.get("u", 0, 1).is_none());
        c.committed("t", 7, &[line(3)]);
        assert_eq!(c.get("t", 1, 10).unwrap().head, 7);
        let (first, lines) = c.before("t", 7, 2).unwrap();
        assert_eq!((first, lines.len()), (5, 2));
    }
}
