//! write_file replaces a file atomically (a temporary file in the same directory, fsynced, then
//! renamed over the target): the permission bits and owner are kept, a symlink is written
//! through to its (contained) target and stays a symlink, and no temporary file is left behind.
#![cfg(unix)]

use cc_app_server::kernel::ToolExecutor;
use cc_app_server::protocol::{ToolCall, ToolResult};
use cc_app_server::workspace_tools::WorkspaceTools;
use serde_json::{json, Value};
use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

fn write(t: &WorkspaceTools, path: &str, content: &str) -> Value {
    match t.execute(
        "t1",
        &ToolCall {
            tool: "write_file".into(),
            arguments: json!({"path": path, "content": content}),
        },
    ) {
        ToolResult::Ok(o) => o.output,
        other => panic!("{path}: {other:?}"),
    }
}

fn names(dir: &std::path::Path) -> Vec<String> {
    let mut n: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    n.sort();
    n
}

#[test]
fn a_rewrite_keeps_mode_and_owner_and_leaves_no_temporary() {
    let dir = tempfile::tempdir().unwrap();
    let ws = fs::canonicalize(dir.path()).unwrap();
    fs::write(ws.join("run.sh"), "old").unwrap();
    fs::set_permissions(ws.join("run.sh"), fs::Permissions::from_mode(0o751)).unwrap();
    let t = WorkspaceTools::new(&ws).unwrap();
    let before = fs::metadata(ws.join("run.sh")).unwrap();
    let r = write(&t, "run.sh", "#!/bin/sh\necho new\n");
    assert_eq!(r["kind"], "update");
    let after = fs::metadata(ws.join("run.sh")).unwrap();
    assert_eq!(after.permissions().mode() & 0o7777, 0o751);
    assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
    // It is a new inode: the old one was replaced whole, never rewritten in place.
    assert_ne!(after.ino(), before.ino());
    assert_eq!(
        fs::read_to_string(ws.join("run.sh")).unwrap(),
        "#!/bin/sh\necho new\n"
    );
    assert_eq!(names(&ws), ["run.sh"]);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // Root writing someone else's file leaves it theirs.
        std::os::unix::fs::chown(ws.join("run.sh"), Some(4321), Some(4321)).unwrap();
        write(&t, "run.sh", "again");
        let m = fs::metadata(ws.join("run.sh")).unwrap();
        assert_eq!((m.uid(), m.gid()), (4321, 4321));
        assert_eq!(m.permissions().mode() & 0o7777, 0o751);
    }
}

#[test]
fn a_symlink_is_written_through_and_stays_a_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let ws = fs::canonicalize(dir.path()).unwrap();
    fs::create_dir(ws.join("real")).unwrap();
    fs::write(ws.join("real/a.txt"), "old").unwrap();
    symlink("real/a.txt", ws.join("link.txt")).unwrap();
    let t = WorkspaceTools::new(&ws).unwrap();
    let r = write(&t, "link.txt", "new");
    assert_eq!(r["kind"], "update");
    assert!(fs::symlink_metadata(ws.join("link.txt"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read_to_string(ws.join("real/a.txt")).unwrap(), "new");
    assert_eq!(names(&ws.join("real")), ["a.txt"]);
    assert_eq!(names(&ws), ["link.txt", "real"]);
}
