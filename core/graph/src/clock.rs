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

    /// Waits on `cv` until notified or until the clock reaches `deadline_ms`, and no longer:
    /// with no deadline it waits with no timeout (an idle run costs no wake-up; every change a
    /// scheduler waits for notifies `cv`). A manual clock never times out by itself: its
    /// `advance` wakes the waiter (registered with `on_advance`).
    pub fn wait<'a, T>(
        &self,
        cv: &Condvar,
        guard: MutexGuard<'a, T>,
        deadline_ms: Option<i64>,
    ) -> MutexGuard<'a, T> {
        match (self, deadline_ms) {
            (RunClock::System, Some(d)) => {
                let left = Duration::from_millis(u64::try_from(d - self.now_ms()).unwrap_or(0));
                cv.wait_timeout(guard, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            }
            _ => cv.wait(guard).unwrap_or_else(|p| p.into_inner()),
        }
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
