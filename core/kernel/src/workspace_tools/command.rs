//! Running one command: spawn (under the warden on Linux), read its output until it and
//! everything it started is gone or the deadline plus a grace has passed, and stop it on
//! interrupt. The output is read on the calling thread with `poll`, so a pipe some other process
//! still holds open never keeps the call waiting.

use std::io::Read;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long past the deadline (or an interrupt) the call waits for the tree to die and the pipes
/// to drain before it returns anyway (and kills the warden outright).
pub(super) const GRACE: Duration = Duration::from_secs(2);

/// What a command left: how it ended and what it wrote.
pub(super) struct Outcome {
    pub status: Option<ExitStatus>,
    pub timed_out: bool,
    pub interrupted: bool,
    pub process_limit: bool,
    pub stdout: Sink,
    pub stderr: Sink,
}

/// The first `cap` bytes of a stream and the count of all of it.
#[derive(Default)]
pub(super) struct Sink {
    pub kept: Vec<u8>,
    pub total: u64,
    cap: usize,
    open: bool,
}

impl Sink {
    fn new(cap: usize, open: bool) -> Sink {
        Sink {
            kept: Vec::new(),
            total: 0,
            cap,
            open,
        }
    }

    fn take(&mut self, bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let room = self.cap.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    /// Reads what is there without blocking (the pipe is non-blocking); marks the end.
    #[cfg(unix)]
    fn pull(&mut self, pipe: &mut impl Read) {
        let mut buf = [0u8; 16 * 1024];
        for _ in 0..64 {
            match pipe.read(&mut buf) {
                Ok(0) => {
                    self.open = false;
                    return;
                }
                Ok(n) => self.take(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.open = false;
                    return;
                }
            }
        }
    }
}

/// The commands running now, so `interrupt` can reach them.
#[derive(Debug, Default)]
pub(super) struct Registry {
    running: Mutex<Vec<Arc<Running>>>,
}

#[derive(Debug)]
struct Running {
    thread_id: String,
    interrupted: AtomicBool,
    #[cfg(target_os = "linux")]
    ctl: std::os::fd::OwnedFd,
    #[cfg(all(unix, not(target_os = "linux")))]
    pgid: libc::pid_t,
}

impl Running {
    /// Tells the warden to kill the tree (Linux) or kills the command's group (other unix).
    fn signal(&self) {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            // SAFETY: one byte from a live buffer to a socket we own; MSG_NOSIGNAL: no SIGPIPE
            // if the warden is already gone.
            unsafe {
                libc::send(
                    self.ctl.as_raw_fd(),
                    b"x".as_ptr().cast(),
                    1,
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                );
            }
        }
        // SAFETY: signals the command's process group; the entry leaves the registry (under its
        // lock) before the command is reaped, so the group is still the command's.
        #[cfg(all(unix, not(target_os = "linux")))]
        unsafe {
            libc::kill(-self.pgid, libc::SIGKILL);
        };
    }
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Running>>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self, r: &Arc<Running>) {
        self.lock().push(Arc::clone(r));
    }

    fn remove(&self, r: &Arc<Running>) {
        self.lock().retain(|x| !Arc::ptr_eq(x, r));
    }

    /// Stops the commands of `thread_id` (all when `None`); how many there were.
    pub(super) fn stop(&self, thread_id: Option<&str>) -> usize {
        let running = self.lock();
        let mut n = 0;
        for r in running.iter() {
            if thread_id.is_none_or(|t| t == r.thread_id) {
                r.interrupted.store(true, Ordering::SeqCst);
                r.signal();
                n += 1;
            }
        }
        n
    }
}

#[cfg(unix)]
fn set_nonblocking(fd: std::os::fd::RawFd) {
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
}

/// Spawns `cmd` (its stdio already set: null stdin, piped stdout/stderr) and runs it to the end,
/// the deadline or an interrupt.
#[cfg(unix)]
pub(super) fn run(
    mut cmd: Command,
    timeout: Duration,
    cap: usize,
    max_processes: usize,
    registry: &Registry,
    thread_id: &str,
) -> std::io::Result<Outcome> {
    use std::os::unix::process::CommandExt;
    let _ = max_processes;
    // The warden leads its own group, away from the server's (and the terminal's) signals.
    cmd.process_group(0);
    #[cfg(target_os = "linux")]
    let ctl = {
        use std::os::fd::AsRawFd;
        let (server_end, warden_end) = control_socket()?;
        let fd = warden_end.as_raw_fd();
        // SAFETY: the server's pid, read before the fork.
        let server = unsafe { libc::getpid() };
        // SAFETY: `warden::enter` makes only async-signal-safe system calls (see its docs).
        unsafe {
            cmd.pre_exec(move || super::warden::enter(fd, server, max_processes));
        }
        (server_end, warden_end)
    };
    let started = Instant::now();
    let mut child = cmd.spawn()?;
    #[cfg(target_os = "linux")]
    let ctl = {
        // The warden has its own copy; ours would keep its end from ever hanging up.
        drop(ctl.1);
        ctl.0
    };
    let running = Arc::new(Running {
        thread_id: thread_id.to_string(),
        interrupted: AtomicBool::new(false),
        #[cfg(target_os = "linux")]
        ctl,
        #[cfg(all(unix, not(target_os = "linux")))]
        pgid: child.id() as libc::pid_t,
    });
    registry.add(&running);
    let outcome = supervise(&mut child, &running, started + timeout, cap);
    registry.remove(&running);
    Ok(outcome)
}

/// A connected pair of close-on-exec stream sockets, the warden's end numbered 3 or above (std
/// sets up 0-2 in the child before the warden runs).
#[cfg(target_os = "linux")]
fn control_socket() -> std::io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two descriptors into `fds` on success; each is owned once.
    let (a, b) = unsafe {
        if libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        ) < 0
        {
            return Err(std::io::Error::last_os_error());
        }
        (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
    };
    let b = if b.as_raw_fd() < 3 {
        // SAFETY: duplicates a descriptor we own to a number >= 3; the result is owned here.
        let d = unsafe { libc::fcntl(b.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
        if d < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `d` was just returned by fcntl.
        unsafe { OwnedFd::from_raw_fd(d) }
    } else {
        b
    };
    Ok((a, b))
}

/// The loop: read both pipes as data comes, until the warden reports (Linux) or the command
/// exits (other unix); at the deadline or on interrupt, stop it and wait at most `GRACE` more.
#[cfg(unix)]
fn supervise(child: &mut Child, running: &Running, deadline: Instant, cap: usize) -> Outcome {
    use std::os::fd::AsRawFd;
    let mut out_pipe = child.stdout.take();
    let mut err_pipe = child.stderr.take();
    let mut stdout = Sink::new(cap, out_pipe.is_some());
    let mut stderr = Sink::new(cap, err_pipe.is_some());
    for fd in [
        out_pipe.as_ref().map(|p| p.as_raw_fd()),
        err_pipe.as_ref().map(|p| p.as_raw_fd()),
    ]
    .into_iter()
    .flatten()
    {
        set_nonblocking(fd);
    }
    #[cfg(target_os = "linux")]
    set_nonblocking(running.ctl.as_raw_fd());
    #[cfg(target_os = "linux")]
    let mut report = Vec::new();
    let mut timed_out = false;
    let mut stop_at: Option<Instant> = None;
    let mut done = false;
    #[cfg(not(target_os = "linux"))]
    let mut status = None;
    loop {
        let now = Instant::now();
        if stop_at.is_none() {
            if now >= deadline {
                timed_out = true;
                running.signal();
                stop_at = Some(now);
            } else if running.interrupted.load(Ordering::SeqCst) {
                stop_at = Some(now);
            }
        }
        if stop_at.is_some_and(|s| now >= s + GRACE) {
            break;
        }
        if done {
            // Everything the command started is dead: what is in the pipes is all there is,
            // unless a process outside the tree holds them; read what is there and stop.
            let until = now + Duration::from_millis(100);
            while (stdout.open || stderr.open) && Instant::now() < until {
                let before = stdout.total + stderr.total;
                if let Some(p) = out_pipe.as_mut().filter(|_| stdout.open) {
                    stdout.pull(p);
                }
                if let Some(p) = err_pipe.as_mut().filter(|_| stderr.open) {
                    stderr.pull(p);
                }
                if stdout.total + stderr.total == before {
                    break;
                }
            }
            break;
        }
        let mut fds = Vec::with_capacity(3);
        let watch = |fd: Option<i32>, fds: &mut Vec<libc::pollfd>| {
            if let Some(fd) = fd {
                fds.push(libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
        };
        watch(
            out_pipe
                .as_ref()
                .filter(|_| stdout.open)
                .map(|p| p.as_raw_fd()),
            &mut fds,
        );
        watch(
            err_pipe
                .as_ref()
                .filter(|_| stderr.open)
                .map(|p| p.as_raw_fd()),
            &mut fds,
        );
        #[cfg(target_os = "linux")]
        watch(Some(running.ctl.as_raw_fd()), &mut fds);
        let until = stop_at.map_or(deadline, |s| s + GRACE);
        // Linux wakes on the warden's report; elsewhere the exit is polled for.
        let tick = if cfg!(target_os = "linux") { 100 } else { 10 };
        let wait = until
            .saturating_duration_since(now)
            .as_millis()
            .clamp(1, tick) as libc::c_int;
        // SAFETY: `fds` is a live array of `fds.len()` pollfd structs.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait) };
        if let Some(p) = out_pipe.as_mut().filter(|_| stdout.open) {
            stdout.pull(p);
        }
        if let Some(p) = err_pipe.as_mut().filter(|_| stderr.open) {
            stderr.pull(p);
        }
        #[cfg(target_os = "linux")]
        {
            let mut buf = [0u8; 64];
            loop {
                match read_fd(running.ctl.as_raw_fd(), &mut buf) {
                    Ok(0) => {
                        done = true;
                        break;
                    }
                    Ok(n) => report.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        done = true;
                        break;
                    }
                }
            }
        }
        #[cfg(not(target_os = "linux"))]
        if let Ok(Some(s)) = child.try_wait() {
            // Whatever the command left in its group goes too.
            running.signal();
            status = Some(s);
            done = true;
        }
    }
    // Past the grace the warden (or the command's group) is killed outright. The child is not
    // reaped yet, so its pid and group id are still its own.
    let _ = child.kill();
    // SAFETY: kill(2) on the child's own process group (process_group(0) made it the leader).
    unsafe {
        libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
    }
    let waited = child.wait().ok();
    #[cfg(target_os = "linux")]
    let (status, process_limit) = {
        use std::os::unix::process::ExitStatusExt;
        let _ = waited;
        match super::warden::decode(&report) {
            Some(r) => (
                r.status.map(ExitStatus::from_raw),
                r.reason == super::warden::LIMIT,
            ),
            // No report: the warden was killed; so was the command with it.
            None => (Some(ExitStatus::from_raw(libc::SIGKILL)), false),
        }
    };
    #[cfg(not(target_os = "linux"))]
    let (status, process_limit) = (status.or(waited), false);
    Outcome {
        status,
        timed_out,
        interrupted: running.interrupted.load(Ordering::SeqCst),
        process_limit,
        stdout,
        stderr,
    }
}

#[cfg(target_os = "linux")]
fn read_fd(fd: std::os::fd::RawFd, buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: reads into a live buffer of its length from a descriptor we own.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Non-unix: the command itself is killed at the deadline (no process tree control); its pipes
/// are read on threads, and are no longer waited for once the grace has passed.
#[cfg(not(unix))]
pub(super) fn run(
    mut cmd: Command,
    timeout: Duration,
    cap: usize,
    _max_processes: usize,
    registry: &Registry,
    thread_id: &str,
) -> std::io::Result<Outcome> {
    let started = Instant::now();
    let mut child = cmd.spawn()?;
    let running = Arc::new(Running {
        thread_id: thread_id.to_string(),
        interrupted: AtomicBool::new(false),
    });
    registry.add(&running);
    let out = capture(child.stdout.take(), cap);
    let err = capture(child.stderr.take(), cap);
    let deadline = started + timeout;
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() >= deadline => {
                timed_out = true;
                let _ = child.kill();
                break child.wait().ok();
            }
            Ok(None) if running.interrupted.load(Ordering::SeqCst) => {
                let _ = child.kill();
                break child.wait().ok();
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => {
                let _ = child.kill();
                break child.wait().ok();
            }
        }
    };
    registry.remove(&running);
    let until = Instant::now() + GRACE;
    let join = |rx: std::sync::mpsc::Receiver<Sink>| {
        rx.recv_timeout(until.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| Sink::new(cap, false))
    };
    Ok(Outcome {
        status,
        timed_out,
        interrupted: running.interrupted.load(Ordering::SeqCst),
        process_limit: false,
        stdout: join(out),
        stderr: join(err),
    })
}

#[cfg(not(unix))]
fn capture<R: Read + Send + 'static>(
    pipe: Option<R>,
    cap: usize,
) -> std::sync::mpsc::Receiver<Sink> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sink = Sink::new(cap, false);
        if let Some(mut pipe) = pipe {
            let mut buf = [0u8; 8192];
            loop {
                match pipe.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => sink.take(&buf[..n]),
                }
            }
        }
        let _ = tx.send(sink);
    });
    rx
}
