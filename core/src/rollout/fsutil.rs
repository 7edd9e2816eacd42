//! File-system helpers for the rollout stores: the private state directory, the single-writer
//! lock, 0600 files and directory fsyncs, kept in one place so both stores enforce them alike.

use super::StoreError;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// Creates `dir` (0700) if missing, refuses it if group/others can write it or another user owns
/// it, and takes the exclusive lock that keeps a second store out of the same directory.
pub(crate) fn prepare_state_dir(dir: &Path) -> Result<File, StoreError> {
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        // The umask could have removed bits but never adds any; set exactly 0700 anyway.
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    check_private_dir(dir)?;
    let lock = open_private(&dir.join("LOCK"), false)?;
    // SAFETY: flock on a descriptor we own; no memory is passed.
    let rc = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(StoreError::Locked(dir.display().to_string()));
        }
        return Err(err.into());
    }
    Ok(lock)
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
