//! The SQLite backend: the same events and hashes as JSONL in one WAL database per state
//! directory, for hosts that prefer one file and SQL tooling. SQLite's own journal makes a batch
//! atomic, so it never has torn tails to repair; the `threads` row is the head anchor and is
//! updated in the same transaction as the events (in keyed mode it carries the anchor's MAC).
//!
//! SQLite opens files by path only, so the database is opened through a path that reaches the
//! state directory's pinned descriptor (`/proc/self/fd/N/...` on Linux, see fsutil), and SQLite
//! keeps every file it needs open for the connection's lifetime.

use super::fsutil::{Dir, Open};
use super::jsonl::judge_store;
use super::keyed::mac_eq;
use super::store::{check_event, payload_range, Backend, Head, Loaded, Repair, Sealed, WriteSet};
use super::{
    validate_thread_id, ChainCtx, Durability, RolloutKey, StoreError, StoreOptions, StoredEvent,
    VerifyReport, ZERO_HASH,
};
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
CREATE INDEX IF NOT EXISTS events_key ON events (thread_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE TABLE IF NOT EXISTS store_bindings (
  thread_id TEXT PRIMARY KEY,
  store_id TEXT NOT NULL,
  mac TEXT NOT NULL
) WITHOUT ROWID;
";

/// The SQLite backend.
pub struct SqliteBackend {
    conn: Mutex<Connection>,
    /// After `conn`: a read-only store's private copy of a database with a WAL to replay,
    /// removed once the connection has closed.
    _scratch: Option<Scratch>,
    /// After `conn`: fields drop in order, and the connection may still reach the directory
    /// through this descriptor while it closes.
    _dir: Dir,
    path: PathBuf,
    durability: Durability,
    key: Option<RolloutKey>,
    accept_unanchored: bool,
    read_only: bool,
    /// The `threads` columns a row is read from (a database written before keyed mode has no
    /// `mac`/`key_id`; a read-only open cannot add them).
    row_sql: &'static str,
    /// Whether the database has the `store_bindings` table (older ones do not).
    has_bindings: bool,
}

/// A private directory (0700, under the system's temp dir) removed with everything in it on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> std::io::Result<Scratch> {
        use std::os::unix::fs::DirBuilderExt;
        let mut last = None;
        for _ in 0..8 {
            let mut r = [0u8; 8];
            getrandom::fill(&mut r).map_err(|e| std::io::Error::other(e.to_string()))?;
            let p = std::env::temp_dir().join(format!(
                "cc-rollout-ro-{}-{}",
                std::process::id(),
                cc_agent_protocol::hex_lower(&r)
            ));
            match std::fs::DirBuilder::new().mode(0o700).create(&p) {
                Ok(()) => return Ok(Scratch(p)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("tried at least once"))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const ROW_SQL: &str = "SELECT head_seq, head_hash, archived, format_version, compacted_through, last_compaction_seq, mac, key_id FROM threads WHERE thread_id = ?1";
const ROW_SQL_UNKEYED: &str = "SELECT head_seq, head_hash, archived, format_version, compacted_through, last_compaction_seq, NULL, NULL FROM threads WHERE thread_id = ?1";

/// A path as a `file:` URI path (RFC 3986: everything but unreserved characters and '/' escaped).
fn uri_path(p: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for &b in p.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn table_exists(c: &Connection, name: &str) -> rusqlite::Result<bool> {
    c.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
        [name],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n > 0)
}

/// An empty store (what a state directory without a database holds).
fn empty_db(path: &Path) -> Result<Connection, StoreError> {
    let c = Connection::open_in_memory().map_err(|e| sq(path, "open", e))?;
    c.execute_batch(SCHEMA).map_err(|e| sq(path, "open", e))?;
    c.execute_batch(
        "ALTER TABLE threads ADD COLUMN mac TEXT; ALTER TABLE threads ADD COLUMN key_id TEXT;",
    )
    .map_err(|e| sq(path, "open", e))?;
    Ok(c)
}

/// The `threads` row: the thread's head anchor.
struct Row {
    seq: u64,
    hash: String,
    archived: bool,
    format: i64,
    compacted_through: u64,
    last_compaction_seq: Option<i64>,
    mac: Option<String>,
    key_id: Option<String>,
}

/// The text a keyed `threads` row's MAC covers.
fn row_body(
    seq: u64,
    hash: &str,
    archived: bool,
    format: i64,
    ct: u64,
    lcs: Option<i64>,
    kid: &str,
) -> String {
    format!(
        "ccrow1 seq={seq} hash={hash} archived={} format={format} compactedThrough={ct} lastCompaction={} kid={kid}",
        archived as u8,
        lcs.map_or("-".to_string(), |s| s.to_string())
    )
}

/// (mac, key id, the row text the MAC covers) of the row recording `h`.
fn row_mac(key: &RolloutKey, id: &str, h: &Head) -> (String, String, String) {
    let kid = key.key_id();
    let body = row_body(
        h.last_seq,
        &h.head_hash,
        h.archived,
        h.format_version as i64,
        h.compacted_through,
        h.last_compaction_seq.map(|s| s as i64),
        &kid,
    );
    (key.anchor_mac(id, &body), kid, body)
}

fn sq(path: &Path, what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Sqlite(format!(
        "cannot {what} the SQLite database {}: {e}; move the file aside or choose the JSONL store",
        path.display()
    ))
}

const COLS: &str = "seq, prev_hash, hash, time, trace_id, parent_id, idempotency_key, payload";

/// What the `turn_completed` index column holds for an event.
fn turn_of(e: &StoredEvent) -> Option<String> {
    (e.kind() == "turnCompleted")
        .then(|| {
            e.payload
                .get("turnId")
                .and_then(|v| v.as_str())
                .map(str::to_string)
        })
        .flatten()
}

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
    pub(crate) fn open(dir: Dir, options: &StoreOptions) -> Result<Self, StoreError> {
        if options.read_only {
            return Self::open_read_only(dir, options);
        }
        let path = dir.path().join(SQLITE_FILE);
        // Create it 0600 ourselves; SQLite gives its -wal and -shm files the same mode.
        dir.open_file(SQLITE_FILE, Open::CreateReadWrite)
            .map_err(|e| sq(&path, "create", e))?;
        let pinned = dir
            .pinned_path(SQLITE_FILE)
            .map_err(|e| sq(&path, "open", e))?;
        let conn = Connection::open_with_flags(
            &pinned,
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
        let sync = if options.durability == Durability::Sync {
            "FULL"
        } else {
            "NORMAL"
        };
        conn.execute_batch(&format!(
            "PRAGMA synchronous={sync}; PRAGMA busy_timeout=5000; {SCHEMA}"
        ))
        .map_err(|e| sq(&path, "initialise", e))?;
        // Added columns: the keyed anchor's MAC and key id (NULL when written unkeyed).
        let has_mac: bool = conn
            .query_row(
                "SELECT count(*) FROM pragma_table_info('threads') WHERE name = 'mac'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map_err(|e| sq(&path, "initialise", e))?
            > 0;
        if !has_mac {
            conn.execute_batch(
                "ALTER TABLE threads ADD COLUMN mac TEXT; ALTER TABLE threads ADD COLUMN key_id TEXT;",
            )
            .map_err(|e| sq(&path, "upgrade", e))?;
        }
        Ok(SqliteBackend {
            conn: Mutex::new(conn),
            _scratch: None,
            _dir: dir,
            path,
            durability: options.durability,
            key: options.key.clone(),
            accept_unanchored: options.accept_unanchored,
            read_only: false,
            row_sql: ROW_SQL,
            has_bindings: true,
        })
    }

    /// Opens the database without writing a byte of the state directory: no file is created
    /// (no database: an empty store), and SQLite never writes there. A database whose WAL is
    /// empty or absent holds everything in its main file, which is opened `immutable=1` (no
    /// locks, no -shm, works on a read-only file system). One with a WAL to replay (a writer
    /// crashed, or the copy was taken mid-run) is copied with its WAL into a private temporary
    /// directory and read from there, because replaying it in place would write.
    fn open_read_only(dir: Dir, options: &StoreOptions) -> Result<Self, StoreError> {
        let path = dir.path().join(SQLITE_FILE);
        let wal = format!("{SQLITE_FILE}-wal");
        let mut scratch = None;
        let conn = if !dir.exists(SQLITE_FILE)? {
            empty_db(&path)?
        } else {
            let wal_len = match dir.open_file(&wal, Open::Read) {
                Ok(f) => f.metadata()?.len(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
                Err(e) => return Err(sq(&path, "read the WAL of", e)),
            };
            if wal_len == 0 {
                let pinned = dir
                    .pinned_path(SQLITE_FILE)
                    .map_err(|e| sq(&path, "open", e))?;
                Connection::open_with_flags(
                    format!("file:{}?mode=ro&immutable=1", uri_path(&pinned)),
                    OpenFlags::SQLITE_OPEN_READ_ONLY
                        | OpenFlags::SQLITE_OPEN_URI
                        | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )
                .map_err(|e| sq(&path, "open (read-only)", e))?
            } else {
                let s = Scratch::new().map_err(|e| sq(&path, "make a private copy of", e))?;
                for name in [SQLITE_FILE, wal.as_str()] {
                    let mut from = dir.open_file(name, Open::Read)?;
                    let mut to = std::fs::File::create(s.0.join(name))?;
                    std::io::copy(&mut from, &mut to)?;
                }
                let c = Connection::open_with_flags(
                    s.0.join(SQLITE_FILE),
                    OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )
                .map_err(|e| sq(&path, "open a private copy of", e))?;
                scratch = Some(s);
                c
            }
        };
        let initialised = table_exists(&conn, "threads").map_err(|e| sq(&path, "read", e))?
            && table_exists(&conn, "events").map_err(|e| sq(&path, "read", e))?;
        // Never initialised (an empty file): an empty store.
        let conn = if initialised { conn } else { empty_db(&path)? };
        let has_mac: bool = conn
            .query_row(
                "SELECT count(*) FROM pragma_table_info('threads') WHERE name = 'mac'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map_err(|e| sq(&path, "read", e))?
            > 0;
        let has_bindings =
            table_exists(&conn, "store_bindings").map_err(|e| sq(&path, "read", e))?;
        conn.execute_batch("PRAGMA query_only=1")
            .map_err(|e| sq(&path, "open (read-only)", e))?;
        Ok(SqliteBackend {
            conn: Mutex::new(conn),
            _scratch: scratch,
            _dir: dir,
            path,
            durability: options.durability,
            key: options.key.clone(),
            accept_unanchored: options.accept_unanchored,
            read_only: true,
            row_sql: if has_mac { ROW_SQL } else { ROW_SQL_UNKEYED },
            has_bindings,
        })
    }

    /// The state directory (where the store id lives).
    pub(crate) fn state_dir(&self) -> &Dir {
        &self._dir
    }

    /// Whether any thread has a keyed row (one carrying a MAC).
    pub(crate) fn holds_keyed_threads(&self) -> Result<bool, StoreError> {
        Ok(self.conn().query_row(
            "SELECT EXISTS(SELECT 1 FROM threads WHERE mac IS NOT NULL)",
            [],
            |r| r.get(0),
        )?)
    }

    /// The key, bound to the store's id once that is settled (`open_sqlite`).
    pub(crate) fn bind_key(&mut self, key: Option<RolloutKey>) {
        self.key = key;
    }

    /// The thread's store binding (store id, MAC), if it has one.
    fn binding(&self, c: &Connection, id: &str) -> Result<Option<(String, String)>, StoreError> {
        if !self.has_bindings {
            return Ok(None);
        }
        Ok(c.query_row(
            "SELECT store_id, mac FROM store_bindings WHERE thread_id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?)
    }

    /// Judges the binding of a row whose own MAC verified under `key` (`body` is what that MAC
    /// covers): as `jsonl::judge_store`, plus a refusal for a binding whose MAC fails.
    fn judge_binding(
        &self,
        c: &Connection,
        id: &str,
        key: &RolloutKey,
        body: &str,
    ) -> Result<Result<Option<String>, String>, StoreError> {
        let bound = self.binding(c, id)?;
        if let Some((store, mac)) = &bound {
            if !mac_eq(mac, &key.store_binding_mac(id, store, body)) {
                return Ok(Err(
                    "the thread's store binding (store_bindings row) does not verify under the rollout key: it was forged, or the thread row was rewritten"
                        .into(),
                ));
            }
        }
        Ok(judge_store(
            bound.as_ref().map(|(s, _)| s.as_str()),
            key.store_id(),
            "the thread row",
        ))
    }

    fn ctx<'a>(&'a self, id: &'a str) -> ChainCtx<'a> {
        ChainCtx {
            thread_id: id,
            key: self.key.as_ref(),
        }
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
        ctx: ChainCtx<'_>,
        first: u64,
        last: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let id = ctx.thread_id;
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
            check_event(&ev, seq, &p, ctx).map_err(|r| corrupt(seq, r))?;
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
        let ctx = self.ctx(id);
        let c = self.conn();
        let row = self.row(&c, id)?;
        let mismatch = |reason: String| StoreError::AnchorMismatch {
            thread_id: id.to_string(),
            reason,
        };
        let corrupt = |seq, reason| StoreError::Corrupt {
            thread_id: id.to_string(),
            seq,
            reason,
        };
        let max: Option<i64> = c.query_row(
            "SELECT max(seq) FROM events WHERE thread_id = ?1",
            [id],
            |r| r.get(0),
        )?;
        let mut warnings = Vec::new();
        let mut repairs = Vec::new();
        let notes = Vec::new();
        let mut read_only = None;
        let Some(row) = row else {
            let Some(m) = max else { return Ok(None) };
            if !self.accept_unanchored {
                return Err(mismatch(format!(
                    "events up to seq {m} exist but the thread row (its head anchor) is missing, so nothing vouches that they end where they did; restore the database from a backup, or accept the events as they are with accept_unanchored (--accept-unanchored)"
                )));
            }
            // Accepted: rebuild the row from a full check of the events.
            let events = Self::range(&c, ctx, 1, m as u64)?;
            let mut head = Head::from_header(&events[0]).map_err(|r| corrupt(1, r))?;
            for ev in &events[1..] {
                head.apply(ev);
            }
            let w = format!(
                "the thread row (head anchor) was missing; accepted (accept_unanchored): seqs 1..={m} were checked as a chain, but nothing vouches that seq {m} is the last one acknowledged"
            );
            self.adopt(&c, id, &head, w, &mut warnings, &mut repairs)?;
            return Ok(Some(Loaded {
                head,
                tx: (),
                repairs,
                notes,
                warnings,
                read_only,
                header_line: None,
                damage: None,
            }));
        };
        let seq = row.seq;
        // Adopted under the key (accept_unanchored): what is being vouched for, for the record.
        let mut adopt: Option<String> = None;
        match (&self.key, &row.mac) {
            (Some(key), Some(mac)) => {
                let kid = row.key_id.as_deref().unwrap_or("");
                if kid != key.key_id() {
                    return Err(mismatch(format!(
                        "the thread row was written with another rollout key (key id {kid}); open the store with that key"
                    )));
                }
                let body = row_body(
                    row.seq,
                    &row.hash,
                    row.archived,
                    row.format,
                    row.compacted_through,
                    row.last_compaction_seq,
                    kid,
                );
                if !mac_eq(mac, &key.anchor_mac(id, &body)) {
                    return Err(mismatch(
                        "the thread row's MAC does not verify under the rollout key: the head anchor was forged or rewritten"
                            .into(),
                    ));
                }
                match self.judge_binding(&c, id, key, &body)? {
                    Err(why) => return Err(mismatch(why)),
                    Ok(Some(why)) if self.accept_unanchored => {
                        adopt = Some(format!(
                            "{why}; adopted into this store (accept_unanchored): seqs 1..={seq} were not bound to it when written"
                        ))
                    }
                    Ok(Some(why)) => {
                        return Err(mismatch(format!(
                            "{why}; if it belongs here, open with accept_unanchored (--accept-unanchored) to adopt it into this store"
                        )))
                    }
                    Ok(None) => {}
                }
            }
            (Some(_), None) if self.accept_unanchored => {
                adopt = Some(format!(
                    "the thread row carried no MAC (written without the rollout key); adopted under the key (accept_unanchored): seqs 1..={seq} were not authenticated when written"
                ))
            }
            (Some(_), None) => {
                return Err(mismatch(
                    "the thread row carries no MAC: the thread was written without the rollout key, or the MAC was removed; open with accept_unanchored (--accept-unanchored) to adopt it under this key"
                        .into(),
                ))
            }
            (None, Some(_)) => {
                let why = format!(
                    "thread {id:?} is protected by a rollout key (key id {}); open the store with that key to write to it",
                    row.key_id.as_deref().unwrap_or("?")
                );
                warnings.push(format!(
                    "unkeyed: the thread is keyed but was opened without its key, so only the plain chain was checked ({why})"
                ));
                read_only = Some(why);
            }
            (None, None) => {}
        }
        if max.map(|m| m as u64) != Some(seq) {
            return Err(mismatch(format!(
                "the events end at seq {} but the head anchor records seq {seq}: acknowledged events are missing",
                max.unwrap_or(0)
            )));
        }
        let (header, bad) =
            Self::event(&c, id, 1)?.ok_or_else(|| corrupt(1, "header row is missing".into()))?;
        if let Some(b) = bad {
            return Err(corrupt(1, format!("payload is not JSON ({b})")));
        }
        check_event(&header, 1, ZERO_HASH, ctx).map_err(|r| corrupt(1, r))?;
        let mut head = Head::from_header(&header).map_err(|r| corrupt(1, r))?;
        let (last, bad) =
            Self::event(&c, id, seq)?.ok_or_else(|| corrupt(seq, "head row is missing".into()))?;
        if bad.is_some() || last.hash != row.hash {
            return Err(mismatch(format!(
                "the head event (seq {seq}) does not have the anchored hash {}",
                row.hash
            )));
        }
        check_event(&last, seq, &last.prev_hash, ctx).map_err(|r| corrupt(seq, r))?;
        head.apply(&last);
        head.archived = row.archived;
        head.format_version = row.format as u16;
        head.compacted_through = row.compacted_through;
        head.last_compaction_seq = row.last_compaction_seq.map(|s| s as u64);
        if let Some(w) = adopt {
            // Check what is being adopted before the key vouches for it.
            Self::range(&c, ctx, 1, seq)?;
            self.adopt(&c, id, &head, w, &mut warnings, &mut repairs)?;
        }
        Ok(Some(Loaded {
            head,
            tx: (),
            repairs,
            notes,
            warnings,
            read_only,
            header_line: Some(Sealed::from_event(header).line),
            damage: None,
        }))
    }

    fn write(&self, sets: &mut [WriteSet<'_, ()>], durable: bool) -> Vec<Result<(), StoreError>> {
        let _ = durable; // synchronous=FULL (Sync) or NORMAL (Buffered) decides, set at open.
        if self.read_only {
            return super::refuse_read_only(sets);
        }
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
                        let turn = turn_of(e);
                        let payload = &s.line[payload_range(&s.line)];
                        ins.execute(params![
                            set.id,
                            e.seq as i64,
                            e.prev_hash,
                            e.hash,
                            e.time,
                            e.trace_id,
                            e.parent_id,
                            e.idempotency_key,
                            payload,
                            turn
                        ])?;
                    }
                    Self::update_row(&tx, set.id, set.head, self.key.as_ref())?;
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

    fn anchor(
        &self,
        _id: &str,
        _tx: &mut (),
        _head: &Head,
        _durable: bool,
    ) -> Result<(), StoreError> {
        Ok(()) // The threads row moved with the events, in the same transaction.
    }

    fn sync(&self) -> Result<(), StoreError> {
        if self.durability != Durability::Sync && !self.read_only {
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
    ) -> Result<Vec<Sealed>, StoreError> {
        let last = written.min(after + n as u64);
        if last <= after {
            return Ok(Vec::new());
        }
        Ok(Self::range(&self.conn(), self.ctx(id), after + 1, last)?
            .into_iter()
            .map(Sealed::from_event)
            .collect())
    }

    fn read_back(
        &self,
        id: &str,
        _tx: &mut (),
        written: (u64, &str),
        before: u64,
        n: usize,
    ) -> Result<Vec<Sealed>, StoreError> {
        let before = before.min(written.0 + 1);
        if before <= 1 || n == 0 {
            return Ok(Vec::new());
        }
        let from = before.saturating_sub(n as u64).max(1);
        // Rows are found by key, so reading back is a range read like any other.
        Ok(Self::range(&self.conn(), self.ctx(id), from, before - 1)?
            .into_iter()
            .map(Sealed::from_event)
            .collect())
    }

    fn read_header(&self, id: &str, _tx: &mut ()) -> Result<Sealed, StoreError> {
        let mut evs = Self::range(&self.conn(), self.ctx(id), 1, 1)?;
        Ok(Sealed::from_event(evs.pop().ok_or_else(|| {
            StoreError::Corrupt {
                thread_id: id.to_string(),
                seq: 1,
                reason: "header row is missing".into(),
            }
        })?))
    }

    fn find_key(
        &self,
        id: &str,
        _tx: &mut (),
        written: u64,
        key: &str,
    ) -> Result<Option<StoredEvent>, StoreError> {
        let c = self.conn();
        let seq: Option<i64> = c
            .query_row(
                "SELECT min(seq) FROM events WHERE thread_id = ?1 AND idempotency_key = ?2",
                params![id, key],
                |r| r.get(0),
            )
            .optional()?
            .flatten();
        let Some(s) = seq.map(|s| s as u64).filter(|s| *s <= written) else {
            return Ok(None);
        };
        let ev = Self::range(&c, self.ctx(id), s, s)?.pop();
        // The index is not evidence: the event itself must carry the key.
        Ok(ev.filter(|e| e.idempotency_key.as_deref() == Some(key)))
    }

    fn peek(&self, id: &str) -> Result<Option<Head>, StoreError> {
        // Opening writes only when a row is missing or adopted under a key; leave those to a
        // full load.
        let row = self.row(&self.conn(), id)?;
        match (&row, &self.key) {
            (None, _) => return Ok(None),
            (Some(r), Some(_)) if r.mac.is_none() => return Ok(None),
            (Some(r), None) if r.mac.is_some() => return Ok(None),
            _ => {}
        }
        match self.load(id) {
            Ok(Some(l)) if l.repairs.is_empty() && l.warnings.is_empty() => Ok(Some(l.head)),
            _ => Ok(None),
        }
    }

    fn all_ids(&self) -> Result<Vec<String>, StoreError> {
        let c = self.conn();
        let mut ids: Vec<String> = c
            .prepare("SELECT thread_id FROM threads")?
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<Result<_, _>>()?;
        // Events whose thread row is gone count too: one index seek per distinct thread.
        let mut next = c.prepare("SELECT min(thread_id) FROM events WHERE thread_id > ?1")?;
        let mut cursor = String::new();
        while let Some(id) = next.query_row([&cursor], |r| r.get::<_, Option<String>>(0))? {
            ids.push(id.clone());
            cursor = id;
        }
        ids.sort();
        ids.dedup();
        Ok(ids)
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
        let Some(s) = seq else { return Ok(None) };
        let ev = Self::range(&c, self.ctx(id), s as u64, s as u64)?.pop();
        // The column is an index, not evidence: the event itself must say so.
        if let Some(ev) = &ev {
            if turn_of(ev).as_deref() != Some(turn_id) {
                return Err(StoreError::Corrupt {
                    thread_id: id.to_string(),
                    seq: s as u64,
                    reason:
                        "the turn_completed index names an event that does not complete that turn"
                            .into(),
                });
            }
        }
        Ok(ev)
    }

    fn verify(
        &self,
        id: &str,
        _tx: &mut (),
        written: (u64, &str),
    ) -> Result<VerifyReport, StoreError> {
        let ctx = self.ctx(id);
        let c = self.conn();
        let mut report = VerifyReport {
            thread_id: id.to_string(),
            events: 0,
            head_seq: written.0,
            head_hash: written.1.to_string(),
            first_bad_seq: None,
            reason: None,
            repairs: Vec::new(),
            warnings: Vec::new(),
            keyed: self.key.is_some(),
            authenticated_through: None,
        };
        let mut st = c.prepare(&format!(
            "SELECT {COLS}, turn_completed FROM events WHERE thread_id = ?1 ORDER BY seq"
        ))?;
        let mut rows = st.query([id])?;
        let mut prev = ZERO_HASH.to_string();
        let mut seq = 1;
        let mut sealed = 0;
        let mut folded: Option<Head> = None;
        while let Some(r) = rows.next()? {
            let (ev, bad) = row_event(r)?;
            let indexed: Option<String> = r.get(8)?;
            let res = match bad {
                Some(b) => Err(format!("payload is not JSON ({b})")),
                None => check_event(&ev, seq, &prev, ctx).and_then(|()| {
                    if indexed == turn_of(&ev) {
                        Ok(())
                    } else {
                        Err("the turn_completed index column does not match the event".into())
                    }
                }),
            };
            if let Err(reason) = res {
                report.first_bad_seq = Some(seq);
                report.reason = Some(reason);
                return Ok(report);
            }
            if ev.kind() == "sealed" {
                sealed = seq;
            }
            Head::fold(&mut folded, &ev);
            prev = ev.hash;
            report.events += 1;
            seq += 1;
        }
        let row = self.row(&c, id)?;
        if report.events != written.0 || prev != written.1 {
            report.first_bad_seq = Some(report.events.min(written.0) + 1);
            report.reason = Some(format!(
                "the events end at seq {} but the store's head is seq {}",
                report.events, written.0
            ));
            return Ok(report);
        }
        let Some(row) = row else {
            if !(self.read_only && self.accept_unanchored) {
                report.reason = Some("the threads row (head anchor) is missing".into());
            }
            // Accepted, read-only: the load's warning says what nothing vouches for.
            return Ok(report);
        };
        if (row.seq, row.hash.as_str()) != (written.0, written.1) {
            report.first_bad_seq = Some(written.0);
            report.reason = Some("the threads row (head anchor) does not match the events".into());
            return Ok(report);
        }
        let cached = (
            row.archived,
            row.format as u16,
            row.compacted_through,
            row.last_compaction_seq.map(|s| s as u64),
        );
        if let Some(h) = folded.filter(|h| h.cached_state() != cached) {
            report.reason = Some(format!(
                "the threads row caches (archived, format, compactedThrough, lastCompaction) = {cached:?}, the events say {:?}",
                h.cached_state()
            ));
            return Ok(report);
        }
        match (&self.key, &row.mac) {
            (Some(key), Some(mac)) => {
                let kid = row.key_id.as_deref().unwrap_or("");
                let body = row_body(
                    row.seq,
                    &row.hash,
                    row.archived,
                    row.format,
                    row.compacted_through,
                    row.last_compaction_seq,
                    kid,
                );
                if kid != key.key_id() || !mac_eq(mac, &key.anchor_mac(id, &body)) {
                    report.reason =
                        Some("the threads row's MAC does not verify under the rollout key".into());
                } else {
                    match self.judge_binding(&c, id, key, &body)? {
                        Err(why) => report.reason = Some(why),
                        Ok(Some(_)) if self.accept_unanchored => {}
                        Ok(Some(why)) => report.reason = Some(why),
                        Ok(None) => report.authenticated_through = Some(row.seq.max(sealed)),
                    }
                }
            }
            (Some(_), None) if self.read_only && self.accept_unanchored => {}
            (Some(_), None) => {
                report.reason =
                    Some("the threads row carries no MAC although the store is keyed".into())
            }
            (None, Some(_)) => report.keyed = false,
            (None, None) => {}
        }
        Ok(report)
    }

    fn ids_after(&self, after: Option<&str>, n: usize) -> Result<Vec<String>, StoreError> {
        let c = self.conn();
        let mut st = c.prepare_cached(
            "SELECT thread_id FROM threads WHERE thread_id > ?1 ORDER BY thread_id LIMIT ?2",
        )?;
        let mut ids = st
            .query_map(params![after.unwrap_or(""), n as i64], |r| {
                r.get::<_, String>(0)
            })?
            .collect::<Result<Vec<_>, _>>()?;
        // Events whose thread row is gone count too: one index seek per distinct thread.
        let mut next =
            c.prepare_cached("SELECT min(thread_id) FROM events WHERE thread_id > ?1")?;
        let mut cursor = after.unwrap_or("").to_string();
        for _ in 0..n {
            let Some(id) = next.query_row([&cursor], |r| r.get::<_, Option<String>>(0))? else {
                break;
            };
            ids.push(id.clone());
            cursor = id;
        }
        ids.sort();
        ids.dedup();
        ids.retain(|id| validate_thread_id(id).is_ok());
        ids.truncate(n);
        Ok(ids)
    }

    fn strays(&self) -> Result<Vec<(String, String)>, StoreError> {
        let c = self.conn();
        let mut st = c.prepare(
            "SELECT thread_id FROM threads UNION SELECT DISTINCT thread_id FROM events ORDER BY 1",
        )?;
        let ids = st
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ids
            .into_iter()
            .filter(|id| validate_thread_id(id).is_err())
            .map(|id| {
                (
                    format!(
                        "{SQLITE_FILE}: thread_id {:?}",
                        id.chars().take(140).collect::<String>()
                    ),
                    "rows under a key that is not a thread id: no thread can own them".into(),
                )
            })
            .collect())
    }
}

impl SqliteBackend {
    fn row(&self, c: &Connection, id: &str) -> Result<Option<Row>, StoreError> {
        Ok(c.query_row(self.row_sql, [id], |r| {
            Ok(Row {
                seq: r.get::<_, i64>(0)? as u64,
                hash: r.get(1)?,
                archived: r.get(2)?,
                format: r.get(3)?,
                compacted_through: r.get::<_, i64>(4)? as u64,
                last_compaction_seq: r.get(5)?,
                mac: r.get(6)?,
                key_id: r.get(7)?,
            })
        })
        .optional()?)
    }

    fn update_row(
        c: &Connection,
        id: &str,
        h: &Head,
        key: Option<&RolloutKey>,
    ) -> Result<(), StoreError> {
        let (mac, kid) = match key {
            Some(k) => {
                let (m, kid, body) = row_mac(k, id, h);
                if let Some(store) = k.store_id() {
                    c.execute(
                        "INSERT OR REPLACE INTO store_bindings (thread_id, store_id, mac) VALUES (?1, ?2, ?3)",
                        params![id, store, k.store_binding_mac(id, store, &body)],
                    )?;
                }
                (Some(m), Some(kid))
            }
            None => (None, None),
        };
        c.execute(
            "UPDATE threads SET head_seq = ?2, head_hash = ?3, archived = ?4, format_version = ?5, compacted_through = ?6, last_compaction_seq = ?7, mac = ?8, key_id = ?9 WHERE thread_id = ?1",
            params![
                id,
                h.last_seq as i64,
                h.head_hash,
                h.archived,
                h.format_version as i64,
                h.compacted_through as i64,
                h.last_compaction_seq.map(|s| s as i64),
                mac,
                kid
            ],
        )?;
        Ok(())
    }

    /// Inserts or replaces the thread row for `h` (an accepted or adopted thread).
    fn put_row(
        c: &Connection,
        id: &str,
        h: &Head,
        key: Option<&RolloutKey>,
    ) -> Result<(), StoreError> {
        c.execute(
            "INSERT OR IGNORE INTO threads (thread_id, head_seq, head_hash, archived, format_version, compacted_through) VALUES (?1, 0, ?2, 0, 1, 0)",
            params![id, ZERO_HASH],
        )?;
        Self::update_row(c, id, h, key)
    }

    /// Adopts a thread under accept_unanchored: the row written and the repair recorded when
    /// the store may write; the warning either way (a read-only store reports, never repairs).
    fn adopt(
        &self,
        c: &Connection,
        id: &str,
        h: &Head,
        warning: String,
        warnings: &mut Vec<String>,
        repairs: &mut Vec<Repair>,
    ) -> Result<(), StoreError> {
        if !self.read_only {
            Self::put_row(c, id, h, self.key.as_ref())?;
            repairs.push(Repair {
                reason: warning.clone(),
                truncated_bytes: 0,
                broken_file: None,
            });
        }
        warnings.push(warning);
        Ok(())
    }
}
