//! The warden (Linux): a process between the server and each command that contains everything
//! the command starts.
//!
//! `Command::pre_exec` (run in std's forked child) makes that child a *child subreaper*
//! (`PR_SET_CHILD_SUBREAPER`) and forks again: the new child puts itself in its own process group
//! and returns, and std execs the command in it; the parent — the warden, the pid std's `Child`
//! holds — never returns. It closes every descriptor but its end of a control socket (so neither
//! std's exec-error pipe nor the output pipes are held by it) and loops: reap what exited, note
//! the command's status, count the command's processes, and poll the control socket (every 20 ms;
//! every 2 ms once the tree holds more than half the bound).
//! Every orphan of the tree (a `setsid` grandchild whose parent exited, a double-forked daemon)
//! is reparented to the warden, because it is the nearest subreaper: nothing the command starts
//! can leave its subtree. When the command exits, the server asks (a byte on the socket), the
//! server dies (the socket hangs up; `PR_SET_PDEATHSIG` and SIGTERM/SIGHUP/SIGINT end the same
//! way), or the tree holds more than the process bound, the warden kills the whole tree: SIGKILL
//! to the command's process group, to every child listed in `/proc/thread-self/children` and to
//! each child's process group, reap, repeat until `waitpid` says ECHILD. It then writes an
//! 8-byte report (why it stopped, the command's wait status) and exits.
//!
//! Everything here runs in a child forked from a multithreaded process, so it uses only raw
//! system calls: no allocation, no locks, no Rust std I/O, no panics.
//!
//! Pids are only ever signalled when they are the warden's own children (their pid cannot be
//! reused before the warden reaps them) or process groups led by them, so a recycled pid is never
//! hit. The process count walks `/proc/<pid>/task/<tid>/children` from the warden down; it is a
//! sample (every 20 ms, 2 ms near the bound), not a fork-time check (see `WorkspaceLimits::max_processes`).

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};

/// The most `max_processes` may be: the count walk keeps that many pids on the stack.
pub(crate) const MAX_PROCESSES_CAP: usize = 4096;

pub(super) const REPORT_LEN: usize = 8;
/// The command exited; the rest of its tree was killed.
pub(super) const EXITED: u8 = 1;
/// The server asked the warden to stop (deadline, interrupt), or went away.
pub(super) const STOPPED: u8 = 2;
/// The tree held more processes than the bound.
pub(super) const LIMIT: u8 = 3;

/// How often the warden looks at the tree (and at a signal that arrived between checks); more
/// often once the tree holds more than half the bound, so a fork loop overshoots it less.
const POLL_MS: libc::c_int = 20;
const POLL_NEAR_MS: libc::c_int = 2;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// What the warden said before it exited.
pub(super) struct Report {
    pub reason: u8,
    /// The command's raw wait status, when the warden reaped it.
    pub status: Option<i32>,
}

pub(super) fn decode(b: &[u8]) -> Option<Report> {
    if b.len() < REPORT_LEN || b[0] != b'W' {
        return None;
    }
    let status = i32::from_ne_bytes([b[4], b[5], b[6], b[7]]);
    Some(Report {
        reason: b[1],
        status: (b[2] == 1).then_some(status),
    })
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Becomes the warden of the command std is about to exec: returns `Ok` in the process that
/// goes on to exec the command, and never returns in the warden.
///
/// # Safety
/// Only in `Command::pre_exec`, i.e. in a freshly forked child, before exec. `ctl` is the
/// warden's end of the control socket (at least 3, so std's stdio setup left it alone).
pub(super) unsafe fn enter(ctl: RawFd, server: libc::pid_t, max: usize) -> io::Result<()> {
    if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) < 0 {
        return Err(io::Error::last_os_error());
    }
    let warden = libc::getpid();
    let pid = libc::fork();
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // The command: its own process group (so the warden can kill it and everything that
        // stays in it in one call, without killing itself), and dead if the warden dies.
        libc::setpgid(0, 0);
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        );
        if libc::getppid() != warden {
            libc::_exit(127);
        }
        return Ok(());
    }
    run(ctl, server, pid, max.min(MAX_PROCESSES_CAP))
}

unsafe fn run(ctl: RawFd, server: libc::pid_t, main: libc::pid_t, max: usize) -> ! {
    close_all_but(ctl);
    let mut unblock: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut unblock);
    for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT] {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, std::ptr::null_mut());
        libc::sigaddset(&mut unblock, sig);
    }
    libc::sigprocmask(libc::SIG_UNBLOCK, &unblock, std::ptr::null_mut());
    libc::prctl(
        libc::PR_SET_PDEATHSIG,
        libc::SIGTERM as libc::c_ulong,
        0,
        0,
        0,
    );
    if libc::getppid() != server {
        // The server died before the death signal was armed.
        STOP.store(true, Ordering::SeqCst);
    }
    // Wakes the poll the moment the command exits (Linux 5.3+; else the 20 ms tick sees it).
    let pidfd = libc::syscall(libc::SYS_pidfd_open, main, 0) as libc::c_int;
    let mut status: Option<libc::c_int> = None;
    let reason = loop {
        reap_exited(main, &mut status);
        if status.is_some() {
            break EXITED;
        }
        if STOP.load(Ordering::SeqCst) {
            break STOPPED;
        }
        let count = count_tree(max);
        if count > max {
            break LIMIT;
        }
        let mut fds = [
            libc::pollfd {
                fd: ctl,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: pidfd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let n = if pidfd >= 0 { 2 } else { 1 };
        let tick = if count * 2 > max {
            POLL_NEAR_MS
        } else {
            POLL_MS
        };
        if libc::poll(fds.as_mut_ptr(), n, tick) > 0 && fds[0].revents != 0 {
            break STOPPED;
        }
    };
    kill_all(main, &mut status);
    let mut report = [0u8; REPORT_LEN];
    report[0] = b'W';
    report[1] = reason;
    report[2] = u8::from(status.is_some());
    report[4..8].copy_from_slice(&status.unwrap_or(0).to_ne_bytes());
    libc::send(
        ctl,
        report.as_ptr().cast(),
        REPORT_LEN,
        libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
    );
    libc::_exit(0)
}

unsafe fn close_range(first: libc::c_uint, last: libc::c_uint) {
    if first > last || libc::syscall(libc::SYS_close_range, first, last, 0) == 0 {
        return;
    }
    // Linux before 5.9: one by one, up to the descriptor limit.
    let mut rl: libc::rlimit = std::mem::zeroed();
    let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) == 0 {
        rl.rlim_cur.min(1 << 20) as libc::c_uint
    } else {
        1 << 16
    };
    let mut fd = first;
    while fd <= last && fd < max {
        libc::close(fd as libc::c_int);
        fd += 1;
    }
}

unsafe fn close_all_but(keep: RawFd) {
    let keep = keep as libc::c_uint;
    if keep > 0 {
        close_range(0, keep - 1);
    }
    close_range(keep + 1, libc::c_uint::MAX);
}

/// Reaps every child that has exited, noting the command's status. False once no child is left.
unsafe fn reap_exited(main: libc::pid_t, status: &mut Option<libc::c_int>) -> bool {
    loop {
        let mut st = 0;
        let r = libc::waitpid(-1, &mut st, libc::WNOHANG | libc::__WALL);
        if r > 0 {
            if r == main && status.is_none() {
                *status = Some(st);
            }
            continue;
        }
        return r == 0 || errno() != libc::ECHILD;
    }
}

/// Kills the whole tree: its process groups and every child, over and over (orphans of what was
/// killed are reparented to the warden and met in the next round) until no child is left.
unsafe fn kill_all(main: libc::pid_t, status: &mut Option<libc::c_int>) {
    loop {
        libc::kill(-main, libc::SIGKILL);
        let listed = each_number(b"/proc/thread-self/children\0", |child| {
            libc::kill(child, libc::SIGKILL);
            libc::kill(-child, libc::SIGKILL);
            true
        });
        if !reap_exited(main, status) {
            return;
        }
        if !listed {
            // No /proc: the command's group is all the warden can reach. Wait for what it
            // killed (the command at least), then give up rather than wait for the unreachable.
            let mut st = 0;
            for _ in 0..50 {
                let r = libc::waitpid(main, &mut st, libc::WNOHANG | libc::__WALL);
                if r == main {
                    *status = Some(st);
                }
                if r != 0 {
                    break;
                }
                libc::poll(std::ptr::null_mut(), 0, 2);
            }
            return;
        }
        // Give the signals a moment to land before looking again.
        libc::poll(std::ptr::null_mut(), 0, 1);
    }
}

/// A NUL-terminated path built on the stack.
struct ProcPath {
    b: [u8; 64],
    len: usize,
}

impl ProcPath {
    fn new() -> ProcPath {
        ProcPath { b: [0; 64], len: 0 }
    }

    fn push(&mut self, s: &[u8]) -> &mut Self {
        for &c in s {
            if self.len < self.b.len() - 1 {
                self.b[self.len] = c;
                self.len += 1;
            }
        }
        self
    }

    fn num(&mut self, n: i32) -> &mut Self {
        let mut digits = [0u8; 12];
        let (mut i, mut n) = (digits.len(), n.max(0) as u32);
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(&digits[i..])
    }

    /// The path with its terminating NUL.
    fn c(&mut self) -> &[u8] {
        self.b[self.len] = 0;
        &self.b[..=self.len]
    }
}

/// Calls `f` with every number in the file at `path` (NUL-terminated) until it returns false.
/// False when the file cannot be opened.
unsafe fn each_number(path: &[u8], mut f: impl FnMut(i32) -> bool) -> bool {
    let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return false;
    }
    let mut buf = [0u8; 1024];
    let (mut acc, mut digits) = (0i64, false);
    'read: loop {
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        if n < 0 && errno() == libc::EINTR {
            continue;
        }
        if n <= 0 {
            break;
        }
        for &c in &buf[..n as usize] {
            if c.is_ascii_digit() {
                acc = (acc * 10 + i64::from(c - b'0')).min(i64::from(i32::MAX));
                digits = true;
            } else if digits {
                if !f(acc as i32) {
                    digits = false;
                    break 'read;
                }
                (acc, digits) = (0, false);
            }
        }
    }
    if digits {
        f(acc as i32);
    }
    libc::close(fd);
    true
}

/// Calls `f` with every thread id of `pid` until it returns false.
unsafe fn each_task(pid: i32, mut f: impl FnMut(i32) -> bool) {
    let mut p = ProcPath::new();
    p.push(b"/proc/").num(pid).push(b"/task");
    let fd = libc::open(
        p.c().as_ptr().cast(),
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
    );
    if fd < 0 {
        return;
    }
    let mut buf = [0u8; 2048];
    'read: loop {
        let n = libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len());
        if n <= 0 {
            break;
        }
        let mut off = 0usize;
        // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
        while off + 19 < n as usize {
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            if reclen < 20 {
                break 'read;
            }
            let mut tid = 0i32;
            let mut ok = false;
            for &c in &buf[off + 19..(off + reclen).min(n as usize)] {
                if !c.is_ascii_digit() {
                    break;
                }
                tid = tid.saturating_mul(10).saturating_add(i32::from(c - b'0'));
                ok = true;
            }
            if ok && !f(tid) {
                break 'read;
            }
            off += reclen;
        }
    }
    libc::close(fd);
}

/// How many processes the warden's subtree holds (not counting the warden), counted up to
/// `max + 1`.
unsafe fn count_tree(max: usize) -> usize {
    let mut pids = [0i32; MAX_PROCESSES_CAP + 1];
    let mut n = 0usize;
    let add = |pids: &mut [i32; MAX_PROCESSES_CAP + 1], n: &mut usize, pid: i32| {
        if *n <= max {
            pids[*n] = pid;
            *n += 1;
        }
        *n <= max
    };
    each_number(b"/proc/thread-self/children\0", |c| {
        add(&mut pids, &mut n, c)
    });
    let mut i = 0;
    while i < n && n <= max {
        let pid = pids[i];
        each_task(pid, |tid| {
            let mut p = ProcPath::new();
            p.push(b"/proc/")
                .num(pid)
                .push(b"/task/")
                .num(tid)
                .push(b"/children");
            each_number(p.c(), |c| add(&mut pids, &mut n, c));
            n <= max
        });
        i += 1;
    }
    n
}
