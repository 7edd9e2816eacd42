//! The threads the graph runtime starts (schedulers, workers, large compiles), named and kept so
//! that shutdown joins every one of them.

use crate::rollout::sync::lock;
use std::sync::Mutex;
use std::thread::JoinHandle;

/// Threads the graph runtime started, joined at shutdown.
#[derive(Default)]
pub(crate) struct Threads {
    handles: Mutex<Vec<JoinHandle<()>>>,
}

impl Threads {
    /// Starts a named thread; false if the OS refused one.
    pub fn spawn(&self, name: &str, f: impl FnOnce() + Send + 'static) -> bool {
        match std::thread::Builder::new()
            .name(name.chars().take(15).collect())
            .spawn(f)
        {
            Ok(h) => {
                let mut hs = lock(&self.handles);
                hs.retain(|h| !h.is_finished());
                hs.push(h);
                true
            }
            Err(e) => {
                tracing::error!(target: "cc_app_server::graph", "could not start a graph thread: {e}");
                false
            }
        }
    }

    pub fn join_all(&self) {
        loop {
            let hs: Vec<JoinHandle<()>> = std::mem::take(&mut *lock(&self.handles));
            if hs.is_empty() {
                return;
            }
            for h in hs {
                if h.thread().id() != std::thread::current().id() {
                    let _ = h.join();
                }
            }
        }
    }
}
