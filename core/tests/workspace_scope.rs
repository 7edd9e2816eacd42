//! A graph node's write scope, checked by the executor on the path write_file actually resolves
//! (symlinks followed, `..` applied), in the same descriptor-held walk that writes it: a link
//! inside the scope that leads out of it is refused, and nothing outside is created or changed.
#![cfg(unix)]

use cc_app_server::kernel::ToolExecutor;
use cc_app_server::protocol::{ToolCall, ToolResult};
use cc_app_server::workspace_tools::WorkspaceTools;
use serde_json::{json, Value};
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

fn write(t: &WorkspaceTools, scope: &[&str], path: &str) -> ToolResult {
    let scope: Vec<String> = scope.iter().map(|s| s.to_string()).collect();
    t.execute_scoped(
        "t1",
        &ToolCall {
            tool: "write_file".into(),
            arguments: json!({"path": path, "content": "written"}),
        },
        &scope,
    )
}

fn allowed(r: ToolResult, resolved: &str) -> Value {
    match r {
        ToolResult::Ok(o) => {
            assert_eq!(o.output["resolvedPath"], resolved, "{}", o.output);
            o.output
        }
        other => panic!("expected the write to {resolved} to be allowed, got {other:?}"),
    }
}

fn refused(r: ToolResult, what: &str) -> String {
    match r {
        ToolResult::Error(e) => {
            assert!(
                e.message.contains("outside the node's write scope"),
                "{what}: {}",
                e.message
            );
            e.message
        }
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

struct Ws {
    _dir: tempfile::TempDir,
    ws: PathBuf,
}

fn workspace() -> Ws {
    let dir = tempfile::tempdir().unwrap();
    let ws = fs::canonicalize(dir.path()).unwrap();
    fs::create_dir_all(ws.join("docs")).unwrap();
    fs::create_dir_all(ws.join("src")).unwrap();
    fs::write(ws.join("src/main.rs"), "fn main() {}\n").unwrap();
    fs::write(ws.join("docs/guide.md"), "guide").unwrap();
    symlink("../src", ws.join("docs/link")).unwrap();
    symlink(ws.join("src"), ws.join("docs/abs")).unwrap();
    symlink(".", ws.join("docs/here")).unwrap();
    symlink("docs", ws.join("d")).unwrap();
    symlink("docs/guide.md", ws.join("g")).unwrap();
    Ws { _dir: dir, ws }
}

fn src_untouched(ws: &Path) {
    assert_eq!(
        fs::read_to_string(ws.join("src/main.rs")).unwrap(),
        "fn main() {}\n"
    );
    let names: Vec<_> = fs::read_dir(ws.join("src"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["main.rs"]);
}

#[test]
fn a_link_inside_the_scope_that_leads_out_of_it_is_refused() {
    let s = workspace();
    let t = WorkspaceTools::new(&s.ws).unwrap();
    let m = refused(
        write(&t, &["docs"], "docs/link/main.rs"),
        "docs/link/main.rs",
    );
    assert!(
        m.contains("\"src/main.rs\""),
        "names the resolved path: {m}"
    );
    for p in [
        "docs/abs/main.rs",
        "docs/link/new.rs",
        "docs/link/deep/new.rs",
        "docs/../src/main.rs",
        "docs/here/../src/main.rs",
        "src/main.rs",
        "top.txt",
    ] {
        refused(write(&t, &["docs"], p), p);
    }
    src_untouched(&s.ws);
    assert!(!s.ws.join("top.txt").exists());
    // Inside, however reached.
    allowed(write(&t, &["docs"], "docs/guide.md"), "docs/guide.md");
    allowed(
        write(&t, &["docs/"], "docs/new/deep/x.md"),
        "docs/new/deep/x.md",
    );
    allowed(write(&t, &["./docs"], "docs/here/a.md"), "docs/a.md");
    allowed(write(&t, &["docs"], "d/b.md"), "docs/b.md");
    allowed(write(&t, &["docs"], "g"), "docs/guide.md");
    // Unscoped, the same link writes where it leads, and says so.
    let r = t.execute(
        "t1",
        &ToolCall {
            tool: "write_file".into(),
            arguments: json!({"path": "docs/link/main.rs", "content": "unscoped"}),
        },
    );
    allowed(r, "src/main.rs");
}

#[test]
fn file_entries_missing_entries_and_the_whole_workspace() {
    let s = workspace();
    let t = WorkspaceTools::new(&s.ws).unwrap();
    // A file entry allows exactly that file, by whatever name.
    allowed(write(&t, &["docs/guide.md"], "g"), "docs/guide.md");
    allowed(
        write(&t, &["docs/guide.md"], "docs/guide.md"),
        "docs/guide.md",
    );
    refused(write(&t, &["docs/guide.md"], "docs/other.md"), "a sibling");
    refused(
        write(&t, &["docs/guide.md"], "docs/guide.md.bak"),
        "a lookalike",
    );
    // An entry that does not exist yet allows what will be under it, created as needed.
    allowed(write(&t, &["out"], "out/a/b.txt"), "out/a/b.txt");
    refused(
        write(&t, &["build/gen"], "build/other.txt"),
        "beside a missing entry",
    );
    assert!(
        !s.ws.join("build").exists(),
        "nothing created outside the scope"
    );
    allowed(
        write(&t, &["build/gen"], "build/gen/x.rs"),
        "build/gen/x.rs",
    );
    refused(
        write(&t, &["out"], "out2/x"),
        "a name that only starts like the entry",
    );
    allowed(
        write(&t, &["src/new"], "docs/link/new/x.rs"),
        "src/new/x.rs",
    );
    // Several entries; `*` is everything; an empty scope is no scope (as the graph treats it).
    allowed(
        write(&t, &["nope", "src/main.rs"], "docs/link/main.rs"),
        "src/main.rs",
    );
    allowed(write(&t, &["*"], "anywhere/x"), "anywhere/x");
    allowed(write(&t, &[], "elsewhere/x"), "elsewhere/x");
    // An entry that leads outside the workspace or into a protected path covers nothing.
    refused(
        write(&t, &["../"], "top.txt"),
        "an entry outside the workspace",
    );
}

/// Only writing tools are scoped: reading and listing outside the scope work, and a refusal
/// is an error result (the turn goes on).
#[test]
fn reads_are_not_scoped() {
    let s = workspace();
    let t = WorkspaceTools::new(&s.ws).unwrap();
    let r = t.execute_scoped(
        "t1",
        &ToolCall {
            tool: "read_file".into(),
            arguments: json!({"path": "docs/link/main.rs"}),
        },
        &["docs".to_string()],
    );
    let ToolResult::Ok(o) = r else {
        panic!("{r:?}")
    };
    assert_eq!(o.output["content"], "fn main() {}\n");
    let r = t.execute_scoped(
        "t1",
        &ToolCall {
            tool: "list_directory".into(),
            arguments: json!({"path": "src"}),
        },
        &["docs".to_string()],
    );
    assert!(matches!(r, ToolResult::Ok(_)), "{r:?}");
}
