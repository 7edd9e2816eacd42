//! `TaskHandle`: uniffi has no stream type, so deliveries run on a background thread owned by a
//! handle; dropping (or cancelling) the handle stops them. After `cancel` returns no further
//! callback starts, unless `cancel` was called from inside a callback (then the current one
//! finishes and the thread exits right after). A delivery thread waits on its source with no
//! timeout (an idle listener costs no wake-up): `cancel` sets the flag and calls the task's
//! `wake`, which signals the source's waiters.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

type Wake = Box<dyn Fn() + Send + Sync>;

/// A running delivery (listener) task. Cancels on drop.
#[derive(uniffi::Object)]
pub struct TaskHandle {
    cancelled: Arc<AtomicBool>,
    /// Wakes the thread out of its untimed wait once `cancelled` is set.
    wake: Wake,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl TaskHandle {
    /// Runs `body(cancelled)` on a named thread; `body` must return soon after the flag is set
    /// and `wake` called (`wake` signals whatever `body` waits on).
    pub(crate) fn spawn(
        name: &str,
        wake: impl Fn() + Send + Sync + 'static,
        body: impl FnOnce(&AtomicBool) + Send + 'static,
    ) -> std::io::Result<Arc<TaskHandle>> {
        let cancelled = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&cancelled);
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || body(&flag))?;
        Ok(Arc::new(TaskHandle {
            cancelled,
            wake: Box::new(wake),
            thread: Mutex::new(Some(thread)),
        }))
    }
}

#[uniffi::export]
impl TaskHandle {
    /// Stops the deliveries and waits for the delivery thread to exit (at most one in-flight
    /// callback). Idempotent; safe to call from inside a callback.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        (self.wake)();
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(thread) = thread {
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }

    /// True once the delivery thread has exited (cancelled, or its source closed).
    pub fn is_finished(&self) -> bool {
        self.thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_none_or(|t| t.is_finished())
    }
}

impl Drop for TaskHandle {
    fn drop(&mut self) {
        self.cancel();
    }
}
