//! The run clock behind leases and wall-time budgets, replaceable so tests move time by hand:
//! lease expiry is then a decision taken on a known instant, never a race against a sleep.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

/// A clock that only moves when told to; waiters are woken on every advance.
#[derive(Default)]
pub struct ManualClock {
    now: Mutex<i64>,
    wakers: Mutex<Vec<Weak<dyn Fn() + Send + Sync>>>,
}

impl ManualClock {
    pub fn new(start_ms: i64) -> Arc<Self> {
        Arc::new(ManualClock {
            now: Mutex::new(start_ms),
            wakers: Mutex::new(Vec::new()),
        })
    }

    /// Moves time forward and wakes everything waiting on this clock.
    pub fn advance(&self, by: Duration) {
        *self.now.lock().unwrap_or_else(|p| p.into_inner()) += by.as_millis() as i64;
        let wakers: Vec<_> = {
            let mut w = self.wakers.lock().unwrap_or_else(|p| p.into_inner());
            w.retain(|x| x.strong_count() > 0);
            w.clone()
        };
        for w in wakers.iter().filter_map(Weak::upgrade) {
            w();
        }
    }
}

/// The clock a run uses: the system's, or a manual one shared with a test.
#[derive(Clone, Default)]
pub enum RunClock {
    #[default]
    System,
    Manual(Arc<ManualClock>),
}

impl RunClock {
    pub fn now_ms(&self) -> i64 {
        match self {
            RunClock::System => crate::time::now_unix_millis(),
            RunClock::Manual(m) => *m.now.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// Waits on `cv` until notified or until the clock reaches `deadline_ms`. A manual clock
    /// never times out by itself: its `advance` wakes the waiter (registered with `on_advance`).
    /// The real-time cap keeps a lost notification from hanging anything for long.
    pub fn wait<'a, T>(
        &self,
        cv: &Condvar,
        guard: MutexGuard<'a, T>,
        deadline_ms: Option<i64>,
    ) -> MutexGuard<'a, T> {
        let cap = Duration::from_millis(250);
        let timeout = match (self, deadline_ms) {
            (RunClock::System, Some(d)) => {
                Duration::from_millis((d - self.now_ms()).clamp(0, 250) as u64)
            }
            _ => cap,
        };
        cv.wait_timeout(guard, timeout)
            .unwrap_or_else(|p| p.into_inner())
            .0
    }

    pub fn on_advance(&self, waker: Weak<dyn Fn() + Send + Sync>) {
        if let RunClock::Manual(m) = self {
            m.wakers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(waker);
        }
    }
}
