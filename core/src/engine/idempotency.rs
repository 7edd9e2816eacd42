//! The idempotency of one server: the bounded cache of first answers, the keys whose first
//! request still runs, and the fingerprints a retry must repeat. Where a missed entry is found
//! in the rollout is the caller's (dispatch.rs), handed in as a function.

use super::outbound::{RpcError, RpcResult};
use crate::approval::digest_json;
use crate::protocol::{error_code, UserInput};
use crate::rollout::sync::lock;
use serde_json::{json, Map, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex};

/// A request that carried an idempotencyKey: what a retry must repeat to be the same request.
pub(crate) struct Keyed<'a> {
    pub method: &'static str,
    pub key: &'a str,
    pub fingerprint: String,
    /// The new thread the request names (thread/start, thread/fork): a retry must name it too.
    pub names: Option<&'a str>,
    /// The thread a turn/start runs on, where its key is recorded.
    pub thread_id: Option<&'a str>,
}

/// The server's idempotency: the cache, and a signal for when a key leaves `in_flight`.
pub(crate) struct Idempotency {
    cache: Mutex<IdempotencyCache>,
    done: Condvar,
    capacity: usize,
}

/// The (fingerprint, result) the rollout recorded for a key, when the cache has lost it.
pub(crate) type Recorded = Result<Option<(String, Value)>, RpcError>;

impl Idempotency {
    pub fn new(capacity: usize) -> Idempotency {
        Idempotency {
            cache: Mutex::new(IdempotencyCache::default()),
            done: Condvar::new(),
            capacity,
        }
    }

    /// Entries in the cache now.
    pub fn len(&self) -> usize {
        lock(&self.cache).len()
    }

    /// Runs `f` once per (method, idempotencyKey); a retry returns the first result, a reuse of
    /// the key with other params is a conflict. A key the cache does not hold (it is bounded,
    /// and starts empty after a restart) is looked up with `recorded` first, so a retry after a
    /// restart gets the same answer too (thread/start and turn/start; see docs/engine.md).
    pub fn once(
        &self,
        keyed: Option<Keyed<'_>>,
        recorded: impl FnOnce(&Keyed<'_>) -> Recorded,
        f: impl FnOnce() -> RpcResult,
    ) -> RpcResult {
        let Some(keyed) = keyed else {
            return f();
        };
        let (method, key, digest) = (keyed.method, keyed.key, &keyed.fingerprint);
        let slot = (method.to_string(), key.to_string());
        let mut cache = lock(&self.cache);
        // The same key still running (a retry sent before the first was answered): wait for it.
        while cache.in_flight.contains(&slot) {
            cache = self.done.wait(cache).unwrap_or_else(|p| p.into_inner());
        }
        // A thread/start or thread/fork retry that names its new thread must name the same one.
        let same = |seen: &str, result: &Value| {
            let same_thread = keyed.names.is_none_or(|n| result["thread"]["id"] == n);
            if seen == digest && same_thread {
                Ok(result.clone())
            } else {
                Err(RpcError::new(
                    error_code::CONFLICT,
                    "idempotencyKey was already used with different params",
                ))
            }
        };
        if let Some((seen, result)) = cache.get(method, key) {
            return same(seen, result);
        }
        cache.in_flight.insert(slot.clone());
        drop(cache);
        // Not in the cache: the rollout records the keys of thread/start and turn/start, so the
        // first request's answer is rebuilt from there rather than running the request twice.
        let (outcome, entry) = match recorded(&keyed) {
            Err(e) => (Err(e), None),
            Ok(Some((seen, result))) => (same(&seen, &result), Some((seen, result))),
            Ok(None) => {
                let outcome = f();
                let entry = outcome.as_ref().ok().map(|r| (digest.clone(), r.clone()));
                (outcome, entry)
            }
        };
        let mut cache = lock(&self.cache);
        cache.in_flight.remove(&slot);
        if let Some((seen, result)) = entry {
            cache.put(method, key, seen, result, self.capacity);
        }
        drop(cache);
        self.done.notify_all();
        outcome
    }
}

/// The idempotency cache: (method, key) → (params fingerprint, result), bounded, oldest evicted
/// first, plus the keys whose first request is still running (a retry waits for it rather than
/// running twice; the cache's lock is never held while a request runs).
#[derive(Default)]
struct IdempotencyCache {
    entries: HashMap<(String, String), (String, Value)>,
    order: VecDeque<(String, String)>,
    in_flight: std::collections::HashSet<(String, String)>,
}

impl IdempotencyCache {
    pub fn get(&self, method: &str, key: &str) -> Option<&(String, Value)> {
        self.entries.get(&(method.to_string(), key.to_string()))
    }

    pub fn put(&mut self, method: &str, key: &str, digest: String, result: Value, capacity: usize) {
        let k = (method.to_string(), key.to_string());
        if self.entries.insert(k.clone(), (digest, result)).is_none() {
            self.order.push_back(k);
        }
        while self.order.len() > capacity {
            if let Some(old) = self.order.pop_front() {
                self.entries.remove(&old);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

/// What a thread/start retry must repeat to count as the same request: the members the header
/// records (so the check survives a restart).
pub(crate) fn thread_start_fingerprint(
    title: Option<&str>,
    metadata: &Map<String, Value>,
    agent_options: &Value,
) -> String {
    digest_json(&json!({"title": title, "metadata": metadata, "agentOptions": agent_options}))
}

/// What a turn/start retry must repeat: the thread and the input, as `turnStarted` records them.
pub(crate) fn turn_start_fingerprint(thread_id: &str, input: &[UserInput]) -> String {
    digest_json(&json!({"threadId": thread_id, "input": input}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn idempotency_cache_is_bounded_and_evicts_the_oldest() {
        let mut cache = IdempotencyCache::default();
        for i in 0..1024 {
            cache.put("turn/start", &format!("k{i}"), "d".into(), json!(i), 1024);
        }
        assert_eq!(cache.len(), 1024);
        assert!(cache.get("turn/start", "k0").is_some());
        cache.put("turn/start", "k1024", "d".into(), json!(1024), 1024);
        assert_eq!(cache.len(), 1024);
        assert!(
            cache.get("turn/start", "k0").is_none(),
            "the oldest went first"
        );
        assert_eq!(
            cache.get("turn/start", "k1024").map(|e| &e.1),
            Some(&json!(1024))
        );
        // Same key under another method is another entry.
        assert!(cache.get("thread/start", "k5").is_none());
    }
}
