//! The turn runners: a bounded pool of OS threads that run kernels, with a bounded queue of
//! admitted turns in front of it. The kernel trait is synchronous (hosts implement it through
//! uniffi), so a running turn holds one thread; bounding the threads bounds the engine, and the
//! queue gives the `queued` state a meaning. Threads are created on demand up to the bound; all
//! but one retire after sitting idle for 30 s, and that one (the keeper) waits with no timeout,
//! so an idle server holds at most one runner and no timer (docs/engine.md, "Idle").

use super::turn::{self, Job};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long a runner thread waits for work before it retires.
const IDLE_RETIRE: Duration = Duration::from_secs(30);

#[derive(Default)]
struct PoolState {
    queue: VecDeque<Job>,
    /// Turns admitted and not yet finished: queued, running, or between admission and queueing.
    admitted: usize,
    running: usize,
    workers: usize,
    idle: usize,
    handles: Vec<JoinHandle<()>>,
    shutdown: bool,
}

/// What the pool looks like now (for stats).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PoolUsage {
    pub running: usize,
    pub queued: usize,
    pub workers: usize,
}

pub(crate) struct TurnPool {
    /// Runner threads the OS refused to create.
    pub spawn_failures: AtomicU64,
    state: Mutex<PoolState>,
    work: Condvar,
    max_running: usize,
    max_queued: usize,
}

/// Why a turn could not be handed to a runner.
pub(crate) enum SubmitError {
    /// No runner exists and none could be created; the job comes back to be closed as failed.
    NoRunner(Job),
    /// The server is shutting down; the job comes back to be closed as interrupted.
    ShuttingDown(Job),
}

impl TurnPool {
    pub fn new(max_running: usize, max_queued: usize) -> Arc<TurnPool> {
        Arc::new(TurnPool {
            spawn_failures: AtomicU64::new(0),
            state: Mutex::new(PoolState::default()),
            work: Condvar::new(),
            max_running: max_running.max(1),
            max_queued,
        })
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserves room for one more turn, or says how long to wait: at most `max_running` run and
    /// `max_queued` wait at once. Every successful `admit` is matched by one `release` (done by
    /// the runner when the turn ends, or by the caller if it never submits).
    pub fn admit(&self) -> Result<(), u64> {
        let mut s = self.lock();
        if s.shutdown || s.admitted >= self.max_running + self.max_queued {
            // Roughly one turn's worth per queued turn ahead, at least 100 ms, at most 10 s.
            let ahead = (s.admitted + 1).saturating_sub(self.max_running) as u64;
            return Err((ahead * 50).clamp(100, 10_000));
        }
        s.admitted += 1;
        Ok(())
    }

    pub fn release(&self) {
        let mut s = self.lock();
        s.admitted = s.admitted.saturating_sub(1);
    }

    /// Queues an admitted turn and makes sure a runner will take it.
    pub fn submit(self: &Arc<Self>, job: Job) -> Result<(), SubmitError> {
        let mut s = self.lock();
        if s.shutdown {
            return Err(SubmitError::ShuttingDown(job));
        }
        s.queue.push_back(job);
        if s.idle > s.queue.len().saturating_sub(1) || s.workers >= self.max_running {
            // An idle runner will take it, or every runner is busy and it waits its turn.
            drop(s);
            self.work.notify_one();
            return Ok(());
        }
        s.handles.retain(|h| !h.is_finished());
        let pool = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("cc-turn-runner".into())
            .spawn(move || pool.worker());
        match spawned {
            Ok(h) => {
                s.workers += 1;
                s.handles.push(h);
                Ok(())
            }
            Err(e) => {
                self.spawn_failures.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    target: "cc_app_server::turn",
                    "could not start a turn runner thread ({e}); {} runner(s) remain",
                    s.workers
                );
                if s.workers == 0 {
                    let job = s.queue.pop_back().expect("pushed above");
                    return Err(SubmitError::NoRunner(job));
                }
                // A runner exists: the turn waits in the queue for it.
                Ok(())
            }
        }
    }

    /// Takes a turn that is still waiting for a runner out of the queue (it was interrupted).
    pub fn remove_queued(&self, turn_id: &str) -> Option<Job> {
        let mut s = self.lock();
        let i = s.queue.iter().position(|j| j.turn.id == turn_id)?;
        s.queue.remove(i)
    }

    pub fn usage(&self) -> PoolUsage {
        let s = self.lock();
        PoolUsage {
            running: s.running,
            queued: s.queue.len(),
            workers: s.workers,
        }
    }

    /// Stops taking work: returns the turns still queued (to be closed as interrupted) and the
    /// runner threads to join once their kernels have been cancelled.
    pub fn shutdown(&self) -> (Vec<Job>, Vec<JoinHandle<()>>) {
        let mut s = self.lock();
        s.shutdown = true;
        let queued: Vec<Job> = s.queue.drain(..).collect();
        let handles = std::mem::take(&mut s.handles);
        drop(s);
        self.work.notify_all();
        (queued, handles)
    }

    fn worker(self: Arc<Self>) {
        loop {
            let job = {
                let mut s = self.lock();
                loop {
                    if let Some(job) = s.queue.pop_front() {
                        s.running += 1;
                        break Some(job);
                    }
                    if s.shutdown {
                        s.workers -= 1;
                        break None;
                    }
                    // The first idle runner is the keeper: it waits with no timeout, so an idle
                    // server has no timer at all; the surplus retire after IDLE_RETIRE.
                    let keeper = s.idle == 0;
                    s.idle += 1;
                    let timed_out = if keeper {
                        s = self.work.wait(s).unwrap_or_else(|p| p.into_inner());
                        false
                    } else {
                        let (g, timeout) = self
                            .work
                            .wait_timeout(s, IDLE_RETIRE)
                            .unwrap_or_else(|p| p.into_inner());
                        s = g;
                        timeout.timed_out()
                    };
                    s.idle -= 1;
                    if timed_out && s.queue.is_empty() {
                        // Retire in the same critical section that saw the queue empty, so a
                        // `submit` never counts on a runner that is leaving.
                        s.workers -= 1;
                        break None;
                    }
                }
            };
            let Some(job) = job else {
                return;
            };
            // `run` catches kernel panics itself; this keeps the pool's books right even if the
            // engine's own code panicked, so a bug costs one turn, not a runner slot forever.
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| turn::run(job))).is_err() {
                tracing::error!(target: "cc_app_server::turn", "a turn runner panicked");
            }
            let mut s = self.lock();
            s.running -= 1;
            s.admitted = s.admitted.saturating_sub(1);
        }
    }
}
