//! The SQLite backend: the same events and hashes as JSONL in one WAL database per state
//! directory, for hosts that prefer one file and SQL tooling. SQLite's own journal makes a batch
//! atomic, so it never has torn tails to repair; the `threads` row is the head anchor and is
//! updated in the same transaction as the events.

use super::engine::{check_event, Backend, Head, Loaded, WriteSet};
use super::fsutil::open_private;
use super::{Durability, StoreError, StoredEvent, VerifyReport, ZERO_HASH};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The database file name inside the state directory.
pub const SQLITE_FILE: &str = "rollout.sqlite3";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS threads (
  thread_id TEXT PRIMARY KEY,
  head_seq INTEGER NOT NULL,
  head_hash TEXT NOT NULL,
  archived INTEGER NOT NULL,
  format_version INTEGER NOT NULL,
  compacted_through INTEGER NOT NULL,
  last_compaction_seq INTEGER
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
  thread_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  prev_hash TEXT NOT NULL,
  hash TEXT NOT NULL,
  time TEXT NOT NULL,
  trace_id TEXT,
  parent_id TEXT,
  idempotency_key TEXT,
  payload TEXT NOT NULL,
  turn_completed TEXT,
  PRIMARY KEY (thread_id, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS events_turn ON events (thread_id, turn_completed) WHERE turn_completed IS NOT NULL;
";

/// The SQLite backend.
pub struct SqliteBackend {
    conn: Mutex<Connection>,
    path: PathBuf,
    durability: Durability,
}

fn sq(path: &Path, what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Sqlite(format!(
        "cannot {what} the SQLite database {}: {e}; move the file aside or choose the JSONL store",
        path.display()
    ))
}

const COLS: &str = "seq, prev_hash, hash, time, trace_id, parent_id, idempotency_key, payload";

fn row_event(r: &rusqlite::Row<'_>) -> rusqlite::Result<(StoredEvent, Option<String>)> {
    let payload: String = r.get(7)?;
    let parsed = serde_json::from_str(&payload);
    let bad = parsed
        .as_ref()
        .err()
        .map(|e: &serde_json::Error| e.to_string());
    Ok((
        StoredEvent {
            seq: r.get::<_, i64>(0)? as u64,
            prev_hash: r.get(1)?,
            hash: r.get(2)?,
            time: r.get(3)?,
            trace_id: r.get(4)?,
            parent_id: r.get(5)?,
            idempotency_key: r.get(6)?,
            payload: parsed.unwrap_or(serde_json::Value::Null),
        },
        bad,
    ))
}

impl SqliteBackend {
    pub(crate) fn open(state_dir: &Path, durability: Durability) -> Result<Self, StoreError> {
        let path = state_dir.join(SQLITE_FILE);
        // Create it 0600 ourselves; SQLite gives its -wal and -shm files the same mode.
        open_private(&path, false).map_err(|e| sq(&path, "create", e))?;
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| sq(&path, "open", e))?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .map_err(|e| sq(&path, "open", e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(sq(
                &path,
                "use WAL mode for",
                format!("journal_mode is {mode}"),
            ));
        }
        let sync = if durability == Durability::Sync {
            "FULL"
        } else {
            "NORMAL"
        };
        conn.execute_batch(&format!(
            "PRAGMA synchronous={sync}; PRAGMA busy_timeout=5000; {SCHEMA}"
        ))
        .map_err(|e| sq(&path, "initialise", e))?;
        Ok(SqliteBackend {
            conn: Mutex::new(conn),
            path,
            durability,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn event(
        c: &Connection,
        id: &str,
        seq: u64,
    ) -> Result<Option<(StoredEvent, Option<String>)>, StoreError> {
        Ok(c.query_row(
            &format!("SELECT {COLS} FROM events WHERE thread_id = ?1 AND seq = ?2"),
            params![id, seq as i64],
            row_event,
        )
        .optional()?)
    }

    /// Events `first..=last`, each checked against its predecessor.
    fn range(
        c: &Connection,
        id: &str,
        first: u64,
        last: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let corrupt = |seq, reason| StoreError::Corrupt {
            thread_id: id.to_string(),
            seq,
            reason,
        };
        let from = first.saturating_sub(1).max(1);
        let mut st = c.prepare_cached(&format!(
            "SELECT {COLS} FROM events WHERE thread_id = ?1 AND seq >= ?2 AND seq <= ?3 ORDER BY seq"
        ))?;
        let rows = st.query_map(params![id, from as i64, last as i64], row_event)?;
        let mut out = Vec::new();
        let mut prev: Option<String> = None;
        let mut seq = from;
        for row in rows {
            let (ev, bad) = row?;
            if let Some(b) = bad {
                return Err(corrupt(seq, format!("payload is not JSON ({b})")));
            }
            let p = prev.clone().unwrap_or_else(|| ev.prev_hash.clone());
            check_event(&ev, seq, &p).map_err(|r| corrupt(seq, r))?;
            prev = Some(ev.hash.clone());
            if seq >= first {
                out.push(ev);
            }
            seq += 1;
        }
        if seq != last + 1 {
            return Err(corrupt(seq, "event row is missing".into()));
        }
        Ok(out)
    }
}

impl Backend for SqliteBackend {
    type Tx = ();

    fn new_tx(&self) {}

    fn load(&self, id: &str) -> Result<Option<Loaded<()>>, StoreError> {
        let c = self.conn();
        let row = c
            .query_row(
                "SELECT head_seq, head_hash, archived, format_version, compacted_through, last_compaction_seq FROM threads WHERE thread_id = ?1",
                [id],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)? as u64,
                        r.get::<_, String>(1)?,
                        r.get::<_, bool>(2)?,
                        r.get::<_, i64>(3)?,
                        r.get::<_, i64>(4)? as u64,
                        r.get::<_, Option<i64>>(5)?,
                    ))
                },
            )
            .optional()?;
        let mismatch = |reason: String| StoreError::AnchorMismatch {
            thread_id: id.to_string(),
            reason,
        };
        let max: Option<i64> = c.query_row(
            "SELECT max(seq) FROM events WHERE thread_id = ?1",
            [id],
            |r| r.get(0),
        )?;
        let Some((seq, hash, archived, format, compacted_through, lcs)) = row else {
            if let Some(m) = max {
                return Err(mismatch(format!(
                    "events up to seq {m} exist but the thread row is missing"
                )));
            }
            return Ok(None);
        };
        if max.map(|m| m as u64) != Some(seq) {
            return Err(mismatch(format!(
                "the events end at seq {} but the head anchor records seq {seq}: acknowledged events are missing",
                max.unwrap_or(0)
            )));
        }
        let corrupt = |seq, reason| StoreError::Corrupt {
            thread_id: id.to_string(),
            seq,
            reason,
        };
        let (header, bad) =
            Self::event(&c, id, 1)?.ok_or_else(|| corrupt(1, "header row is missing".into()))?;
        if let Some(b) = bad {
            return Err(corrupt(1, format!("payload is not JSON ({b})")));
        }
        check_event(&header, 1, ZERO_HASH).map_err(|r| corrupt(1, r))?;
        let mut head = Head::from_header(&header).map_err(|r| corrupt(1, r))?;
        let (last, bad) =
            Self::event(&c, id, seq)?.ok_or_else(|| corrupt(seq, "head row is missing".into()))?;
        if bad.is_some() || last.hash != hash || last.compute_hash() != last.hash {
            return Err(mismatch(format!(
                "the head event (seq {seq}) does not have the anchored hash {hash}"
            )));
        }
        head.apply(&last);
        head.archived = archived;
        head.format_version = format as u16;
        head.compacted_through = compacted_through;
        head.last_compaction_seq = lcs.map(|s| s as u64);
        Ok(Some(Loaded {
            head,
            tx: (),
            repair: None,
            notes: Vec::new(),
        }))
    }

    fn write(&self, sets: &mut [WriteSet<'_, ()>], durable: bool) -> Vec<Result<(), StoreError>> {
        let _ = durable; // synchronous=FULL (Sync) or NORMAL (Buffered) decides, set at open.
        let mut c = self.conn();
        let res = (|| -> Result<(), StoreError> {
            let tx = c.transaction()?;
            {
                let mut ins = tx.prepare_cached(
                    "INSERT INTO events (thread_id, seq, prev_hash, hash, time, trace_id, parent_id, idempotency_key, payload, turn_completed) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                )?;
                for set in sets.iter() {
                    if set.create {
                        let n = tx.execute(
                            "INSERT OR IGNORE INTO threads (thread_id, head_seq, head_hash, archived, format_version, compacted_through) VALUES (?1, 0, ?2, 0, 1, 0)",
                            params![set.id, ZERO_HASH],
                        )?;
                        if n == 0 {
                            return Err(StoreError::AlreadyExists(set.id.to_string()));
                        }
                    }
                    for s in set.events {
                        let e = &s.ev;
                        let turn = (e.kind() == "turnCompleted")
                            .then(|| {
                                e.payload
                                    .get("turnId")
                                    .and_then(|v| v.as_str())
                                    .map(str::to_string)
                            })
                            .flatten();
                        ins.execute(params![
                            set.id,
                            e.seq as i64,
                            e.prev_hash,
                            e.hash,
                            e.time,
                            e.trace_id,
                            e.parent_id,
                            e.idempotency_key,
                            serde_json::to_string(&e.payload).expect("a Value serialises"),
                            turn
                        ])?;
                    }
                    let h = set.head;
                    tx.execute(
                        "UPDATE threads SET head_seq = ?2, head_hash = ?3, archived = ?4, format_version = ?5, compacted_through = ?6, last_compaction_seq = ?7 WHERE thread_id = ?1",
                        params![
                            set.id,
                            h.last_seq as i64,
                            h.head_hash,
                            h.archived,
                            h.format_version as i64,
                            h.compacted_through as i64,
                            h.last_compaction_seq.map(|s| s as i64)
                        ],
                    )?;
                }
            }
            tx.commit()?;
            Ok(())
        })();
        match res {
            Ok(()) => sets.iter().map(|_| Ok(())).collect(),
            // One transaction for the round: a failure fails every set in it.
            Err(e) => {
                let msg = e.to_string();
                let mut first = Some(e);
                sets.iter()
                    .map(|_| {
                        Err(first
                            .take()
                            .unwrap_or_else(|| StoreError::Sqlite(msg.clone())))
                    })
                    .collect()
            }
        }
    }

    fn anchor(&self, _id: &str, _tx: &mut (), _head: &Head) -> Result<(), StoreError> {
        Ok(()) // The threads row moved with the events, in the same transaction.
    }

    fn sync(&self) -> Result<(), StoreError> {
        if self.durability != Durability::Sync {
            // With synchronous=NORMAL a WAL commit is not fsynced; a full checkpoint is.
            self.conn()
                .query_row("PRAGMA wal_checkpoint(FULL)", [], |_| Ok(()))?;
        }
        Ok(())
    }

    fn read(
        &self,
        id: &str,
        _tx: &mut (),
        written: u64,
        after: u64,
        n: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let last = written.min(after + n as u64);
        if last <= after {
            return Ok(Vec::new());
        }
        Self::range(&self.conn(), id, after + 1, last)
    }

    fn turn_completed(
        &self,
        id: &str,
        _tx: &mut (),
        turn_id: &str,
    ) -> Result<Option<StoredEvent>, StoreError> {
        let c = self.conn();
        let seq: Option<i64> = c
            .query_row(
                "SELECT min(seq) FROM events WHERE thread_id = ?1 AND turn_completed = ?2",
                params![id, turn_id],
                |r| r.get(0),
            )
            .optional()?
            .flatten();
        match seq {
            None => Ok(None),
            Some(s) => Ok(Self::range(&c, id, s as u64, s as u64)?.pop()),
        }
    }

    fn verify(
        &self,
        id: &str,
        _tx: &mut (),
        written: (u64, &str),
    ) -> Result<VerifyReport, StoreError> {
        let c = self.conn();
        let mut report = VerifyReport {
            thread_id: id.to_string(),
            events: 0,
            head_seq: written.0,
            head_hash: written.1.to_string(),
            first_bad_seq: None,
            reason: None,
            repairs: Vec::new(),
        };
        let mut st = c.prepare(&format!(
            "SELECT {COLS} FROM events WHERE thread_id = ?1 ORDER BY seq"
        ))?;
        let mut rows = st.query([id])?;
        let mut prev = ZERO_HASH.to_string();
        let mut seq = 1;
        while let Some(r) = rows.next()? {
            let (ev, bad) = row_event(r)?;
            let res = match bad {
                Some(b) => Err(format!("payload is not JSON ({b})")),
                None => check_event(&ev, seq, &prev),
            };
            if let Err(reason) = res {
                report.first_bad_seq = Some(seq);
                report.reason = Some(reason);
                return Ok(report);
            }
            prev = ev.hash;
            report.events += 1;
            seq += 1;
        }
        let anchored: Option<(i64, String)> = c
            .query_row(
                "SELECT head_seq, head_hash FROM threads WHERE thread_id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        if report.events != written.0 || prev != written.1 {
            report.first_bad_seq = Some(report.events.min(written.0) + 1);
            report.reason = Some(format!(
                "the events end at seq {} but the store's head is seq {}",
                report.events, written.0
            ));
        } else if anchored.as_ref().map(|(s, h)| (*s as u64, h.as_str()))
            != Some((written.0, written.1))
        {
            report.first_bad_seq = Some(written.0);
            report.reason = Some("the threads row (head anchor) does not match the events".into());
        }
        Ok(report)
    }

    fn ids_after(&self, after: Option<&str>, n: usize) -> Result<Vec<String>, StoreError> {
        let c = self.conn();
        let mut st = c.prepare_cached(
            "SELECT thread_id FROM threads WHERE thread_id > ?1 ORDER BY thread_id LIMIT ?2",
        )?;
        let ids = st
            .query_map(params![after.unwrap_or(""), n as i64], |r| {
                r.get::<_, String>(0)
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ids)
    }
}
