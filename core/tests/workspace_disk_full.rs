//! write_file on a full disk, for real: the process's file-size limit (RLIMIT_FSIZE, SIGXFSZ
//! ignored) makes writes past it fail with EFBIG, as a full disk fails them with ENOSPC. The tool
//! reports the error and the original file is left byte for byte as it was, with no temporary
//! file behind (before the fix: truncated and half overwritten). One test in this binary: the
//! limit is process-wide.
#![cfg(unix)]

use cc_app_server::kernel::ToolExecutor;
use cc_app_server::protocol::{ToolCall, ToolResult};
use cc_app_server::workspace_tools::WorkspaceTools;
use serde_json::json;
use std::fs;
use std::os::unix::fs::PermissionsExt;

#[path = "fsize_support/mod.rs"]
mod fsize_support;
use fsize_support::FileSizeLimit;

fn write(t: &WorkspaceTools, path: &str, content: &str) -> ToolResult {
    t.execute(
        "t1",
        &ToolCall {
            tool: "write_file".into(),
            arguments: json!({"path": path, "content": content}),
        },
    )
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
fn a_write_that_fails_for_space_leaves_the_original_intact() {
    let dir = tempfile::tempdir().unwrap();
    let ws = fs::canonicalize(dir.path()).unwrap();
    let original: Vec<u8> = (0..700u32).map(|i| (i % 251) as u8).collect();
    fs::create_dir(ws.join("src")).unwrap();
    fs::write(ws.join("src/main.rs"), &original).unwrap();
    fs::set_permissions(ws.join("src/main.rs"), fs::Permissions::from_mode(0o640)).unwrap();
    let t = WorkspaceTools::new(&ws).unwrap();
    let big = "x".repeat(5000);
    {
        let _limit = FileSizeLimit::set(1000);
        let r = write(&t, "src/main.rs", &big);
        let ToolResult::Error(e) = r else {
            panic!("the write must fail: {r:?}")
        };
        assert!(e.message.contains("src/main.rs"), "{}", e.message);
        assert!(e.message.contains("too large"), "{}", e.message);
        let now = fs::read(ws.join("src/main.rs")).unwrap();
        assert!(
            now == original,
            "the original was changed: {} bytes, starting {:?}",
            now.len(),
            &now[..now.len().min(16)]
        );
        let mode = fs::metadata(ws.join("src/main.rs"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o640);
        // A new file that does not fit is not left half written either.
        assert!(matches!(
            write(&t, "src/new.rs", &big),
            ToolResult::Error(_)
        ));
        assert_eq!(names(&ws.join("src")), ["main.rs"]);
        // What fits is written whole.
        assert!(matches!(
            write(&t, "src/small.rs", "fits"),
            ToolResult::Ok(_)
        ));
        assert_eq!(fs::read_to_string(ws.join("src/small.rs")).unwrap(), "fits");
    }
    // With room again the same write succeeds, and keeps the file's permission bits.
    assert!(matches!(write(&t, "src/main.rs", &big), ToolResult::Ok(_)));
    assert_eq!(fs::read_to_string(ws.join("src/main.rs")).unwrap(), big);
    let mode = fs::metadata(ws.join("src/main.rs"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o640);
    assert_eq!(names(&ws.join("src")), ["main.rs", "small.rs"]);
}
