//! Locking: one helper for every mutex in the shell.

use std::sync::{Mutex, MutexGuard};

/// Lock `m`, taking the data even if a thread panicked while holding it: every value kept
/// behind a shell mutex stays consistent at each step, and a node must go on serving.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
