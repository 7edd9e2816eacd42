//! File-system helpers for the rollout stores: the private state directory pinned by a
//! descriptor, the single-writer lock, 0600 files and directory fsyncs, kept in one place so both
//! stores enforce them alike.
//!
//! The state directory is resolved once, at open: every later file is created, opened, renamed or
//! removed relative to a directory descriptor (`openat`, `mkdirat`, `renameat`, `unlinkat`), so
//! re-pointing a symlinked state path, or renaming the directory, mid-run changes nothing about
//! where the store writes.

use super::StoreError;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CStr, CString, OsString};
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A directory held open by descriptor. `path` is only for messages: it may no longer name this
/// directory. A read-only store opens a missing subdirectory as absent (no descriptor): it lists
/// as empty and every file in it is missing, so inspecting a directory never creates one.
pub(crate) struct Dir {
    fd: Option<OwnedFd>,
    path: PathBuf,
}

fn cname(name: &str) -> io::Result<CString> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a plain file name"),
        ));
    }
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a name"))
}

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn clear_errno() {
    // SAFETY: each returns this thread's errno slot, valid for the thread's lifetime.
    unsafe {
        #[cfg(target_os = "linux")]
        {
            *libc::__errno_location() = 0;
        }
        #[cfg(target_os = "android")]
        {
            *libc::__errno() = 0;
        }
        #[cfg(any(target_os = "macos", target_os = "ios"))]
        {
            *libc::__error() = 0;
        }
    }
}

/// How `Dir::open_file` opens.
#[derive(Clone, Copy)]
pub(crate) enum Open {
    Read,
    ReadWrite,
    Append,
    /// Read+write, created 0600 if missing.
    CreateReadWrite,
    /// Write, created 0600, refused if it exists.
    CreateNew,
}

impl Dir {
    /// Opens `path` (following a symlink in it this once) as a directory.
    pub(crate) fn open(path: &Path) -> io::Result<Dir> {
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a path"))?;
        // SAFETY: `c` is a valid NUL-terminated string for the call.
        let fd = cvt(unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })?;
        Ok(Dir {
            // SAFETY: `fd` was just returned by open and is owned by nobody else.
            fd: Some(unsafe { OwnedFd::from_raw_fd(fd) }),
            path: path.to_path_buf(),
        })
    }

    /// The path this directory was opened by (for messages only).
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The descriptor, or NotFound for an absent directory.
    fn raw(&self) -> io::Result<libc::c_int> {
        match &self.fd {
            Some(fd) => Ok(fd.as_raw_fd()),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} does not exist", self.path.display()),
            )),
        }
    }

    /// An existing subdirectory, never created: absent if missing (for read-only opens); a
    /// symlink or a file in its place is refused as `subdir` refuses it.
    pub(crate) fn existing_subdir(&self, name: &str) -> Result<Dir, StoreError> {
        let c = cname(name)?;
        // SAFETY: valid descriptor and NUL-terminated name.
        let fd = unsafe {
            libc::openat(
                self.raw()?,
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        let path = self.path.join(name);
        if fd < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::NotFound {
                return Ok(Dir { fd: None, path });
            }
            return Err(StoreError::UnsafeStateDir(format!(
                "{} is not a plain directory ({e}); it must not be a symlink: give the real path",
                path.display()
            )));
        }
        let dir = Dir {
            // SAFETY: `fd` was just returned by openat and is owned by nobody else.
            fd: Some(unsafe { OwnedFd::from_raw_fd(fd) }),
            path,
        };
        dir.check_private()?;
        Ok(dir)
    }

    /// A subdirectory, created 0700 if missing; a symlink in its place is refused.
    pub(crate) fn subdir(&self, name: &str) -> Result<Dir, StoreError> {
        let c = cname(name)?;
        // SAFETY: valid descriptor and NUL-terminated name.
        let rc = unsafe { libc::mkdirat(self.raw()?, c.as_ptr(), 0o700) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::AlreadyExists {
                return Err(e.into());
            }
        }
        // SAFETY: valid descriptor and NUL-terminated name.
        let fd = unsafe {
            libc::openat(
                self.raw()?,
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(StoreError::UnsafeStateDir(format!(
                "{} is not a plain directory ({e}); it must not be a symlink: give the real path",
                self.path.join(name).display()
            )));
        }
        let dir = Dir {
            // SAFETY: `fd` was just returned by openat and is owned by nobody else.
            fd: Some(unsafe { OwnedFd::from_raw_fd(fd) }),
            path: self.path.join(name),
        };
        if rc == 0 {
            // The umask may have removed bits but never adds any; make it exactly 0700.
            // SAFETY: valid descriptor.
            cvt(unsafe { libc::fchmod(dir.raw()?, 0o700) })?;
        }
        dir.check_private()?;
        Ok(dir)
    }

    /// A directory others can write lets them swap our logs; refuse it with the exact mode.
    pub(crate) fn check_private(&self) -> Result<(), StoreError> {
        let st = self.fstat()?;
        let mode = st.st_mode & 0o7777;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(StoreError::UnsafeStateDir(format!(
                "{} is not a directory; give the path of a directory (one that does not exist is created)",
                self.path.display()
            )));
        }
        if mode & 0o022 != 0 {
            return Err(StoreError::UnsafeStateDir(format!(
                "{} has mode {mode:o}, writable by group or others; run `chmod 700 {}`",
                self.path.display(),
                self.path.display()
            )));
        }
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if st.st_uid != me {
            return Err(StoreError::UnsafeStateDir(format!(
                "{} is owned by uid {}, not by us ({me})",
                self.path.display(),
                st.st_uid
            )));
        }
        Ok(())
    }

    fn fstat(&self) -> io::Result<libc::stat> {
        // SAFETY: a zeroed stat is a valid out-buffer; the descriptor is valid.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            cvt(libc::fstat(self.raw()?, &mut st))?;
            Ok(st)
        }
    }

    /// (device, inode): who this directory is, whatever path leads to it now.
    pub(crate) fn identity(&self) -> io::Result<(u64, u64)> {
        let st = self.fstat()?;
        // The field types differ between platforms (u64 on Linux, i32/u64 on Apple).
        #[allow(clippy::unnecessary_cast)]
        Ok((st.st_dev as u64, st.st_ino as u64))
    }

    /// Opens a file in this directory; never follows a symlink in its place.
    pub(crate) fn open_file(&self, name: &str, how: Open) -> io::Result<File> {
        let c = cname(name)?;
        let flags = libc::O_CLOEXEC
            | libc::O_NOFOLLOW
            | match how {
                Open::Read => libc::O_RDONLY,
                Open::ReadWrite => libc::O_RDWR,
                Open::Append => libc::O_WRONLY | libc::O_APPEND,
                Open::CreateReadWrite => libc::O_RDWR | libc::O_CREAT,
                Open::CreateNew => libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            };
        // SAFETY: valid descriptor and NUL-terminated name; mode is passed as the variadic arg.
        let fd =
            cvt(unsafe { libc::openat(self.raw()?, c.as_ptr(), flags, 0o600 as libc::c_uint) })?;
        // SAFETY: `fd` was just returned by openat and is owned by nobody else.
        Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Whether `name` exists (a symlink counts, and is not followed).
    pub(crate) fn exists(&self, name: &str) -> io::Result<bool> {
        let c = cname(name)?;
        let Some(fd) = &self.fd else { return Ok(false) };
        // SAFETY: a zeroed stat is a valid out-buffer; valid descriptor and name.
        let rc = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            libc::fstatat(
                fd.as_raw_fd(),
                c.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if rc == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::NotFound {
            Ok(false)
        } else {
            Err(e)
        }
    }

    pub(crate) fn unlink(&self, name: &str) -> io::Result<()> {
        let c = cname(name)?;
        // SAFETY: valid descriptor and NUL-terminated name.
        cvt(unsafe { libc::unlinkat(self.raw()?, c.as_ptr(), 0) }).map(drop)
    }

    /// Renames within this directory (atomically replacing `to`).
    pub(crate) fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let (f, t) = (cname(from)?, cname(to)?);
        let fd = self.raw()?;
        // SAFETY: valid descriptors and NUL-terminated names.
        cvt(unsafe { libc::renameat(fd, f.as_ptr(), fd, t.as_ptr()) }).map(drop)
    }

    /// Every entry name except `.` and `..`, in no particular order.
    pub(crate) fn names(&self) -> io::Result<Vec<OsString>> {
        let Some(own) = &self.fd else {
            return Ok(Vec::new());
        };
        // A fresh open file description: a DIR stream owns its descriptor and its position.
        // SAFETY: valid descriptor; "." is a NUL-terminated literal.
        let fd = cvt(unsafe {
            libc::openat(
                own.as_raw_fd(),
                c".".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: `fd` is an open directory descriptor that the DIR stream now owns.
        let dir = unsafe { libc::fdopendir(fd) };
        if dir.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: fdopendir failed, so `fd` is still ours to close.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        let mut out = Vec::new();
        loop {
            // `dir` is a valid stream used by this thread only. errno is reset so that
            // end-of-stream (NULL, errno 0) is told apart from an error.
            clear_errno();
            // SAFETY: as above.
            let ent = unsafe { libc::readdir(dir) };
            if ent.is_null() {
                let e = io::Error::last_os_error();
                // SAFETY: closes the stream (and its descriptor) exactly once.
                unsafe { libc::closedir(dir) };
                if e.raw_os_error().unwrap_or(0) != 0 {
                    return Err(e);
                }
                return Ok(out);
            }
            // SAFETY: d_name is a NUL-terminated name inside the entry readdir returned.
            let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) };
            let bytes = name.to_bytes();
            if bytes != b"." && bytes != b".." {
                out.push(OsString::from_vec(bytes.to_vec()));
            }
        }
    }

    /// Makes created, renamed and removed entries durable.
    pub(crate) fn sync(&self) -> io::Result<()> {
        // SAFETY: valid descriptor.
        cvt(unsafe { libc::fsync(self.raw()?) }).map(drop)
    }

    /// A path that reaches `name` inside this very directory, for libraries that only take
    /// paths (SQLite): through `/proc/self/fd` on Linux and Android, the directory's current
    /// real path (F_GETPATH) on Apple systems. See docs/rollout-format.md, "State directory".
    pub(crate) fn pinned_path(&self, name: &str) -> io::Result<PathBuf> {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            let p = PathBuf::from(format!("/proc/self/fd/{}", self.raw()?));
            if p.is_dir() {
                return Ok(p.join(name));
            }
            Err(io::Error::other(
                "/proc/self/fd is not available; mount /proc to use the SQLite store",
            ))
        }
        #[cfg(any(target_os = "macos", target_os = "ios"))]
        {
            let mut buf = vec![0u8; libc::PATH_MAX as usize];
            // SAFETY: F_GETPATH writes at most PATH_MAX bytes into `buf`.
            cvt(unsafe { libc::fcntl(self.raw()?, libc::F_GETPATH, buf.as_mut_ptr()) })?;
            let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
            buf.truncate(end);
            return Ok(PathBuf::from(OsString::from_vec(buf)).join(name));
        }
        #[cfg(not(any(
            target_os = "linux",
            target_os = "android",
            target_os = "macos",
            target_os = "ios"
        )))]
        {
            Ok(self.path.join(name))
        }
    }
}

/// The lock of a state directory, held for the store's lifetime: exclusive for a store that
/// writes, shared for a read-only one (several readers, no writer).
///
/// A POSIX record lock (fcntl) rather than flock: flock belongs to the open file description,
/// which a child forked by any thread of the host holds until it execs, so a reopen racing a
/// spawn would spuriously fail. Record locks are per process and never inherited; the
/// in-process registry covers a second store in the same process, which record locks cannot
/// see. It also keeps one descriptor of the lock file per process for all readers of a
/// directory: closing any descriptor of a file drops every record lock the process holds on it,
/// so one reader closing its own would silently release the others' shared lock.
pub(crate) struct DirLock {
    _file: Option<File>,
    key: (u64, u64),
    shared: bool,
}

#[derive(Default)]
struct Registry {
    writers: BTreeSet<(u64, u64)>,
    /// Directory → (open read-only stores, the lock file they share if it exists).
    readers: BTreeMap<(u64, u64), (usize, Option<File>)>,
}

static HELD: Mutex<Registry> = Mutex::new(Registry {
    writers: BTreeSet::new(),
    readers: BTreeMap::new(),
});

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    HELD.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for DirLock {
    fn drop(&mut self) {
        let mut reg = registry();
        if !self.shared {
            reg.writers.remove(&self.key);
            return;
        }
        if let Some((n, _)) = reg.readers.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                // The last reader: its descriptor (and with it the shared lock) goes.
                reg.readers.remove(&self.key);
            }
        }
    }
}

/// The directory is held by another store of this very process (the in-process registry).
fn locked_here(dir: &Path) -> StoreError {
    StoreError::Locked(format!(
        "{} is in use by another store in this process (an app server or store opened on it and not yet closed); close that one first, or use another directory",
        dir.display()
    ))
}

/// The directory is held by another process (its record lock).
fn locked_elsewhere(dir: &Path) -> StoreError {
    StoreError::Locked(format!(
        "{} is in use by another process (it holds the directory's lock); stop that process, or use another directory",
        dir.display()
    ))
}

/// Takes a record lock of `kind` (F_RDLCK / F_WRLCK) on the whole file, without waiting.
fn record_lock(file: &File, kind: libc::c_int, dir: &Path) -> Result<(), StoreError> {
    // SAFETY: a zeroed flock struct is valid; fcntl gets a pointer to it for the call only.
    let rc = unsafe {
        let mut fl: libc::flock = std::mem::zeroed();
        fl.l_type = kind as _;
        fl.l_whence = libc::SEEK_SET as _;
        libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &fl)
    };
    if rc != 0 {
        let err = io::Error::last_os_error();
        if matches!(err.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) {
            return Err(locked_elsewhere(dir));
        }
        return Err(err.into());
    }
    Ok(())
}

fn pin(dir: &Path) -> Result<Dir, StoreError> {
    let pinned = Dir::open(dir).map_err(|e| {
        if e.raw_os_error() == Some(libc::ENOTDIR) {
            StoreError::UnsafeStateDir(format!(
                "{} is a file, not a directory; give the path of a directory (one that does not exist is created)",
                dir.display()
            ))
        } else {
            StoreError::Io(e)
        }
    })?;
    pinned.check_private()?;
    Ok(pinned)
}

/// Creates `dir` (0700) if missing, opens it once (the store then never resolves the path
/// again), refuses it if group/others can write it or another user owns it, and takes the
/// exclusive lock that keeps a second store (a reader too) out of the same directory.
pub(crate) fn prepare_state_dir(dir: &Path) -> Result<(Dir, DirLock), StoreError> {
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        // The umask could have removed bits but never adds any; set exactly 0700 anyway.
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    let pinned = pin(dir)?;
    let key = pinned.identity()?;
    let mut reg = registry();
    if reg.writers.contains(&key) || reg.readers.contains_key(&key) {
        return Err(locked_here(dir));
    }
    let file = pinned.open_file(super::layout::LOCK_FILE, Open::CreateReadWrite)?;
    record_lock(&file, libc::F_WRLCK, dir)?;
    reg.writers.insert(key);
    Ok((
        pinned,
        DirLock {
            _file: Some(file),
            key,
            shared: false,
        },
    ))
}

/// Opens an existing state directory for reading only: nothing is created or written, not even
/// the lock file. If the lock file exists it is opened read-only and share-locked, so a store
/// writing the directory (here or in another process) refuses to start meanwhile and one
/// already writing it makes this open fail with `Locked`; a directory without one (a copy made
/// without it, a snapshot) is read without a lock. Works on a read-only file system.
pub(crate) fn open_state_dir_read_only(dir: &Path) -> Result<(Dir, DirLock), StoreError> {
    if !dir.is_dir() {
        return Err(StoreError::Io(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "no state directory at {} (a read-only open creates none)",
                dir.display()
            ),
        )));
    }
    let pinned = pin(dir)?;
    let key = pinned.identity()?;
    let mut reg = registry();
    if reg.writers.contains(&key) {
        return Err(locked_here(dir));
    }
    if let Some((n, _)) = reg.readers.get_mut(&key) {
        *n += 1;
    } else {
        let file = match pinned.open_file(super::layout::LOCK_FILE, Open::Read) {
            Ok(f) => {
                record_lock(&f, libc::F_RDLCK, dir)?;
                Some(f)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e.into()),
        };
        reg.readers.insert(key, (1, file));
    }
    Ok((
        pinned,
        DirLock {
            _file: None,
            key,
            shared: true,
        },
    ))
}

/// fdatasync: the file's data and size, not its timestamps.
pub(crate) fn fdatasync(f: &File) -> io::Result<()> {
    f.sync_data()
}
