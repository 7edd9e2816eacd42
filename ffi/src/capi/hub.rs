//! The C client's notification router: every notification the core client receives goes to
//! exactly one consumer of this client: the `cc_client_turn` whose turn it belongs to, else the
//! notification callback (if one is set), else the poll queue of `cc_client_next_notification`.
//!
//! There is no thread of its own: whichever consumer waits (a poll, a turn handle, the callback's
//! thread) becomes the one reader of the core inbox while it waits (leader and followers: the
//! others wait on the condition variable), and routes what it reads, so a message for another
//! consumer wakes that consumer at once and none is read twice or lost. A wait without a
//! deadline is untimed all the way down (an idle callback thread costs no wake-up): whatever
//! changes what a waiter may take (a turn resolved or freed, the callback unregistered) also
//! interrupts the reader, which then looks again.

use cc_app_server::client::{Client as CoreClient, NotificationReader};
use cc_app_server::engine::RecvError as CoreRecv;
use cc_app_server::rollout::sync::lock;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// Who is asking for the next notification.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Who {
    /// `cc_client_next_notification`.
    Poll,
    /// The callback's thread: takes from the poll queue while its registration `generation` is
    /// the current one (so nothing is taken after an unregistration).
    Callback { generation: u64 },
    /// A `cc_client_turn`.
    Turn(u64),
}

/// What a wait ended with.
pub(super) enum Next {
    Message(String),
    Timeout,
    /// The client is closed and this consumer's queue is drained.
    Closed,
    /// The turn's `turn/completed` was handed out already (a `Who::Turn` only).
    Ended,
    /// The callback was unregistered (a `Who::Callback` only).
    Stopped,
}

struct TurnQueue {
    thread_id: String,
    /// `None` until `turn/start` answered: meanwhile every message of the thread is held in
    /// `tentative` with its turn id, to be sorted when the id is known.
    turn_id: Option<String>,
    tentative: Vec<(Option<String>, String)>,
    queue: VecDeque<String>,
    /// The turn's `turn/completed` has been queued: later messages are not this turn's.
    completed: bool,
}

#[derive(Default)]
struct State {
    poll: VecDeque<String>,
    turns: HashMap<u64, TurnQueue>,
    next_turn: u64,
    /// A consumer is waiting on the core inbox.
    reading: bool,
    /// The untimed reader's stop flag and its inbox, to interrupt it (`interrupt_reader`).
    untimed: Option<(Arc<AtomicBool>, NotificationReader)>,
    closed: bool,
    /// The current callback registration (0: none).
    callback: u64,
}

#[derive(Default)]
pub(super) struct Hub {
    state: Mutex<State>,
    changed: Condvar,
}

/// The thread and turn a notification is about: `params.threadId`, and `params.turnId` or (for
/// `turn/started` and `turn/completed`) `params.turn.id`; and whether it is a `turn/completed`.
pub(super) fn route_of(v: &Value) -> (Option<&str>, Option<&str>, bool) {
    let params = v.get("params");
    let thread = params
        .and_then(|p| p.get("threadId"))
        .and_then(Value::as_str);
    let turn = params
        .and_then(|p| p.get("turnId"))
        .and_then(Value::as_str)
        .or_else(|| {
            params
                .and_then(|p| p.get("turn"))
                .and_then(|t| t.get("id"))
                .and_then(Value::as_str)
        });
    let completed = v.get("method").and_then(Value::as_str) == Some("turn/completed");
    (thread, turn, completed)
}

impl State {
    /// Gives `text` to the turn it belongs to, else to the poll queue.
    fn route(&mut self, text: String) {
        if self.turns.is_empty() {
            self.poll.push_back(text);
            return;
        }
        let Ok(value) = serde_json::from_str::<Value>(&text) else {
            self.poll.push_back(text);
            return;
        };
        let (thread, turn, completed) = route_of(&value);
        let Some(thread) = thread else {
            self.poll.push_back(text);
            return;
        };
        // Lowest id first: the oldest subscription of a thread sorts first.
        let mut ids: Vec<u64> = self.turns.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let Some(q) = self.turns.get_mut(&id) else {
                continue;
            };
            if q.completed || q.thread_id != thread {
                continue;
            }
            match &q.turn_id {
                None => {
                    q.tentative.push((turn.map(str::to_string), text));
                    return;
                }
                Some(own) if Some(own.as_str()) == turn => {
                    q.queue.push_back(text);
                    q.completed = completed;
                    return;
                }
                Some(_) => {}
            }
        }
        self.poll.push_back(text);
    }
}

impl State {
    /// Makes the consumer blocked untimed on the core inbox (if any) return and look again.
    fn interrupt_reader(&self) {
        if let Some((stop, reader)) = &self.untimed {
            stop.store(true, Ordering::SeqCst);
            reader.wake();
        }
    }
}

impl Hub {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Subscribes to a thread's next turn, before its `turn/start` is sent.
    pub(super) fn subscribe(&self, thread_id: &str) -> u64 {
        let mut s = self.state();
        s.next_turn += 1;
        let id = s.next_turn;
        s.turns.insert(
            id,
            TurnQueue {
                thread_id: thread_id.to_string(),
                turn_id: None,
                tentative: Vec::new(),
                queue: VecDeque::new(),
                completed: false,
            },
        );
        id
    }

    /// `turn/start` answered with `turn_id`: keeps what was held for it, routes the rest again.
    pub(super) fn resolve(&self, id: u64, turn_id: &str) {
        let mut s = self.state();
        let Some(q) = s.turns.get_mut(&id) else {
            return;
        };
        q.turn_id = Some(turn_id.to_string());
        let held = std::mem::take(&mut q.tentative);
        let mut others = Vec::new();
        for (turn, text) in held {
            if q.completed || turn.as_deref() != Some(turn_id) {
                others.push(text);
            } else {
                q.completed = route_of(&serde_json::from_str(&text).unwrap_or(Value::Null)).2;
                q.queue.push_back(text);
            }
        }
        for text in others {
            s.route(text);
        }
        s.interrupt_reader();
        drop(s);
        self.changed.notify_all();
    }

    /// Ends a subscription: what it held and had not handed out is dropped, except messages that
    /// were only held (never this turn's), which go back to the other consumers.
    pub(super) fn unsubscribe(&self, id: u64) {
        let mut s = self.state();
        if let Some(q) = s.turns.remove(&id) {
            for (_, text) in q.tentative {
                s.route(text);
            }
        }
        s.interrupt_reader();
        drop(s);
        self.changed.notify_all();
    }

    /// Starts a callback registration and returns its generation; messages already in the
    /// poll queue go to it first.
    pub(super) fn start_callback(&self) -> u64 {
        let mut s = self.state();
        s.callback = s.callback.wrapping_add(1).max(1);
        s.callback
    }

    /// Ends the current callback registration: the callback's thread takes nothing more.
    pub(super) fn stop_callback(&self) {
        let mut s = self.state();
        s.callback = 0;
        s.interrupt_reader();
        drop(s);
        self.changed.notify_all();
    }

    pub(super) fn callback_set(&self) -> bool {
        self.state().callback != 0
    }

    /// Waits until `deadline` (`None`: without a deadline) for the next notification of `who`.
    pub(super) fn next(&self, core: &CoreClient, who: Who, deadline: Option<Instant>) -> Next {
        let mut s = self.state();
        loop {
            match who {
                Who::Poll => {
                    if let Some(m) = s.poll.pop_front() {
                        return Next::Message(m);
                    }
                }
                Who::Callback { generation } => {
                    if s.callback != generation {
                        return Next::Stopped;
                    }
                    if let Some(m) = s.poll.pop_front() {
                        return Next::Message(m);
                    }
                }
                Who::Turn(id) => match s.turns.get_mut(&id) {
                    None => return Next::Ended,
                    Some(q) => {
                        if let Some(m) = q.queue.pop_front() {
                            return Next::Message(m);
                        }
                        if q.completed {
                            return Next::Ended;
                        }
                    }
                },
            }
            if s.closed {
                return Next::Closed;
            }
            if let Some(d) = deadline {
                if Instant::now() >= d {
                    return Next::Timeout;
                }
            }
            if s.reading {
                s = match deadline {
                    None => self.changed.wait(s).unwrap_or_else(|p| p.into_inner()),
                    Some(d) => {
                        let left = d.saturating_duration_since(Instant::now());
                        self.changed
                            .wait_timeout(s, left)
                            .unwrap_or_else(|p| p.into_inner())
                            .0
                    }
                };
                continue;
            }
            s.reading = true;
            let reader = core.notification_reader();
            let stop = Arc::new(AtomicBool::new(false));
            if deadline.is_none() {
                s.untimed = Some((Arc::clone(&stop), reader.clone()));
            }
            drop(s);
            let got = match deadline {
                None => reader.recv_text_until(&stop),
                Some(d) => reader.recv_text(d.saturating_duration_since(Instant::now())),
            };
            s = self.state();
            s.reading = false;
            s.untimed = None;
            match got {
                Ok(text) => s.route(text),
                Err(CoreRecv::Closed) => s.closed = true,
                Err(CoreRecv::Timeout) => {}
            }
            // Wakes a consumer whose message this was, and lets another take over the reading.
            self.changed.notify_all();
        }
    }
}
