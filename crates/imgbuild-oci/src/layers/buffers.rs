//! Block buffers reused across blocks, layers and compression threads.
//!
//! A build allocates a few megabytes per block, thousands of times, on one thread and frees
//! it on another. glibc's malloc keeps such freed blocks in the arena of the thread that
//! freed them and raises its mmap threshold past them, so the process held far more than
//! the blocks in flight: on the 16-core host, 334 MB at `-j 64` for a 128 MiB budget, and
//! 171 MB with the threshold pinned (`docs/evidence/issue32/`). Taking buffers from a shelf
//! and putting them back instead means a build allocates only as many as it ever has in
//! flight, which the budget bounds, and no block pays for fresh pages.

use std::sync::Mutex;

/// The most bytes of free buffers kept between blocks. Buffers are only put back when a
/// block is done with them, so what the shelf and the blocks in flight hold together never
/// passes the most the blocks ever held at once; the cap only bounds what stays after a
/// build.
const SHELF_BYTES: usize = 256 << 20;

struct Shelf {
    buffers: Vec<Vec<u8>>,
    bytes: usize,
}

static SHELF: Mutex<Shelf> = Mutex::new(Shelf {
    buffers: Vec::new(),
    bytes: 0,
});

/// An empty buffer of at least `capacity` bytes, from the shelf when it has one.
pub(super) fn take(capacity: usize) -> Vec<u8> {
    let taken = {
        let mut shelf = SHELF.lock().unwrap_or_else(|e| e.into_inner());
        let taken = shelf.buffers.pop();
        if let Some(buffer) = &taken {
            shelf.bytes -= buffer.capacity();
        }
        taken
    };
    match taken {
        Some(mut buffer) => {
            buffer.reserve_exact(capacity);
            buffer
        }
        None => Vec::with_capacity(capacity),
    }
}

/// Puts `buffer` back for the next block, emptied; dropped when the shelf is full.
pub(super) fn give(mut buffer: Vec<u8>) {
    buffer.clear();
    let mut shelf = SHELF.lock().unwrap_or_else(|e| e.into_inner());
    if buffer.capacity() > 0 && shelf.bytes + buffer.capacity() <= SHELF_BYTES {
        shelf.bytes += buffer.capacity();
        shelf.buffers.push(buffer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_taken_again_empty() {
        let mut buffer = take(1 << 20);
        buffer.extend_from_slice(b"block");
        let address = buffer.as_ptr();
        give(buffer);
        // Other tests share the shelf, so look for ours among a few.
        let taken: Vec<Vec<u8>> = (0..64).map(|_| take(1 << 20)).collect();
        assert!(
            taken
                .iter()
                .all(|b| b.is_empty() && b.capacity() >= 1 << 20)
        );
        assert!(taken.iter().any(|b| b.as_ptr() == address));
        taken.into_iter().for_each(give);
    }
}
