//! Path resolution beneath the workspace root (unix), one component at a time from descriptors
//! already inside (see the module docs of `workspace_tools`), noting the identity (st_dev,
//! st_ino) of every directory it walks through and of the file it ends at, so protected paths are
//! refused by what they are, not by what they are called.

use super::ToolError;
use std::collections::VecDeque;
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

/// Most symlinks one resolution follows (Linux's own limit).
const MAX_HOPS: usize = 40;

/// What a file or directory is, whatever it is called: (st_dev, st_ino).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Id {
    pub dev: u64,
    pub ino: u64,
}

impl Id {
    // st_dev and st_ino are not u64 everywhere (macOS: i32 and u64).
    #[allow(clippy::unnecessary_cast)]
    pub(super) fn of(st: &libc::stat) -> Id {
        Id {
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
        }
    }
}

/// The server's own paths, as this call sees them: refused by every tool.
#[derive(Debug, Default)]
pub(super) struct Protect {
    pub dirs: Vec<Id>,
    pub files: Vec<Id>,
    /// Protected paths under the root that do not exist (yet), as root-relative components:
    /// refused by name until they exist.
    pub missing: Vec<Vec<OsString>>,
}

impl Protect {
    fn check_dir(&self, id: Id, shown: &Path) -> Result<(), ToolError> {
        if self.dirs.contains(&id) {
            return Err(refused_dir(shown));
        }
        Ok(())
    }

    fn check_file(&self, id: Id, shown: &Path) -> Result<(), ToolError> {
        if self.files.contains(&id) {
            return Err(format!(
                "{:?} is a file the server owns (such as its rollout key); refused",
                shown.display()
            ));
        }
        Ok(())
    }

    /// Refuses a path at or under a protected path that does not exist yet.
    fn check_names(
        &self,
        chain: &[Dir],
        name: Option<&OsStr>,
        shown: &Path,
    ) -> Result<(), ToolError> {
        if self.missing.is_empty() {
            return Ok(());
        }
        let names: Vec<&OsStr> = chain[1..]
            .iter()
            .map(|d| d.name.as_os_str())
            .chain(name)
            .collect();
        for m in &self.missing {
            if names.len() >= m.len() && names.iter().zip(m).all(|(a, b)| *a == b.as_os_str()) {
                return Err(refused_dir(shown));
            }
        }
        Ok(())
    }
}

fn refused_dir(shown: &Path) -> ToolError {
    format!(
        "{:?} is inside the server's state directory (or another path the server owns); refused",
        shown.display()
    )
}

/// One directory of the resolved chain: its descriptor, identity, and the name it was entered by
/// (empty for the root).
#[derive(Debug)]
pub(super) struct Dir {
    pub fd: OwnedFd,
    pub id: Id,
    pub name: OsString,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// A regular file to read.
    Read,
    /// A directory.
    List,
    /// A file to write: parents are created; the final name need not exist.
    Write,
    /// What a write scope entry names now: nothing is created or opened for reading.
    Probe,
}

#[derive(Debug)]
pub(super) enum Found {
    /// The path named a directory: the chain's last.
    Dir,
    /// `Read`: the regular file, open.
    File(std::fs::File),
    /// `Write`: the final name in the chain's last directory, and the regular file it names now
    /// (none when it does not exist).
    Entry {
        name: OsString,
        existing: Option<libc::stat>,
    },
    /// `Probe`: the chain's last directory exists, these components below it do not.
    Missing(Vec<OsString>),
}

impl Walk {
    /// The names from the root down to the target (symlinks followed): what it resolved to.
    fn names<'a>(chain: &'a [Dir], name: Option<&'a OsStr>) -> impl Iterator<Item = &'a OsStr> {
        chain[1..].iter().map(|d| d.name.as_os_str()).chain(name)
    }

    /// The target's workspace-relative path, as resolved.
    pub(super) fn resolved(&self) -> PathBuf {
        let name = match &self.found {
            Found::Entry { name, .. } => Some(name.as_os_str()),
            _ => None,
        };
        Walk::names(&self.chain, name).collect()
    }
}

/// One entry of a write scope, as it resolves at the time of the call.
#[derive(Debug)]
pub(super) enum ScopeEntry {
    /// `*`: the whole workspace.
    All,
    /// A directory: what lies in it, at any depth.
    Dir(Id),
    /// A regular file: exactly that file (that name in that directory).
    File { parent: Id, name: OsString },
    /// A path not there yet: its deepest existing directory and the names below it; what will
    /// be at or under that path.
    Missing { ancestor: Id, rest: Vec<OsString> },
    /// Outside the workspace, protected, or through a file: covers nothing.
    Nothing,
}

/// A graph node's write scope, resolved: writes outside it are refused.
#[derive(Debug)]
pub(super) struct Scope {
    pub entries: Vec<ScopeEntry>,
    /// The scope as declared, for messages.
    pub declared: Vec<String>,
}

impl Scope {
    /// Where the chain, then `more`, lies below `ancestor` (on the chain): the names after it.
    fn below<'a>(
        chain: &'a [Dir],
        more: impl Iterator<Item = &'a OsStr>,
        ancestor: Id,
    ) -> Option<Vec<&'a OsStr>> {
        let at = chain.iter().rposition(|d| d.id == ancestor)?;
        Some(
            chain[at + 1..]
                .iter()
                .map(|d| d.name.as_os_str())
                .chain(more)
                .collect(),
        )
    }

    /// Whether writing the file `names.last()` after creating the directories before it (all
    /// new: nothing below a missing directory exists) in the chain's last directory is inside
    /// the scope.
    fn allows_new<'a>(&self, chain: &'a [Dir], names: &[&'a OsStr]) -> bool {
        self.entries.iter().any(|e| match e {
            ScopeEntry::All => true,
            ScopeEntry::Dir(id) => chain.iter().any(|d| d.id == *id),
            ScopeEntry::File { parent, name } => {
                names.len() == 1
                    && chain.last().is_some_and(|d| d.id == *parent)
                    && names[0] == name.as_os_str()
            }
            ScopeEntry::Missing { ancestor, rest } => {
                Scope::below(chain, names.iter().copied(), *ancestor).is_some_and(|below| {
                    below.len() >= rest.len() && below.iter().zip(rest).all(|(a, b)| *a == b)
                })
            }
            ScopeEntry::Nothing => false,
        })
    }

    /// Whether writing `name` in the chain's last directory is inside the scope.
    fn allows(&self, chain: &[Dir], name: &OsStr) -> bool {
        self.allows_new(chain, &[name])
    }

    fn refusal(&self, rel: &Path, chain: &[Dir], name: &OsStr) -> ToolError {
        let resolved: PathBuf = Walk::names(chain, Some(name)).collect();
        format!(
            "write_file {:?} resolves to {:?}, outside the node's write scope {:?}; refused",
            rel.display(),
            resolved.display(),
            self.declared
        )
    }
}

/// A resolution: the real directories walked from the root to the target, and the target.
#[derive(Debug)]
pub(super) struct Walk {
    pub chain: Vec<Dir>,
    pub found: Found,
}

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::ErrorKind::InvalidInput.into())
}

pub(super) fn openat(
    dir: RawFd,
    name: &OsStr,
    flags: libc::c_int,
    mode: u32,
) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    // SAFETY: a valid NUL-terminated name and a directory fd we own; the result is checked.
    let fd = unsafe { libc::openat(dir, c.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by openat and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn readlinkat(dir: RawFd, name: &OsStr) -> io::Result<OsString> {
    let c = cstr(name)?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: `buf` is writable for its length; the length returned is checked.
    let n = unsafe { libc::readlinkat(dir, c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(OsString::from_vec(buf))
}

fn mkdirat(dir: RawFd, name: &OsStr) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: as for openat.
    if unsafe { libc::mkdirat(dir, c.as_ptr(), 0o755) } < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::AlreadyExists {
            return Err(e);
        }
    }
    Ok(())
}

pub(super) fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: `st` is fully written by fstat on success.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

pub(super) fn fstatat(dir: RawFd, name: &OsStr) -> io::Result<libc::stat> {
    let c = cstr(name)?;
    // SAFETY: as for fstat; AT_SYMLINK_NOFOLLOW describes the entry itself.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatat(dir, c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// A new, empty temporary file in `dir` (O_CREAT|O_EXCL|O_NOFOLLOW, so nothing existing is
/// reused or followed), with `mode` (less the umask): its name and descriptor.
pub(super) fn create_temporary(dir: RawFd, mode: u32) -> io::Result<(OsString, OwnedFd)> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut last = io::Error::from(io::ErrorKind::AlreadyExists);
    for _ in 0..100 {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = OsString::from(format!(".cc-tmp-{}-{n}", std::process::id()));
        match openat(
            dir,
            &name,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            mode,
        ) {
            Ok(fd) => return Ok((name, fd)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = e,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

pub(super) fn renameat(dir: RawFd, from: &OsStr, to: &OsStr) -> io::Result<()> {
    let (from, to) = (cstr(from)?, cstr(to)?);
    // SAFETY: two valid names relative to a directory fd we own.
    if unsafe { libc::renameat(dir, from.as_ptr(), dir, to.as_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Removes `name` from `dir`, quietly (cleanup after a failure).
pub(super) fn unlinkat(dir: RawFd, name: &OsStr) {
    if let Ok(c) = cstr(name) {
        // SAFETY: a valid name relative to a directory fd we own.
        unsafe { libc::unlinkat(dir, c.as_ptr(), 0) };
    }
}

pub(super) fn fsync(fd: RawFd) -> io::Result<()> {
    // SAFETY: fsync on a descriptor we own.
    if unsafe { libc::fsync(fd) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn kind(st: &libc::stat) -> libc::mode_t {
    st.st_mode & libc::S_IFMT
}

pub(super) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let c = cstr(path.as_os_str())?;
    // SAFETY: as for openat.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just opened, owned here.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn components(p: &Path) -> VecDeque<OsString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

fn escape(shown: &Path) -> ToolError {
    format!(
        "{:?} leads outside the workspace; only paths inside it are allowed",
        shown.display()
    )
}

/// What a resolution needs: the root (path and descriptor), the protected paths, and for a
/// scoped write its write scope.
pub(super) struct Rules<'a> {
    pub root: &'a Path,
    pub root_fd: &'a OwnedFd,
    pub protect: &'a Protect,
    pub scope: Option<&'a Scope>,
}

/// What the write scope entry `entry` (workspace-relative) names now.
pub(super) fn scope_entry(rules: &Rules, entry: &Path) -> ScopeEntry {
    match resolve(rules, entry, Mode::Probe) {
        Ok(Walk {
            chain,
            found: Found::Dir,
        }) => ScopeEntry::Dir(chain.last().expect("the root stays on the chain").id),
        Ok(Walk {
            chain,
            found: Found::Entry { name, .. },
        }) => ScopeEntry::File {
            parent: chain.last().expect("the root stays on the chain").id,
            name,
        },
        Ok(Walk {
            chain,
            found: Found::Missing(rest),
        }) if !rest.iter().any(|c| c == "..") => ScopeEntry::Missing {
            ancestor: chain.last().expect("the root stays on the chain").id,
            rest,
        },
        _ => ScopeEntry::Nothing,
    }
}

fn is_symlink_error(e: &io::Error) -> bool {
    // ELOOP/ENOTDIR/EMLINK (FreeBSD) are what O_NOFOLLOW says about a symlink.
    matches!(
        e.raw_os_error().unwrap_or(0),
        libc::ELOOP | libc::ENOTDIR | libc::EMLINK
    )
}

/// Resolves `rel` beneath the root component by component (see the module docs), refusing any
/// directory or file that is protected, whatever name or link leads there.
pub(super) fn resolve(rules: &Rules, rel: &Path, mode: Mode) -> Result<Walk, ToolError> {
    let io = |e: io::Error| format!("{:?}: {e}", rel.display());
    let mut queue = components(rel);
    let root_fd = rules.root_fd.try_clone().map_err(io)?;
    let root_id = Id::of(&fstat(root_fd.as_raw_fd()).map_err(io)?);
    let mut chain = vec![Dir {
        fd: root_fd,
        id: root_id,
        name: OsString::new(),
    }];
    let mut hops = 0;
    // A symlink met at `name` in `top`: its target's components go to the front of the queue.
    let mut follow = |top: RawFd,
                      name: &OsStr,
                      chain: &mut Vec<Dir>,
                      queue: &mut VecDeque<OsString>|
     -> Result<bool, ToolError> {
        let Ok(target) = readlinkat(top, name) else {
            return Ok(false);
        };
        hops += 1;
        if hops > MAX_HOPS {
            return Err(format!("{:?}: too many symlinks", rel.display()));
        }
        let target = Path::new(&target);
        let rest = if target.is_absolute() {
            let inside = target.strip_prefix(rules.root).map_err(|_| escape(rel))?;
            chain.truncate(1);
            components(inside)
        } else {
            components(target)
        };
        for c in rest.into_iter().rev() {
            queue.push_front(c);
        }
        Ok(true)
    };
    while let Some(name) = queue.pop_front() {
        if name == ".." {
            if chain.len() == 1 {
                return Err(escape(rel));
            }
            chain.pop();
            continue;
        }
        let top = chain
            .last()
            .expect("the root stays on the chain")
            .fd
            .as_raw_fd();
        let is_last = queue.is_empty();
        if !is_last || mode == Mode::List {
            match openat(
                top,
                &name,
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                0,
            ) {
                Ok(fd) => {
                    let id = Id::of(&fstat(fd.as_raw_fd()).map_err(io)?);
                    rules.protect.check_dir(id, rel)?;
                    rules.protect.check_names(&chain, Some(&name), rel)?;
                    chain.push(Dir { fd, id, name });
                }
                Err(e) if is_symlink_error(&e) && follow(top, &name, &mut chain, &mut queue)? => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound && mode == Mode::Write => {
                    rules.protect.check_names(&chain, Some(&name), rel)?;
                    if let Some(scope) = rules.scope {
                        // Nothing below a missing directory exists, so the rest of the path is
                        // what will be created: judged before anything is (a `..` in it is
                        // refused rather than followed back into what exists).
                        let new: Vec<&OsStr> = std::iter::once(name.as_os_str())
                            .chain(queue.iter().map(OsString::as_os_str))
                            .collect();
                        if new.iter().any(|c| *c == "..") || !scope.allows_new(&chain, &new) {
                            let path: PathBuf = new.iter().collect();
                            return Err(scope.refusal(rel, &chain, path.as_os_str()));
                        }
                    }
                    mkdirat(top, &name).map_err(io)?;
                    queue.push_front(name);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound && mode == Mode::Probe => {
                    queue.push_front(name);
                    return Ok(Walk {
                        chain,
                        found: Found::Missing(queue.into_iter().collect()),
                    });
                }
                Err(e) => return Err(io(e)),
            }
            continue;
        }
        if mode == Mode::Read {
            let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK;
            match openat(top, &name, flags, 0) {
                Ok(fd) => {
                    let st = fstat(fd.as_raw_fd()).map_err(io)?;
                    let id = Id::of(&st);
                    match kind(&st) {
                        libc::S_IFREG => {
                            rules.protect.check_file(id, rel)?;
                            rules.protect.check_names(&chain, Some(&name), rel)?;
                            // Regular files ignore O_NONBLOCK; it only kept a FIFO from
                            // blocking the open.
                            return Ok(Walk {
                                chain,
                                found: Found::File(std::fs::File::from(fd)),
                            });
                        }
                        libc::S_IFDIR => {
                            rules.protect.check_dir(id, rel)?;
                            chain.push(Dir { fd, id, name });
                            return Ok(Walk {
                                chain,
                                found: Found::Dir,
                            });
                        }
                        _ => return Err(io(io::Error::other("not a regular file"))),
                    }
                }
                Err(e) if is_symlink_error(&e) && follow(top, &name, &mut chain, &mut queue)? => {
                    continue
                }
                Err(e) => return Err(io(e)),
            }
        }
        // Write (and Probe): what the final name is now, without following it.
        match fstatat(top, &name) {
            Ok(st) if kind(&st) == libc::S_IFLNK => {
                if !follow(top, &name, &mut chain, &mut queue)? {
                    return Err(io(io::Error::other("unreadable symlink")));
                }
            }
            Ok(st) if kind(&st) == libc::S_IFREG => {
                rules.protect.check_file(Id::of(&st), rel)?;
                return entry(rules, rel, chain, name, Some(st));
            }
            Ok(st) if kind(&st) == libc::S_IFDIR && mode == Mode::Probe => {
                // Named a directory: entered (and checked) as any directory is.
                let fd = openat(
                    top,
                    &name,
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                    0,
                )
                .map_err(io)?;
                let id = Id::of(&fstat(fd.as_raw_fd()).map_err(io)?);
                rules.protect.check_dir(id, rel)?;
                chain.push(Dir { fd, id, name });
            }
            Ok(st) if kind(&st) == libc::S_IFDIR => {
                return Err(format!("{:?} is a directory, not a file", rel.display()))
            }
            Ok(_) => return Err(io(io::Error::other("not a regular file"))),
            Err(e) if e.kind() == io::ErrorKind::NotFound && mode == Mode::Probe => {
                return Ok(Walk {
                    chain,
                    found: Found::Missing(vec![name]),
                });
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return entry(rules, rel, chain, name, None);
            }
            Err(e) => return Err(io(e)),
        }
    }
    // The path named a directory (".", "a/..", or ended at one).
    match mode {
        Mode::List | Mode::Probe => {
            rules.protect.check_names(&chain, None, rel)?;
            Ok(Walk {
                chain,
                found: Found::Dir,
            })
        }
        _ => Err(format!("{:?} is a directory, not a file", rel.display())),
    }
}

/// The entries of an open directory: (name, type, size).
/// The final name of a write, existing (`Some`) or to be created: refused if it is a protected
/// name or, under a write scope, outside it; else the walk's result.
fn entry(
    rules: &Rules,
    rel: &Path,
    chain: Vec<Dir>,
    name: OsString,
    existing: Option<libc::stat>,
) -> Result<Walk, ToolError> {
    rules.protect.check_names(&chain, Some(&name), rel)?;
    if let Some(scope) = rules.scope {
        if !scope.allows(&chain, &name) {
            return Err(scope.refusal(rel, &chain, &name));
        }
    }
    Ok(Walk {
        chain,
        found: Found::Entry { name, existing },
    })
}

pub(super) fn list(fd: OwnedFd) -> Result<Vec<(String, &'static str, u64)>, ToolError> {
    let raw = fd.as_raw_fd();
    // A second descriptor for fstatat: fdopendir takes ownership of the first.
    let statfd = fd.try_clone().map_err(|e| e.to_string())?;
    std::mem::forget(fd);
    // SAFETY: `raw` is an open directory descriptor whose ownership passes to the DIR.
    let dir = unsafe { libc::fdopendir(raw) };
    if dir.is_null() {
        // SAFETY: fdopendir failed, so `raw` is still ours to close.
        unsafe { libc::close(raw) };
        return Err(io::Error::last_os_error().to_string());
    }
    let mut out = Vec::new();
    loop {
        // SAFETY: `dir` is a valid DIR*; readdir returns null at the end.
        let ent = unsafe { libc::readdir(dir) };
        if ent.is_null() {
            break;
        }
        // SAFETY: d_name is NUL-terminated within the dirent.
        let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) };
        let bytes = name.to_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        let st = fstatat(statfd.as_raw_fd(), OsStr::from_bytes(bytes)).ok();
        let kind = match st.as_ref().map(kind) {
            None => "unknown",
            Some(libc::S_IFREG) => "file",
            Some(libc::S_IFDIR) => "directory",
            Some(libc::S_IFLNK) => "symlink",
            Some(_) => "other",
        };
        out.push((
            String::from_utf8_lossy(bytes).into_owned(),
            kind,
            st.map_or(0, |s| s.st_size as u64),
        ));
    }
    // SAFETY: closes the DIR and the descriptor it owns.
    unsafe { libc::closedir(dir) };
    Ok(out)
}
