//! Real crashes: a child process appends under load and prints every acknowledged seq; we
//! SIGKILL it at random moments, reopen, and require every acknowledged event to be there with
//! the same hash, the chain intact, and any torn tail cut and recorded.
//!
//! `ROLLOUT_CRASH_CUTS` sets the cut points per store (default 200; the soak script uses 1000).

use cc_app_server::rollout::*;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn crash_loop(kind: StoreKind, keyed: bool) {
    let cuts: usize = std::env::var("ROLLOUT_CRASH_CUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
        / if keyed { 2 } else { 1 };
    let options = || StoreOptions {
        key: keyed.then(|| RolloutKey::from_bytes([0x42; 32])),
        ..StoreOptions::default()
    };
    let seed = std::env::var("ROLLOUT_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| cc_app_server::time::now_unix_millis() as u64 | 1);
    eprintln!("crash test {kind:?} keyed={keyed}: {cuts} cuts, seed {seed} (ROLLOUT_CRASH_SEED to replay)");
    let mut rng = Rng(seed);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let kind_arg = if kind == StoreKind::Sqlite {
        "sqlite"
    } else {
        "jsonl"
    };
    let (mut acked_total, mut torn, mut repaired, mut unacked_kept) =
        (0usize, 0usize, 0usize, 0u64);
    for cut in 0..cuts {
        // Threads are reused so later cuts land on logs with history and earlier repairs.
        let id = format!("crash{}", cut % 16);
        let mut child = Command::new(env!("CARGO_BIN_EXE_rollout-crash-child"))
            .args([
                kind_arg,
                dir.to_str().unwrap(),
                &id,
                &rng.next().to_string(),
                &(1 + rng.next() % 4).to_string(),
                if keyed { "keyed" } else { "unkeyed" },
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut out = child.stdout.take().unwrap();
        // Wait for "ready" so the kill lands while appends are in flight, not during start-up.
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"ready\n") {
            if out.read(&mut byte).unwrap() == 0 {
                panic!("cut {cut}: child exited before ready: {:?}", child.wait());
            }
            buf.push(byte[0]);
        }
        std::thread::sleep(Duration::from_micros(rng.next() % 25_000));
        child.kill().unwrap(); // SIGKILL
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        child.wait().unwrap();
        // A line cut mid-print was never fully reported; only whole lines count as acknowledged.
        let complete = &rest[..rest.rfind('\n').map_or(0, |i| i + 1)];
        let acked: Vec<(u64, String)> = complete
            .lines()
            .map(|l| {
                let (s, h) = l.split_once(' ').unwrap();
                (s.parse().unwrap(), h.to_string())
            })
            .collect();
        acked_total += acked.len();
        let torn_now = kind == StoreKind::Jsonl && {
            let bytes = std::fs::read(dir.join(format!("threads/{id}.jsonl"))).unwrap_or_default();
            !bytes.is_empty() && !bytes.ends_with(b"\n")
        };
        torn += torn_now as usize;

        let store = open_store(kind, &dir, options()).unwrap();
        let sum = store
            .summary(&id)
            .unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        let report = store.verify(&id).unwrap();
        assert!(report.ok(), "cut {cut}: {report:?}");
        if keyed {
            // After a crash the key vouches for everything that is served.
            assert_eq!(
                report.authenticated_through,
                Some(sum.last_seq),
                "cut {cut}: {report:?}"
            );
        }
        let max_acked = acked.iter().map(|a| a.0).max().unwrap_or(0);
        assert!(
            sum.last_seq >= max_acked,
            "cut {cut}: head {} < acknowledged {max_acked}",
            sum.last_seq
        );
        if let (Some(lo), true) = (acked.iter().map(|a| a.0).min(), max_acked > 0) {
            let mut have = Vec::new();
            let mut after = lo - 1;
            while after < max_acked {
                let page = store.read(&id, after, MAX_READ_LIMIT).unwrap();
                after = page.events.last().unwrap().seq;
                have.extend(page.events);
            }
            for (seq, hash) in &acked {
                let ev = &have[(seq - lo) as usize];
                assert_eq!(
                    (&ev.seq, &ev.hash),
                    (seq, hash),
                    "cut {cut}: acknowledged event lost or changed"
                );
            }
        }
        let last = store
            .read(&id, sum.last_seq - 1, 1)
            .unwrap()
            .events
            .pop()
            .unwrap();
        if torn_now {
            assert_eq!(last.kind(), "repaired", "cut {cut}: torn tail not recorded");
        }
        if last.kind() == "repaired" {
            repaired += 1;
            assert!(torn_now || last.payload["truncatedBytes"].as_u64().unwrap() > 0);
        }
        unacked_kept += sum.last_seq.saturating_sub(max_acked);
        drop(store);
    }
    eprintln!(
        "crash test {kind:?} keyed={keyed}: {cuts} cuts, {acked_total} acknowledged events all present, {torn} torn tails seen, {repaired} repairs recorded, {unacked_kept} written-but-unacknowledged events kept"
    );
    assert!(
        acked_total > cuts,
        "the children barely appended; the test proves nothing"
    );
}

#[test]
fn sigkill_at_random_points_jsonl() {
    crash_loop(StoreKind::Jsonl, false);
}

#[test]
fn sigkill_at_random_points_sqlite() {
    crash_loop(StoreKind::Sqlite, false);
}

/// Keyed: events after the keyed anchor are quarantined on open, and that must never include an
/// acknowledged one (the anchor is durable before the acknowledgement).
#[test]
fn sigkill_at_random_points_keyed_jsonl() {
    crash_loop(StoreKind::Jsonl, true);
}

#[test]
fn sigkill_at_random_points_keyed_sqlite() {
    crash_loop(StoreKind::Sqlite, true);
}
