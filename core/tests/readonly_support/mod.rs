//! What the read-only tests of the core and the CLI share: a byte-and-timestamp snapshot of a
//! directory tree, the check that nothing in it changed, and a real read-only file system (a
//! read-only bind mount) with the permission fallback where mounting is denied.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every entry under `root` (the root included, symlinks not followed): its type, mode, owner,
/// size, mtime and ctime to the nanosecond, and a file's SHA-256.
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, String> {
    fn walk(root: &Path, p: &Path, out: &mut BTreeMap<PathBuf, String>) {
        let m = fs::symlink_metadata(p).unwrap();
        let content = if m.is_file() {
            cc_agent_protocol::sha256_hex(&fs::read(p).unwrap())
        } else {
            String::new()
        };
        out.insert(
            p.strip_prefix(root).unwrap().to_path_buf(),
            format!(
                "mode={:o} uid={} size={} mtime={}.{} ctime={}.{} {content}",
                m.mode(),
                m.uid(),
                m.size(),
                m.mtime(),
                m.mtime_nsec(),
                m.ctime(),
                m.ctime_nsec()
            ),
        );
        if m.is_dir() {
            for e in fs::read_dir(p).unwrap() {
                walk(root, &e.unwrap().path(), out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// Fails naming the first entry of `dir` that changed, appeared or disappeared since `before`.
pub fn assert_unchanged(before: &BTreeMap<PathBuf, String>, dir: &Path, what: &str) {
    let after = snapshot(dir);
    for (p, v) in &after {
        assert_eq!(
            before.get(p),
            Some(v),
            "{what}: {} changed or appeared",
            p.display()
        );
    }
    for p in before.keys() {
        assert!(after.contains_key(p), "{what}: {} disappeared", p.display());
    }
}

/// A read-only bind mount of a directory, unmounted on drop.
pub struct ReadOnlyMount {
    target: PathBuf,
}

impl ReadOnlyMount {
    /// Mounts `src` read-only at `target`. As root (here and in CI) a real read-only mount is
    /// the only thing that makes writes fail; where mounting is denied, `None`, and the caller
    /// removes write permission instead (`chmod_read_only`, which stops other users only).
    pub fn new(src: &Path, target: &Path) -> Option<ReadOnlyMount> {
        fs::create_dir_all(target).unwrap();
        let run = |args: &[&str]| {
            Command::new("mount")
                .args(args)
                .output()
                .map(|o| {
                    (
                        o.status.success(),
                        String::from_utf8_lossy(&o.stderr).into_owned(),
                    )
                })
                .unwrap_or((false, "mount is not installed".into()))
        };
        let (s, t) = (src.to_str().unwrap(), target.to_str().unwrap());
        let (ok, why) = run(&["--bind", s, t]);
        if !ok {
            eprintln!("no read-only bind mount (root: {}): {why}", is_root());
            return None;
        }
        let m = ReadOnlyMount {
            target: target.to_path_buf(),
        };
        let (ok, why) = run(&["-o", "remount,bind,ro", t]);
        assert!(ok, "remount read-only: {why}");
        Some(m)
    }
}

impl Drop for ReadOnlyMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.target).status();
    }
}

/// Removes write permission from every entry (what stops a writer that is not root).
pub fn chmod_read_only(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let m = fs::symlink_metadata(p).unwrap();
    if m.is_dir() {
        for e in fs::read_dir(p).unwrap() {
            chmod_read_only(&e.unwrap().path());
        }
    }
    fs::set_permissions(p, fs::Permissions::from_mode(m.mode() & 0o555)).unwrap();
}

/// Whether writes to `mount` (or, without one, to permission-stripped files) fail for us: with
/// the fallback, root ignores the permission bits.
pub fn writes_fail(mount: &Option<ReadOnlyMount>) -> bool {
    mount.is_some() || !is_root()
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
