//! File-system helpers for the rollout stores: the private state directory, the single-writer
//! lock, 0600 files and directory fsyncs, kept in one place so both stores enforce them alike.

use super::StoreError;
use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The single-writer lock of a state directory, held for the store's lifetime.
///
/// A POSIX record lock (fcntl) rather than flock: flock belongs to the open file description,
/// which a child forked by any thread of the host holds until it execs, so a reopen racing a
/// spawn would spuriously fail. Record locks are per process and never inherited; the
/// in-process set covers a second store in the same process, which record locks cannot see.
pub(crate) struct DirLock {
    _file: File,
    key: PathBuf,
}

static HELD: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

impl Drop for DirLock {
    fn drop(&mut self) {
        HELD.lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

/// Creates `dir` (0700) if missing, refuses it if group/others can write it or another user owns
/// it, and takes the exclusive lock that keeps a second store out of the same directory.
pub(crate) fn prepare_state_dir(dir: &Path) -> Result<DirLock, StoreError> {
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        // The umask could have removed bits but never adds any; set exactly 0700 anyway.
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    check_private_dir(dir)?;
    let key = dir.canonicalize()?;
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    if held.contains(&key) {
        return Err(StoreError::Locked(dir.display().to_string()));
    }
    let file = open_private(&dir.join(super::layout::LOCK_FILE), false)?;
    // SAFETY: a zeroed flock struct is valid; fcntl gets a pointer to it for the call only.
    let rc = unsafe {
        let mut fl: libc::flock = std::mem::zeroed();
        fl.l_type = libc::F_WRLCK as _;
        fl.l_whence = libc::SEEK_SET as _;
        libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &fl)
    };
    if rc != 0 {
        let err = io::Error::last_os_error();
        if matches!(err.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) {
            return Err(StoreError::Locked(dir.display().to_string()));
        }
        return Err(err.into());
    }
    held.insert(key.clone());
    Ok(DirLock { _file: file, key })
}

/// A directory others can write lets them swap our logs; refuse it with the exact mode.
pub(crate) fn check_private_dir(dir: &Path) -> Result<(), StoreError> {
    let meta = fs::metadata(dir)?;
    if !meta.is_dir() {
        return Err(StoreError::UnsafeStateDir(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(StoreError::UnsafeStateDir(format!(
            "{} has mode {mode:o}, writable by group or others",
            dir.display()
        )));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(StoreError::UnsafeStateDir(format!(
            "{} is owned by uid {}, not by us ({me})",
            dir.display(),
            meta.uid()
        )));
    }
    Ok(())
}

/// Creates a private subdirectory (0700).
pub(crate) fn ensure_private_subdir(dir: &Path) -> Result<(), StoreError> {
    if !dir.exists() {
        fs::DirBuilder::new().mode(0o700).create(dir)?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    check_private_dir(dir)
}

/// Opens (creating 0600 if needed) a file for read+write; `create_new` refuses an existing one.
pub(crate) fn open_private(path: &Path, create_new: bool) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(true).mode(0o600);
    if create_new {
        o.create_new(true);
    } else {
        o.create(true);
    }
    o.open(path)
}

/// Makes a directory entry (a created or renamed file) durable.
pub(crate) fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// fdatasync: the file's data and size, not its timestamps.
pub(crate) fn fdatasync(f: &File) -> io::Result<()> {
    f.sync_data()
}
