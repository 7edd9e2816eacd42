//! The store identity: a random id created once with a store and kept in its state directory
//! (`STORE_ID`), so keyed anchors can name and authenticate the store that wrote them. A keyed
//! thread copied into another store that uses the same key is then refused by name ("written by
//! another store"), while the store itself, a copy of its whole state directory and a reopen
//! all still verify (docs/rollout-format.md, "Store identity").
//!
//! The id is created by the first writable keyed open of a directory that holds no keyed thread
//! yet (a new store, or one written unkeyed so far); unkeyed stores need none. A directory that
//! already holds keyed threads but no id was written before store ids: it keeps none (its keyed
//! threads keep the binding they were written with, not bound to a store) until its owner binds
//! it (docs/rollout-format.md says how).

use super::fsutil::{Dir, Open};
use super::StoreError;
use std::io::{self, Read, Write};

/// The file name, in the state directory.
pub const STORE_ID_FILE: &str = "STORE_ID";
/// Hex digits of a store id (64 random bits).
pub const STORE_ID_LEN: usize = 16;

/// Whether `s` has the form of a store id: 16 lowercase hex digits.
pub fn is_store_id(s: &str) -> bool {
    s.len() == STORE_ID_LEN
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn damaged(dir: &Dir, why: String) -> StoreError {
    StoreError::Io(io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "{} {why}; it must hold the store's id (16 lowercase hex digits and a newline): restore it from a backup of this state directory",
            dir.path().join(STORE_ID_FILE).display()
        ),
    ))
}

/// The store's id, if its state directory has one. A file that is not exactly an id and a
/// newline is refused (never guessed at).
pub(crate) fn read(dir: &Dir) -> Result<Option<String>, StoreError> {
    let mut f = match dir.open_file(STORE_ID_FILE, Open::Read) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(damaged(dir, format!("cannot be read ({e})"))),
    };
    let mut raw = Vec::new();
    Read::by_ref(&mut f)
        .take(STORE_ID_LEN as u64 + 2)
        .read_to_end(&mut raw)?;
    let text = std::str::from_utf8(&raw).unwrap_or("");
    match text.strip_suffix('\n') {
        Some(id) if is_store_id(id) => Ok(Some(id.to_string())),
        _ => Err(damaged(
            dir,
            format!("is damaged ({} bytes, not an id)", raw.len()),
        )),
    }
}

/// Creates the store's id: written to a temporary file, synced, renamed into place and the
/// directory synced, so a crash leaves either no id (the next open creates one: no keyed anchor
/// can have been written without it) or a complete one. The caller holds the exclusive lock.
pub(crate) fn create(dir: &Dir) -> Result<String, StoreError> {
    let mut raw = [0u8; STORE_ID_LEN / 2];
    getrandom::fill(&mut raw).map_err(|e| {
        StoreError::Io(io::Error::other(format!(
            "no randomness for a store id: {e}"
        )))
    })?;
    let id = cc_agent_protocol::hex_lower(&raw);
    let tmp = format!("{STORE_ID_FILE}.tmp");
    let _ = dir.unlink(&tmp);
    {
        let mut f = dir.open_file(&tmp, Open::CreateNew)?;
        f.write_all(format!("{id}\n").as_bytes())?;
        f.sync_all()?;
    }
    dir.rename(&tmp, STORE_ID_FILE)?;
    dir.sync()?;
    Ok(id)
}
