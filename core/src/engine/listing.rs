//! thread/list and thread/read answers written straight into their JSON text: a page of
//! thread summaries from the store's index, a page of events as the store's own JSON lines
//! from its tail cache. Nothing is decoded into a value tree and serialised again, which is
//! what used to make an in-process list no faster than a pipe to a child process.

use super::outbound::{cap, RpcError};
use super::{lock, Inner, ThreadData};
use crate::protocol::{ForkOrigin, ThreadListParams, ThreadStatus};
use crate::rollout::{push_u64, write_json_string, ListQuery, SummaryRef};
use serde_json::{Map, Value};

/// The wire `Thread` (the published one), member for member as the generated type serialises
/// it; `revision` is the last event's seq, `parentThreadId` the fork origin's thread.
pub(crate) struct ThreadJson<'a> {
    pub id: &'a str,
    pub title: Option<&'a str>,
    pub status: ThreadStatus,
    pub created_at: &'a str,
    pub updated_at: &'a str,
    pub last_event_seq: u64,
    pub forked_from: Option<&'a ForkOrigin>,
    pub metadata: &'a Map<String, Value>,
}

impl<'a> ThreadJson<'a> {
    pub fn from_data(id: &'a str, data: &'a ThreadData) -> Self {
        let status = if data.archived {
            ThreadStatus::Archived
        } else if data.active.is_some() {
            ThreadStatus::Active
        } else {
            ThreadStatus::Idle
        };
        ThreadJson {
            id,
            title: data.title.as_deref(),
            status,
            created_at: &data.created_at,
            updated_at: &data.updated_at,
            last_event_seq: data.last_seq,
            forked_from: data.forked_from.as_ref(),
            metadata: &data.metadata,
        }
    }

    pub fn from_summary(s: &SummaryRef<'a>) -> Self {
        ThreadJson {
            id: s.thread_id,
            title: s.title,
            status: if s.archived {
                ThreadStatus::Archived
            } else {
                ThreadStatus::Idle
            },
            created_at: s.created_at,
            updated_at: s.updated_at,
            last_event_seq: s.last_seq,
            forked_from: s.forked_from,
            metadata: s.metadata,
        }
    }

    pub fn write(&self, out: &mut String) {
        out.push_str("{\"id\":");
        write_json_string(self.id, out);
        out.push_str(match self.status {
            ThreadStatus::Idle => ",\"status\":\"idle\"",
            ThreadStatus::Active => ",\"status\":\"active\"",
            ThreadStatus::Archived => ",\"status\":\"archived\"",
        });
        out.push_str(",\"title\":");
        match self.title {
            Some(t) => write_json_string(t, out),
            None => out.push_str("null"),
        }
        out.push_str(",\"parentThreadId\":");
        match self.forked_from {
            Some(f) => write_json_string(&f.thread_id, out),
            None => out.push_str("null"),
        }
        out.push_str(",\"createdAt\":");
        write_json_string(self.created_at, out);
        out.push_str(",\"updatedAt\":");
        write_json_string(self.updated_at, out);
        out.push_str(",\"revision\":");
        push_u64(out, self.last_event_seq);
        out.push_str(",\"metadata\":");
        if self.metadata.is_empty() {
            out.push_str("{}");
        } else {
            out.push_str(&serde_json::to_string(self.metadata).expect("metadata serialises"));
        }
        out.push('}');
    }
}

/// thread/list's result: the summaries of one page from the store's index (a thread loaded
/// here is shown as this server sees it: active, or ahead of the index by its last events).
pub(crate) fn thread_list(
    inner: &Inner,
    params: Option<ThreadListParams>,
    out: &mut String,
) -> Result<(), RpcError> {
    let (include_archived, cursor, limit) = params
        .map(|p| (p.include_archived, p.cursor.flatten(), p.limit))
        .unwrap_or_default();
    let query = ListQuery {
        include_archived: include_archived.unwrap_or(false),
        cursor,
        limit: limit.unwrap_or(100) as usize,
    };
    out.push_str("{\"threads\":[");
    let mut first = true;
    // Taken once for the page (inside the store's index lock, the order used everywhere), so
    // a page costs one lock of the loaded threads, not one per thread.
    let mut loaded: Option<std::sync::MutexGuard<'_, _>> = None;
    let rest = inner.store.list_with(&query, &mut |s| {
        if !first {
            out.push(',');
        }
        first = false;
        let threads = loaded.get_or_insert_with(|| inner.threads.hold());
        match threads.get(s.thread_id) {
            Some(t) => ThreadJson::from_data(&t.id, &lock(&t.data)).write(out),
            None => ThreadJson::from_summary(&s).write(out),
        }
    })?;
    drop(loaded);
    out.push_str("],\"nextCursor\":");
    match &rest.next_cursor {
        Some(c) => write_json_string(c, out),
        None => out.push_str("null"),
    }
    // Threads the disk holds but that cannot be read are reported, never hidden: the host
    // decides (restore them, or reopen with accept_unanchored).
    if !rest.unreadable.is_empty() {
        out.push_str(",\"unreadable\":[");
        for (i, (id, reason)) in rest.unreadable.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str("{\"threadId\":");
            write_json_string(id, out);
            out.push_str(",\"status\":\"unreadable\",\"reason\":");
            write_json_string(&cap(reason, 1024), out);
            out.push('}');
        }
        out.push(']');
    }
    out.push('}');
    Ok(())
}

/// thread/read's and thread/resume's result: the thread, then its events as the store keeps
/// them (the schema's `RolloutEvent` lines, checked against the schema when they entered
/// memory), recent ones straight from the store's tail cache.
pub(crate) fn thread_read(
    inner: &Inner,
    thread: &super::ThreadState,
    after: u64,
    limit: usize,
    resume: bool,
    out: &mut String,
) -> Result<(), RpcError> {
    let page = inner.store.read_json(&thread.id, after, limit)?;
    let bytes: usize = page.events.iter().map(|e| e.len() + 1).sum();
    out.reserve(bytes + 512);
    let data = lock(&thread.data);
    out.push_str("{\"thread\":");
    ThreadJson::from_data(&thread.id, &data).write(out);
    out.push_str(",\"events\":[");
    for (i, e) in page.events.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(e);
    }
    out.push_str(if page.has_more {
        "],\"hasMore\":true"
    } else {
        "],\"hasMore\":false"
    });
    out.push_str(",\"forkedFrom\":");
    match &data.forked_from {
        Some(f) => out.push_str(&serde_json::to_string(f).expect("a ForkOrigin serialises")),
        None => out.push_str("null"),
    }
    if resume {
        out.push_str(",\"activeTurn\":");
        match &data.active {
            Some(t) => {
                out.push_str(&serde_json::to_string(&t.to_wire()).expect("a Turn serialises"))
            }
            None => out.push_str("null"),
        }
    }
    out.push('}');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Thread;

    #[test]
    fn the_written_thread_is_what_the_generated_type_writes() {
        let mut metadata = Map::new();
        metadata.insert("k\"ey".into(), serde_json::json!({"n": [1, 2.5, null]}));
        let fork = ForkOrigin {
            thread_id: "src".into(),
            event_seq: 7,
            event_hash: "a".repeat(64),
        };
        for (title, forked, meta, status) in [
            (None, None, Map::new(), ThreadStatus::Idle),
            (
                Some("T \u{1}\n\"é"),
                Some(&fork),
                metadata.clone(),
                ThreadStatus::Active,
            ),
            (Some(""), None, metadata.clone(), ThreadStatus::Archived),
        ] {
            let view = ThreadJson {
                id: "th-1",
                title,
                status,
                created_at: "2026-01-01T00:00:00.000Z",
                updated_at: "2026-01-02T00:00:00.000Z",
                last_event_seq: 42,
                forked_from: forked,
                metadata: &meta,
            };
            let mut text = String::new();
            view.write(&mut text);
            let typed = Thread {
                id: "th-1".into(),
                title: title.map(str::to_string),
                status,
                parent_thread_id: forked.map(|f| f.thread_id.clone()),
                created_at: "2026-01-01T00:00:00.000Z".into(),
                updated_at: "2026-01-02T00:00:00.000Z".into(),
                revision: 42,
                metadata: meta.clone(),
            };
            assert_eq!(text, serde_json::to_string(&typed).unwrap());
        }
    }
}
