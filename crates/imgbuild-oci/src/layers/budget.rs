//! The byte budget of a build's layer blocks in flight, shared by every layer and every
//! compression thread: memory is bounded by bytes, not by `-j`, so a 64-core runner with a
//! memory limit builds in the same memory as a laptop. A writer acquires a block's bytes
//! before it reads the block and releases them once the compressed block is written.
//!
//! The budget never changes the bytes of a layer: blocks are cut the same way whatever is in
//! flight, only the order in which they are compressed changes.

use std::sync::{Arc, Condvar, Mutex};

/// The environment variable that sets the budget, in bytes.
pub const LAYER_MEMORY_ENV: &str = "IMGBUILD_LAYER_MEMORY";
/// The budget when [`LAYER_MEMORY_ENV`] is not set: room for 16 zstd blocks (input and
/// output), enough to keep 16 cores busy.
pub const DEFAULT_LAYER_MEMORY: u64 = 128 << 20;
/// The smallest budget accepted: below it, a few zstd:chunked jobs would not fit at once
/// and even 2 cores would wait for memory.
pub const MIN_LAYER_MEMORY: u64 = 32 << 20;
/// What one layer written at once costs outside the budget (its tar reader, its direct
/// write buffers, its hashes); the budget also caps the layers in flight by this.
const PER_LAYER: u64 = 16 << 20;

/// The budget of [`LAYER_MEMORY_ENV`], or [`DEFAULT_LAYER_MEMORY`] when it is unset; an
/// error naming the variable when it is not a number of bytes of at least
/// [`MIN_LAYER_MEMORY`].
pub fn layer_memory_from_env() -> Result<u64, String> {
    match std::env::var(LAYER_MEMORY_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(DEFAULT_LAYER_MEMORY),
        Err(err) => Err(format!("{LAYER_MEMORY_ENV}: {err}")),
        Ok(text) => parse_layer_memory(&text),
    }
}

/// A value of [`LAYER_MEMORY_ENV`]: a whole number of bytes, at least [`MIN_LAYER_MEMORY`].
pub fn parse_layer_memory(text: &str) -> Result<u64, String> {
    let bytes = text
        .trim()
        .parse::<u64>()
        .map_err(|err| format!("{LAYER_MEMORY_ENV}={text} is not a number of bytes: {err}"))?;
    if bytes < MIN_LAYER_MEMORY {
        return Err(format!(
            "{LAYER_MEMORY_ENV}={bytes} is below the minimum of {MIN_LAYER_MEMORY} bytes (32 MiB)"
        ));
    }
    Ok(bytes)
}

/// The shared budget. Clones share it.
#[derive(Clone)]
pub struct MemoryBudget(Arc<Shared>);

struct Shared {
    limit: u64,
    state: Mutex<Usage>,
    freed: Condvar,
}

#[derive(Default)]
struct Usage {
    used: u64,
    /// Writers blocked in [`MemoryBudget::acquire`]: while any waits, [`MemoryBudget::try_acquire`]
    /// refuses, so a large request is not starved by a stream of small ones.
    waiting: usize,
}

/// Bytes held from a budget; given back when dropped.
pub struct Reservation {
    budget: MemoryBudget,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

impl MemoryBudget {
    pub fn new(limit: u64) -> Self {
        Self(Arc::new(Shared {
            limit: limit.max(1),
            state: Mutex::new(Usage::default()),
            freed: Condvar::new(),
        }))
    }

    pub fn limit(&self) -> u64 {
        self.0.limit
    }

    /// How many layers may be written at once: their fixed costs must leave the budget's
    /// worth of blocks room.
    pub fn layers_at_once(&self) -> usize {
        (self.0.limit / PER_LAYER).max(1) as usize
    }

    /// A request as charged: one larger than the whole budget takes all of it, so it runs
    /// alone instead of never.
    fn charge(&self, bytes: u64) -> u64 {
        bytes.min(self.0.limit)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Usage> {
        // A panic while holding the lock leaves plain counters, still consistent.
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `bytes` now, if they are free and nobody is waiting.
    pub fn try_acquire(&self, bytes: u64) -> Option<Reservation> {
        let bytes = self.charge(bytes);
        let mut usage = self.lock();
        if usage.waiting > 0 || usage.used + bytes > self.0.limit {
            return None;
        }
        usage.used += bytes;
        Some(self.reservation(bytes))
    }

    /// `bytes`, waiting until they are free. Only a writer with no block of its own in
    /// flight may wait here, or the bytes it waits for could be its own.
    pub fn acquire(&self, bytes: u64) -> Reservation {
        let bytes = self.charge(bytes);
        let mut usage = self.lock();
        usage.waiting += 1;
        while usage.used + bytes > self.0.limit {
            usage = self.0.freed.wait(usage).unwrap_or_else(|e| e.into_inner());
        }
        usage.waiting -= 1;
        usage.used += bytes;
        self.reservation(bytes)
    }

    fn reservation(&self, bytes: u64) -> Reservation {
        Reservation {
            budget: self.clone(),
            bytes,
        }
    }

    fn release(&self, bytes: u64) {
        self.lock().used -= bytes;
        self.0.freed.notify_all();
    }

    #[cfg(test)]
    fn used(&self) -> u64 {
        self.lock().used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_is_a_number_of_bytes_of_at_least_32_mib() {
        assert_eq!(parse_layer_memory("33554432"), Ok(32 << 20));
        let low = parse_layer_memory("1000").unwrap_err();
        assert!(
            low.contains(LAYER_MEMORY_ENV) && low.contains("minimum"),
            "{low}"
        );
        let word = parse_layer_memory("lots").unwrap_err();
        assert!(word.contains(LAYER_MEMORY_ENV), "{word}");
    }

    #[test]
    fn a_request_larger_than_the_budget_runs_alone() {
        let budget = MemoryBudget::new(10);
        let held = budget.acquire(100);
        assert_eq!(budget.used(), 10);
        assert!(budget.try_acquire(1).is_none());
        drop(held);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_waiter_proceeds_once_bytes_are_released() {
        let budget = MemoryBudget::new(10);
        let held = budget.acquire(8);
        let other = budget.clone();
        let waiter = std::thread::spawn(move || other.acquire(5).bytes);
        // Until the waiter is counted, small requests may still pass; after, they wait too.
        while budget.lock().waiting == 0 {
            std::thread::yield_now();
        }
        assert!(budget.try_acquire(1).is_none());
        drop(held);
        assert_eq!(waiter.join().unwrap(), 5);
        assert_eq!(budget.used(), 0);
    }
}
