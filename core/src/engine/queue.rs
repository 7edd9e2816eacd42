//! A bounded queue of serialised messages, capped by count and by bytes, with blocking, timed and
//! async receive. It is the only buffer between the engine and a host, so nothing in it can grow
//! without limit: a full inbound queue refuses (the host retries); a full outbound queue makes the
//! engine wait for the host, and closes only when the host takes nothing for a stall deadline.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// Why a push was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushError {
    /// Count or byte cap reached; the queue is unchanged.
    Full,
    /// The queue is closed.
    Closed,
}

/// Why a receive returned nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvError {
    /// Nothing arrived within the timeout.
    Timeout,
    /// The queue is closed and drained.
    Closed,
}

struct State {
    items: VecDeque<String>,
    bytes: usize,
    closed: bool,
    wakers: Vec<Waker>,
    /// When the consumer last took a message: a producer waiting for space measures the
    /// consumer's stall from here (or from when it started waiting, if later).
    last_pop: Instant,
    /// Threads blocked in `recv` / waiting for space: a push or a pop signals a condition
    /// variable only when someone waits on it (a futex call per message otherwise).
    readers_waiting: usize,
    writers_waiting: usize,
}

/// Caps: at most `max_messages` messages and `max_bytes` bytes queued at once.
pub struct BoundedQueue {
    state: Mutex<State>,
    ready: Condvar,
    /// Signalled when a message is taken or the queue closes (producers waiting for space).
    space: Condvar,
    /// Signalled when the queue closes (`wait_closed`).
    shut: Condvar,
    max_messages: usize,
    max_bytes: usize,
}

impl BoundedQueue {
    pub fn new(max_messages: usize, max_bytes: usize) -> Arc<Self> {
        Arc::new(BoundedQueue {
            state: Mutex::new(State {
                items: VecDeque::new(),
                bytes: 0,
                closed: false,
                wakers: Vec::new(),
                last_pop: Instant::now(),
                readers_waiting: 0,
                writers_waiting: 0,
            }),
            ready: Condvar::new(),
            space: Condvar::new(),
            shut: Condvar::new(),
            max_messages,
            max_bytes,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fits(&self, s: &State, len: usize) -> bool {
        // An empty queue takes any one message, so a message larger than the byte cap cannot
        // wedge a producer that waits for space.
        s.items.is_empty() || (s.items.len() < self.max_messages && s.bytes + len <= self.max_bytes)
    }

    fn push_locked(&self, mut s: std::sync::MutexGuard<'_, State>, message: String) {
        s.bytes += message.len();
        s.items.push_back(message);
        let wakers = std::mem::take(&mut s.wakers);
        let waiting = s.readers_waiting > 0;
        drop(s);
        if waiting {
            self.ready.notify_one();
        }
        wakers.into_iter().for_each(Waker::wake);
    }

    /// Adds a message without blocking, or refuses it.
    pub fn try_push(&self, message: String) -> Result<(), PushError> {
        let s = self.lock();
        if s.closed {
            return Err(PushError::Closed);
        }
        if s.items.len() >= self.max_messages || s.bytes + message.len() > self.max_bytes {
            return Err(PushError::Full);
        }
        self.push_locked(s, message);
        Ok(())
    }

    /// Adds a message, waiting for space while the consumer keeps taking messages. `Full` only
    /// when the queue stayed full and the consumer took nothing for `stall` (measured from the
    /// later of its last take and the start of this wait): a slow reader is waited for, a reader
    /// that stopped is not.
    pub fn push_waiting(&self, message: String, stall: Duration) -> Result<(), PushError> {
        let started = Instant::now();
        let mut s = self.lock();
        loop {
            if s.closed {
                return Err(PushError::Closed);
            }
            if self.fits(&s, message.len()) {
                self.push_locked(s, message);
                return Ok(());
            }
            let since = s.last_pop.max(started);
            let now = Instant::now();
            let deadline = since + stall;
            if now >= deadline {
                return Err(PushError::Full);
            }
            s.writers_waiting += 1;
            s = self
                .space
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            s.writers_waiting -= 1;
        }
    }

    /// Adds a message even when the queue is at its caps (only a closed queue refuses), and
    /// says whether it is now over them. For the commit path, which must never wait on a host:
    /// the producer whose events these are waits instead (`wait_for_room`), so a queue exceeds
    /// its caps by at most the events already in flight when it filled (docs/engine.md).
    pub fn force_push(&self, message: String) -> Result<bool, PushError> {
        let s = self.lock();
        if s.closed {
            return Err(PushError::Closed);
        }
        let over =
            s.items.len() + 1 > self.max_messages || s.bytes + message.len() > self.max_bytes;
        self.push_locked(s, message);
        Ok(over)
    }

    /// Waits until the queue is under its caps (or closed), with `push_waiting`'s stall rule:
    /// `Full` only when it stayed at its caps and the consumer took nothing for `stall`.
    pub fn wait_for_room(&self, stall: Duration) -> Result<(), PushError> {
        let started = Instant::now();
        let mut s = self.lock();
        loop {
            if s.closed {
                return Err(PushError::Closed);
            }
            if s.items.len() < self.max_messages && s.bytes < self.max_bytes {
                return Ok(());
            }
            let since = s.last_pop.max(started);
            let now = Instant::now();
            let deadline = since + stall;
            if now >= deadline {
                return Err(PushError::Full);
            }
            s.writers_waiting += 1;
            s = self
                .space
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            s.writers_waiting -= 1;
        }
    }

    fn popped(&self, s: &mut State, item: &str) {
        s.bytes -= item.len();
        s.last_pop = Instant::now();
        if s.writers_waiting > 0 {
            self.space.notify_all();
        }
    }

    /// Takes the next message, waiting up to `timeout` (`None`: wait until one arrives or close).
    pub fn recv(&self, timeout: Option<Duration>) -> Result<String, RecvError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut s = self.lock();
        loop {
            if let Some(item) = s.items.pop_front() {
                self.popped(&mut s, &item);
                return Ok(item);
            }
            if s.closed {
                return Err(RecvError::Closed);
            }
            let wait = match deadline {
                None => None,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Err(RecvError::Timeout);
                    }
                    Some(d - now)
                }
            };
            s.readers_waiting += 1;
            s = match wait {
                None => self.ready.wait(s).unwrap_or_else(|p| p.into_inner()),
                Some(t) => {
                    self.ready
                        .wait_timeout(s, t)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
            s.readers_waiting -= 1;
        }
    }

    /// Takes the next message, waiting with no timeout until one arrives, the queue closes, or
    /// `stop` is set (then `Timeout`; whoever sets it calls [`BoundedQueue::wake_readers`]). A
    /// quiet queue costs its reader no wake-up at all (docs/engine.md, "Idle").
    pub fn recv_until(&self, stop: &AtomicBool) -> Result<String, RecvError> {
        let mut s = self.lock();
        loop {
            if let Some(item) = s.items.pop_front() {
                self.popped(&mut s, &item);
                return Ok(item);
            }
            if s.closed {
                return Err(RecvError::Closed);
            }
            // Read under the lock: `wake_readers` takes it after the flag is set, so a reader
            // either sees the flag here or is already waiting when the signal comes.
            if stop.load(Ordering::SeqCst) {
                return Err(RecvError::Timeout);
            }
            s.readers_waiting += 1;
            s = self.ready.wait(s).unwrap_or_else(|p| p.into_inner());
            s.readers_waiting -= 1;
        }
    }

    /// Wakes every reader blocked in `recv` / `recv_until`, so one whose stop flag was just set
    /// returns (the others see nothing new and wait again).
    pub fn wake_readers(&self) {
        let s = self.lock();
        drop(s);
        self.ready.notify_all();
    }

    /// Blocks until the queue is closed, with no timeout and no polling.
    pub fn wait_closed(&self) {
        let mut s = self.lock();
        while !s.closed {
            s = self.shut.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Takes the next message when one is ready (no waiting).
    pub fn try_recv(&self) -> Option<String> {
        let mut s = self.lock();
        let item = s.items.pop_front()?;
        self.popped(&mut s, &item);
        Some(item)
    }

    /// A future that resolves to the next message, or `Closed`.
    pub fn recv_async(self: &Arc<Self>) -> RecvFuture {
        RecvFuture {
            queue: Arc::clone(self),
        }
    }

    /// Closes the queue: pushes fail, receivers drain what is left and then see `Closed`.
    pub fn close(&self) {
        let mut s = self.lock();
        s.closed = true;
        let wakers = std::mem::take(&mut s.wakers);
        drop(s);
        self.ready.notify_all();
        self.space.notify_all();
        self.shut.notify_all();
        wakers.into_iter().for_each(Waker::wake);
    }

    /// Closes and drops everything still queued (a host that stopped reading).
    pub fn close_and_clear(&self) {
        let mut s = self.lock();
        s.items.clear();
        s.bytes = 0;
        drop(s);
        self.close();
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// (messages, bytes) queued now.
    pub fn usage(&self) -> (usize, usize) {
        let s = self.lock();
        (s.items.len(), s.bytes)
    }
}

/// See [`BoundedQueue::recv_async`].
pub struct RecvFuture {
    queue: Arc<BoundedQueue>,
}

impl Future for RecvFuture {
    type Output = Result<String, RecvError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = self.queue.lock();
        if let Some(item) = s.items.pop_front() {
            self.queue.popped(&mut s, &item);
            return Poll::Ready(Ok(item));
        }
        if s.closed {
            return Poll::Ready(Err(RecvError::Closed));
        }
        s.wakers.push(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_cap_is_exact() {
        let q = BoundedQueue::new(2, 1000);
        q.try_push("a".into()).unwrap();
        q.try_push("b".into()).unwrap();
        assert_eq!(q.try_push("c".into()), Err(PushError::Full));
        assert_eq!(q.recv(Some(Duration::ZERO)).unwrap(), "a");
        q.try_push("c".into()).unwrap();
    }

    #[test]
    fn byte_cap_is_exact() {
        let q = BoundedQueue::new(100, 10);
        q.try_push("12345".into()).unwrap();
        q.try_push("12345".into()).unwrap();
        assert_eq!(q.try_push("1".into()), Err(PushError::Full));
        assert_eq!(q.usage(), (2, 10));
    }

    /// The default bounds (docs/engine.md) at their edges: 256 / 4 MiB inbound, 512 / 8 MiB outbound.
    #[test]
    fn default_caps_at_the_limit_and_one_past_it() {
        let limits = crate::engine::Limits::default();
        for (messages, bytes) in [
            (limits.inbound_messages, limits.inbound_bytes),
            (limits.outbound_messages, limits.outbound_bytes),
        ] {
            let q = BoundedQueue::new(messages, bytes);
            for _ in 0..messages {
                q.try_push("m".into()).unwrap();
            }
            assert_eq!(
                q.try_push("m".into()),
                Err(PushError::Full),
                "message {}",
                messages + 1
            );
            let q = BoundedQueue::new(messages, bytes);
            q.try_push("x".repeat(bytes - 1)).unwrap();
            q.try_push("y".into()).unwrap();
            assert_eq!(q.usage(), (2, bytes));
            assert_eq!(
                q.try_push("z".into()),
                Err(PushError::Full),
                "byte {}",
                bytes + 1
            );
        }
        assert_eq!(
            (limits.inbound_messages, limits.inbound_bytes),
            (256, 4 << 20)
        );
        assert_eq!(
            (limits.outbound_messages, limits.outbound_bytes),
            (512, 8 << 20)
        );
    }

    #[test]
    fn a_waiting_push_waits_for_a_slow_consumer_and_gives_up_on_a_stopped_one() {
        let q = BoundedQueue::new(2, 1000);
        q.try_push("a".into()).unwrap();
        q.try_push("b".into()).unwrap();
        // A consumer taking one message every 20 ms keeps a producer with a 200 ms stall
        // deadline going for far longer than that deadline.
        let q2 = Arc::clone(&q);
        let consumer = std::thread::spawn(move || {
            let mut got = 0;
            while got < 30 {
                std::thread::sleep(Duration::from_millis(20));
                if q2.recv(Some(Duration::from_secs(5))).is_ok() {
                    got += 1;
                }
            }
        });
        for i in 0..28 {
            q.push_waiting(format!("m{i}"), Duration::from_millis(200))
                .unwrap_or_else(|e| panic!("message {i}: {e:?}"));
        }
        consumer.join().unwrap();
        // Nobody takes anything now: the wait ends after the stall deadline with Full.
        q.try_push("x".into()).unwrap();
        q.try_push("y".into()).unwrap();
        let t = Instant::now();
        assert_eq!(
            q.push_waiting("z".into(), Duration::from_millis(100)),
            Err(PushError::Full)
        );
        assert!(t.elapsed() >= Duration::from_millis(100));
        q.close();
        assert_eq!(
            q.push_waiting("z".into(), Duration::from_secs(10)),
            Err(PushError::Closed)
        );
    }

    #[test]
    fn a_forced_push_goes_past_the_caps_and_says_so_and_room_is_waited_for() {
        let q = BoundedQueue::new(2, 1000);
        assert_eq!(q.force_push("a".into()), Ok(false));
        assert_eq!(q.force_push("b".into()), Ok(false), "at the cap: not over");
        assert_eq!(q.force_push("c".into()), Ok(true), "one past the cap");
        assert_eq!(q.usage(), (3, 3));
        let q2 = Arc::clone(&q);
        let consumer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            q2.recv(None).unwrap();
            q2.recv(None).unwrap();
        });
        assert_eq!(q.wait_for_room(Duration::from_secs(5)), Ok(()));
        consumer.join().unwrap();
        assert!(q.usage().0 < 2);
        q.try_push("x".into()).unwrap();
        assert_eq!(
            q.wait_for_room(Duration::from_millis(50)),
            Err(PushError::Full),
            "nobody takes anything: the stall deadline ends the wait"
        );
        q.close();
        assert_eq!(q.force_push("z".into()), Err(PushError::Closed));
    }

    #[test]
    fn close_drains_then_reports_closed() {
        let q = BoundedQueue::new(4, 100);
        q.try_push("x".into()).unwrap();
        q.close();
        assert_eq!(q.try_push("y".into()), Err(PushError::Closed));
        assert_eq!(q.recv(None).unwrap(), "x");
        assert_eq!(q.recv(None), Err(RecvError::Closed));
        assert_eq!(
            q.recv(Some(Duration::from_millis(1))),
            Err(RecvError::Closed)
        );
    }

    /// A minimal executor: polls, parks until woken.
    fn block_on<F: Future>(fut: F) -> F::Output {
        struct Unpark(std::thread::Thread);
        impl std::task::Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut fut = std::pin::pin!(fut);
        loop {
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                return v;
            }
            std::thread::park_timeout(Duration::from_secs(5));
        }
    }

    #[test]
    fn async_recv_wakes_on_push_and_on_close() {
        let q = BoundedQueue::new(4, 100);
        let q2 = Arc::clone(&q);
        let pusher = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            q2.try_push("async".into()).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            q2.close();
        });
        assert_eq!(block_on(q.recv_async()), Ok("async".to_string()));
        assert_eq!(block_on(q.recv_async()), Err(RecvError::Closed));
        pusher.join().unwrap();
    }

    #[test]
    fn recv_until_waits_untimed_and_returns_on_push_stop_and_close() {
        let q = BoundedQueue::new(4, 100);
        let stop = Arc::new(AtomicBool::new(false));
        let (q2, stop2) = (Arc::clone(&q), Arc::clone(&stop));
        let reader = std::thread::spawn(move || {
            let first = q2.recv_until(&stop2);
            let second = q2.recv_until(&stop2);
            (first, second)
        });
        std::thread::sleep(Duration::from_millis(20));
        q.try_push("one".into()).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        stop.store(true, Ordering::SeqCst);
        q.wake_readers();
        let (first, second) = reader.join().unwrap();
        assert_eq!(first, Ok("one".to_string()));
        assert_eq!(
            second,
            Err(RecvError::Timeout),
            "the stop flag ends the wait"
        );
        // A message already queued is still taken before the flag is looked at; close wins too.
        q.try_push("two".into()).unwrap();
        assert_eq!(q.recv_until(&stop), Ok("two".to_string()));
        let q3 = Arc::clone(&q);
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            q3.close();
        });
        q.wait_closed();
        closer.join().unwrap();
        assert_eq!(
            q.recv_until(&AtomicBool::new(false)),
            Err(RecvError::Closed)
        );
    }

    #[test]
    fn timed_recv_times_out_and_wakes_on_push() {
        let q = BoundedQueue::new(4, 100);
        assert_eq!(
            q.recv(Some(Duration::from_millis(5))),
            Err(RecvError::Timeout)
        );
        let q2 = Arc::clone(&q);
        let t = std::thread::spawn(move || q2.recv(Some(Duration::from_secs(30))));
        std::thread::sleep(Duration::from_millis(10));
        q.try_push("late".into()).unwrap();
        assert_eq!(t.join().unwrap().unwrap(), "late");
    }
}
