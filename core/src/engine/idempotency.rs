//! The idempotency cache of one server and the fingerprints a retry must repeat. The requests
//! that consult it (and rebuild a missed entry from the rollout) are in dispatch.rs.

use crate::approval::digest_json;
use crate::protocol::UserInput;
use serde_json::{json, Map, Value};
use std::collections::{HashMap, VecDeque};

/// The idempotency cache: (method, key) → (params fingerprint, result), bounded, oldest evicted
/// first, plus the keys whose first request is still running (a retry waits for it rather than
/// running twice; the cache's lock is never held while a request runs).
#[derive(Default)]
pub(crate) struct IdempotencyCache {
    entries: HashMap<(String, String), (String, Value)>,
    order: VecDeque<(String, String)>,
    pub in_flight: std::collections::HashSet<(String, String)>,
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
