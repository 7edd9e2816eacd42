//! The tamper matrix: every class of damage an accident or an attacker with write access can do
//! to a state directory, applied one mutation at a time to a copy of a real one, in unkeyed and
//! keyed mode, on both stores. Each mutation is judged by what a user of the store sees:
//! refused (a thread unreadable, verify failing), warned (verify's warnings or repairs), or
//! neither, and then whether what is served changed (undetected) or not (no effect).
//!
//! Requirements (issue 11): keyed mode detects 100% in every class; unkeyed mode leaves nothing
//! undetected outside the classes docs/rollout-format.md's threat model names (history forged
//! with every hash recomputed). The JSONL mutations are also run through the independent Python
//! verifier, which must agree and never crash.
//!
//! `TAMPER_MATRIX=full` runs every mutation (scripts/tamper_matrix.sh; the Python verifier sees
//! every fourth byte flip and every other mutation); the default is a spread-out sample that
//! takes seconds (scripts/test-tamper.sh, part of the test command), with every sixth mutation
//! also through the Python verifier.

mod rollout_util;

use cc_app_server::rollout::*;
use rollout_util::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

/// Classes the unkeyed chain cannot detect, by design: the threat model's "forged with every
/// hash recomputed" (docs/rollout-format.md).
const UNKEYED_BLIND: &[&str] = &[
    "forge:append",
    "forge:append+anchor",
    "forge:rewrite+anchor",
    "forge:truncate+anchor",
    "forge:delete+anchor",
    "transplant:recomputed",
];

#[derive(Default, Clone, Copy)]
struct Tally {
    n: usize,
    refused: usize,
    warned: usize,
    undetected: usize,
    no_effect: usize,
    py_n: usize,
    py_detected: usize,
}

/// What the store serves: each readable thread's events.
type Served = BTreeMap<String, Vec<String>>;

enum Seen {
    Refused,
    Warned,
    Quiet(Served),
}

fn observe(kind: StoreKind, dir: &Path, keyed: bool) -> Seen {
    let Ok(s) = open(kind, dir, keyed) else {
        return Seen::Refused;
    };
    let Ok((ok, bad)) = list_all(&*s) else {
        return Seen::Refused;
    };
    if !bad.is_empty() || !s.stray_entries().map(|v| v.is_empty()).unwrap_or(false) {
        return Seen::Refused;
    }
    let mut warned = false;
    let mut served = Served::new();
    for id in ok {
        match s.verify(&id) {
            Ok(r) if r.ok() => warned |= !r.warnings.is_empty() || !r.repairs.is_empty(),
            _ => return Seen::Refused,
        }
        match read_all(&*s, &id) {
            Ok(evs) => {
                served.insert(
                    id,
                    evs.iter()
                        .map(|e| format!("{} {}", e.seq, e.payload))
                        .collect(),
                );
            }
            Err(_) => return Seen::Refused,
        }
    }
    if warned {
        Seen::Warned
    } else {
        Seen::Quiet(served)
    }
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else if e.file_name() != layout::LOCK_FILE {
            fs::copy(e.path(), &target).unwrap();
        }
    }
}

fn python_detects(dir: &Path, keyed: bool, key_path: &Path) -> bool {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/verify_rollout.py");
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(script).arg("--state-dir").arg(dir);
    if keyed {
        cmd.arg("--key-file").arg(key_path);
    }
    let out = cmd.output().expect("python3 runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        !text.contains("Traceback") && matches!(out.status.code(), Some(0 | 1)),
        "the Python verifier crashed: {text}"
    );
    out.status.code() == Some(1) || text.contains("warning:")
}

type Mutation = Box<dyn Fn(&Path)>;

/// An event row's columns that a flip can hit: (name, value).
type Columns = Vec<(&'static str, Option<String>)>;

/// Samples `0..n` in full mode (all) or quick mode (about `quick` of them, spread out).
fn sample(n: usize, full: bool, quick: usize) -> Vec<usize> {
    if full || n <= quick {
        (0..n).collect()
    } else {
        let step = n.div_ceil(quick);
        (0..n).step_by(step).collect()
    }
}

fn lines(dir: &Path, id: &str) -> Vec<Vec<u8>> {
    fs::read(log(dir, id))
        .unwrap()
        .split_inclusive(|b| *b == b'\n')
        .map(<[u8]>::to_vec)
        .collect()
}

/// alpha's events with a declined approval turned into an approval, re-chained.
fn rewritten(kind: StoreKind, dir: &Path) -> Vec<StoredEvent> {
    let mut evs = events(kind, dir, "alpha");
    let i = evs
        .iter()
        .position(|e| e.kind() == "approvalResolved")
        .unwrap();
    evs[i].payload["outcome"] = json!("approved");
    evs[i].payload["decision"] = json!({"kind": "acceptOnce"});
    rechain(&mut evs);
    evs
}

fn forged_append(kind: StoreKind, dir: &Path) -> Vec<StoredEvent> {
    let mut evs = events(kind, dir, "alpha");
    let mut extra = evs
        .iter()
        .rev()
        .find(|e| e.kind() == "itemDelta")
        .unwrap()
        .clone();
    extra.payload["delta"]["text"] = json!("FORGED");
    evs.push(extra);
    rechain(&mut evs);
    evs
}

/// Every mutation class for `kind`, built against the base directory `base`.
fn mutations(
    kind: StoreKind,
    base: &Path,
    keyed: bool,
    full: bool,
) -> Vec<(&'static str, Mutation)> {
    let mut out: Vec<(&'static str, Mutation)> = Vec::new();
    let key_forgeries = |out: &mut Vec<(&'static str, Mutation)>| {
        out.push((
            "forge:append",
            Box::new(move |d: &Path| {
                let evs = forged_append(kind, d);
                write_events(kind, d, "alpha", &evs);
            }),
        ));
        for keep_mac in [false, true] {
            out.push((
                "forge:append+anchor",
                Box::new(move |d: &Path| {
                    let evs = forged_append(kind, d);
                    write_events(kind, d, "alpha", &evs);
                    if keep_mac {
                        forge_anchor_keep_mac(kind, d, "alpha", &evs)
                    } else {
                        forge_anchor(kind, d, "alpha", &evs)
                    }
                }),
            ));
            out.push((
                "forge:rewrite+anchor",
                Box::new(move |d: &Path| {
                    let evs = rewritten(kind, d);
                    write_events(kind, d, "alpha", &evs);
                    if keep_mac {
                        forge_anchor_keep_mac(kind, d, "alpha", &evs)
                    } else {
                        forge_anchor(kind, d, "alpha", &evs)
                    }
                }),
            ));
        }
        out.push((
            "forge:rewrite",
            Box::new(move |d: &Path| {
                let evs = rewritten(kind, d);
                write_events(kind, d, "alpha", &evs);
            }),
        ));
        out.push((
            "forge:truncate+anchor",
            Box::new(move |d: &Path| {
                let mut evs = events(kind, d, "alpha");
                evs.truncate(evs.len() - 3);
                write_events(kind, d, "alpha", &evs);
                forge_anchor(kind, d, "alpha", &evs);
            }),
        ));
        out.push((
            "forge:delete+anchor",
            Box::new(move |d: &Path| {
                let mut evs = events(kind, d, "alpha");
                evs.remove(evs.len() / 2);
                rechain(&mut evs);
                write_events(kind, d, "alpha", &evs);
                forge_anchor(kind, d, "alpha", &evs);
            }),
        ));
        out.push((
            "transplant:recomputed",
            Box::new(move |d: &Path| {
                let mut evs = events(kind, d, "bravo");
                evs[0].payload["threadId"] = json!("alpha");
                evs.retain(|e| e.kind() != "sealed");
                rechain(&mut evs);
                write_events(kind, d, "alpha", &evs);
                forge_anchor(kind, d, "alpha", &evs);
            }),
        ));
        out.push((
            "transplant:copy",
            Box::new(move |d: &Path| copy_thread(kind, d, "alpha", "delta")),
        ));
    };
    match kind {
        StoreKind::Jsonl => {
            for id in ["alpha", "bravo"] {
                let size = fs::read(log(base, id)).unwrap().len();
                for i in sample(size, full, 24) {
                    out.push((
                        "byte-flip",
                        Box::new(move |d: &Path| {
                            let mut b = fs::read(log(d, id)).unwrap();
                            b[i] ^= 0x01;
                            fs::write(log(d, id), b).unwrap();
                        }),
                    ));
                }
                let asize = fs::read(anchor(base, id)).unwrap().len();
                for i in sample(asize, full, 12) {
                    out.push((
                        "anchor-byte-flip",
                        Box::new(move |d: &Path| {
                            let mut b = fs::read(anchor(d, id)).unwrap();
                            b[i] ^= 0x01;
                            fs::write(anchor(d, id), b).unwrap();
                        }),
                    ));
                }
                let n = lines(base, id).len();
                for k in sample(n, full, 8) {
                    out.push((
                        "line-delete",
                        Box::new(move |d: &Path| {
                            let mut l = lines(d, id);
                            l.remove(k);
                            fs::write(log(d, id), l.concat()).unwrap();
                        }),
                    ));
                    if k + 1 < n {
                        out.push((
                            "adjacent-swap",
                            Box::new(move |d: &Path| {
                                let mut l = lines(d, id);
                                l.swap(k, k + 1);
                                fs::write(log(d, id), l.concat()).unwrap();
                            }),
                        ));
                    }
                    out.push((
                        "truncate-at-line",
                        Box::new(move |d: &Path| {
                            let l = lines(d, id);
                            fs::write(log(d, id), l[..k].concat()).unwrap();
                        }),
                    ));
                }
            }
            for (name, both) in [("transplant:log", false), ("transplant:log+anchor", true)] {
                out.push((
                    name,
                    Box::new(move |d: &Path| {
                        fs::copy(log(d, "bravo"), log(d, "alpha")).unwrap();
                        if both {
                            fs::copy(anchor(d, "bravo"), anchor(d, "alpha")).unwrap();
                        }
                    }),
                ));
            }
            out.push((
                "transplant:swap",
                Box::new(move |d: &Path| swap_threads(kind, d, "alpha", "bravo")),
            ));
        }
        StoreKind::Sqlite => {
            let rows = |d: &Path, id: &str| -> Vec<(i64, Columns)> {
                let c = db(d);
                let mut st = c
                    .prepare("SELECT seq, prev_hash, hash, time, payload, turn_completed FROM events WHERE thread_id = ?1 ORDER BY seq")
                    .unwrap();
                st.query_map([id], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        vec![
                            ("prev_hash", r.get(1)?),
                            ("hash", r.get(2)?),
                            ("time", r.get(3)?),
                            ("payload", r.get(4)?),
                            ("turn_completed", r.get(5)?),
                        ],
                    ))
                })
                .unwrap()
                .map(Result::unwrap)
                .collect()
            };
            for id in ["alpha", "bravo"] {
                let mut flips = Vec::new();
                for (seq, cols) in rows(base, id) {
                    for (col, v) in cols {
                        let Some(v) = v else { continue };
                        for i in 0..v.len() {
                            if v.as_bytes()[i].is_ascii_graphic() {
                                flips.push((seq, col, i));
                            }
                        }
                    }
                }
                for j in sample(flips.len(), full, 24) {
                    let (seq, col, i) = flips[j];
                    out.push((
                        "value-byte-flip",
                        Box::new(move |d: &Path| {
                            let c = db(d);
                            let v: String = c
                                .query_row(
                                    &format!("SELECT {col} FROM events WHERE thread_id = ?1 AND seq = ?2"),
                                    rusqlite::params![id, seq],
                                    |r| r.get(0),
                                )
                                .unwrap();
                            let mut b = v.into_bytes();
                            b[i] ^= 0x01;
                            c.execute(
                                &format!("UPDATE events SET {col} = ?3 WHERE thread_id = ?1 AND seq = ?2"),
                                rusqlite::params![id, seq, String::from_utf8(b).unwrap()],
                            )
                            .unwrap();
                        }),
                    ));
                }
                let n = rows(base, id).len() as i64;
                for k in sample(n as usize, full, 8)
                    .into_iter()
                    .map(|k| k as i64 + 1)
                {
                    out.push((
                        "row-delete",
                        Box::new(move |d: &Path| {
                            db(d)
                                .execute(
                                    "DELETE FROM events WHERE thread_id = ?1 AND seq = ?2",
                                    rusqlite::params![id, k],
                                )
                                .unwrap();
                        }),
                    ));
                    if k < n {
                        out.push((
                            "adjacent-swap",
                            Box::new(move |d: &Path| {
                                let c = db(d);
                                for (from, to) in [(k, -1), (k + 1, k), (-1, k + 1)] {
                                    c.execute(
                                        "UPDATE events SET seq = ?3 WHERE thread_id = ?1 AND seq = ?2",
                                        rusqlite::params![id, from, to],
                                    )
                                    .unwrap();
                                }
                            }),
                        ));
                    }
                    out.push((
                        "truncate-at-row",
                        Box::new(move |d: &Path| {
                            db(d)
                                .execute(
                                    "DELETE FROM events WHERE thread_id = ?1 AND seq >= ?2",
                                    rusqlite::params![id, k],
                                )
                                .unwrap();
                        }),
                    ));
                }
                for edit in [
                    "UPDATE threads SET archived = 1 - archived",
                    "UPDATE threads SET head_seq = head_seq - 1",
                    "UPDATE threads SET head_hash = replace(head_hash, substr(head_hash, 5, 1), 'x')",
                    "UPDATE threads SET format_version = format_version + 1",
                    "UPDATE threads SET compacted_through = compacted_through + 1",
                    "UPDATE threads SET mac = replace(mac, substr(mac, 7, 1), 'z')",
                    "UPDATE threads SET key_id = '0000000000000000'",
                    "DELETE FROM threads",
                ] {
                    // Without a key there is no MAC to damage.
                    if !keyed && (edit.contains("mac") || edit.contains("key_id")) {
                        continue;
                    }
                    out.push((
                        "anchor-row-edit",
                        Box::new(move |d: &Path| {
                            db(d)
                                .execute(&format!("{edit} WHERE thread_id = ?1"), [id])
                                .unwrap();
                        }),
                    ));
                }
            }
            out.push((
                "transplant:rows",
                Box::new(move |d: &Path| {
                    let c = db(d);
                    c.execute("DELETE FROM events WHERE thread_id = 'alpha'", [])
                        .unwrap();
                    c.execute("INSERT INTO events SELECT 'alpha', seq, prev_hash, hash, time, trace_id, parent_id, idempotency_key, payload, turn_completed FROM events WHERE thread_id = 'bravo'", []).unwrap();
                    c.execute("UPDATE threads SET head_seq = (SELECT head_seq FROM threads WHERE thread_id = 'bravo'), head_hash = (SELECT head_hash FROM threads WHERE thread_id = 'bravo') WHERE thread_id = 'alpha'", []).unwrap();
                }),
            ));
            out.push((
                "transplant:swap",
                Box::new(move |d: &Path| swap_threads(kind, d, "alpha", "bravo")),
            ));
        }
    }
    key_forgeries(&mut out);
    out
}

fn run_matrix(kind: StoreKind, full: bool) -> BTreeMap<(String, bool), Tally> {
    let mut table: BTreeMap<(String, bool), Tally> = BTreeMap::new();
    for keyed in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("base");
        {
            let s = open(kind, &base, keyed).unwrap();
            thread(&*s, "alpha", 20);
            thread(&*s, "bravo", 6);
            s.close().unwrap();
        }
        let key_path = tmp.path().join("key");
        fs::write(&key_path, KEY).unwrap();
        let Seen::Quiet(original) = observe(kind, &base, keyed) else {
            panic!("the untouched base must verify quietly");
        };
        let muts = mutations(kind, &base, keyed, full);
        for (i, (class, mutate)) in muts.iter().enumerate() {
            let work = tmp.path().join("work");
            let _ = fs::remove_dir_all(&work);
            copy_dir(&base, &work);
            mutate(&work);
            // Python starts in tens of milliseconds. Full: every mutation of the rarer classes,
            // every fourth byte flip. Sample: every sixth mutation.
            let python = kind == StoreKind::Jsonl
                && if full {
                    i % 4 == 0 || !class.ends_with("flip")
                } else {
                    i % 6 == 0
                };
            let py = python.then(|| python_detects(&work, keyed, &key_path));
            let t = table.entry((class.to_string(), keyed)).or_default();
            t.n += 1;
            match observe(kind, &work, keyed) {
                Seen::Refused => t.refused += 1,
                Seen::Warned => t.warned += 1,
                Seen::Quiet(served) if served == original => t.no_effect += 1,
                Seen::Quiet(_) => t.undetected += 1,
            }
            if let Some(detected) = py {
                t.py_n += 1;
                t.py_detected += detected as usize;
            }
        }
    }
    table
}

fn report(kind: StoreKind, full: bool) {
    let table = run_matrix(kind, full);
    println!(
        "\ntamper matrix, {} store ({}):",
        if kind == StoreKind::Jsonl {
            "JSONL"
        } else {
            "SQLite"
        },
        if full { "every mutation" } else { "sample" }
    );
    println!(
        "{:<24} {:<8} {:>9} {:>8} {:>7} {:>10} {:>9} {:>10}",
        "class", "mode", "mutations", "refused", "warned", "UNDETECTED", "no effect", "python"
    );
    let mut failures = Vec::new();
    for ((class, keyed), t) in &table {
        let mode = if *keyed { "keyed" } else { "unkeyed" };
        println!(
            "{:<24} {:<8} {:>9} {:>8} {:>7} {:>10} {:>9} {:>10}",
            class,
            mode,
            t.n,
            t.refused,
            t.warned,
            t.undetected,
            t.no_effect,
            if t.py_n > 0 {
                format!("{}/{}", t.py_detected, t.py_n)
            } else {
                "-".into()
            }
        );
        let blind_ok = !*keyed && UNKEYED_BLIND.contains(&class.as_str());
        if (t.undetected > 0 || t.no_effect > 0) && !blind_ok {
            failures.push(format!(
                "{class} ({mode}): {} undetected, {} without effect",
                t.undetected, t.no_effect
            ));
        }
        // The Python verifier sees what the store sees (it is blind where the chain is).
        if t.py_n > 0 && !blind_ok && t.py_detected < t.py_n {
            failures.push(format!(
                "{class} ({mode}): the Python verifier missed {} of {}",
                t.py_n - t.py_detected,
                t.py_n
            ));
        }
    }
    let keyed_total: usize = table
        .iter()
        .filter(|((_, k), _)| *k)
        .map(|(_, t)| t.n)
        .sum();
    let keyed_detected: usize = table
        .iter()
        .filter(|((_, k), _)| *k)
        .map(|(_, t)| t.refused + t.warned)
        .sum();
    println!("keyed: {keyed_detected} of {keyed_total} detected");
    assert!(failures.is_empty(), "{failures:#?}");
}

fn full() -> bool {
    std::env::var("TAMPER_MATRIX").as_deref() == Ok("full")
}

// Run by scripts/test-tamper.sh (sampled) and scripts/tamper_matrix.sh (full), which print the
// table; ignored by a plain `cargo test` so the test command runs it once.
#[test]
#[ignore = "run by scripts/test-tamper.sh and scripts/tamper_matrix.sh"]
fn tamper_matrix_jsonl() {
    report(StoreKind::Jsonl, full());
}

#[test]
#[ignore = "run by scripts/test-tamper.sh and scripts/tamper_matrix.sh"]
fn tamper_matrix_sqlite() {
    report(StoreKind::Sqlite, full());
}
