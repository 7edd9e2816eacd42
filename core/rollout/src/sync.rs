//! The one lock helper of every layer: a poisoned mutex is taken anyway. A panicking thread must
//! not take the server down with it; every state a mutex guards here is updated only after the
//! work it describes succeeded (the I/O, the append), so what a panic leaves behind is consistent.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking it even if a thread panicked while holding it.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_poisoned_mutex_is_taken_with_its_value() {
        let m = Arc::new(Mutex::new(7));
        let held = Arc::clone(&m);
        let _ = std::thread::spawn(move || {
            let mut g = held.lock().unwrap();
            *g = 8;
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), 8);
    }
}
