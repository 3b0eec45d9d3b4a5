//! The global allocator: Redis's own (`RedisModule_Alloc`) inside the server,
//! so limiter state shows in `used_memory`, `INFO memory` and `maxmemory`;
//! the system allocator where no server is around (unit tests, fuzzing).
//!
//! The choice is made per call on a pointer Redis sets before the module
//! allocates anything, and never unsets, so a block is always freed by the
//! allocator that made it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::alloc::RedisAlloc;
use redis_module::raw;

pub struct ModuleAlloc;

/// Blocks the module has allocated inside the server (`INFO ratelimit`'s
/// `module_allocations`): a test holds the hot paths to allocating nothing.
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// Blocks allocated so far inside the server.
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

fn in_server() -> bool {
    // SAFETY: a plain read of a function pointer set once at module load.
    let alloc = unsafe { raw::RedisModule_Alloc };
    alloc.is_some()
}

// SAFETY: every block comes from the allocator that frees it (see the
// module comment), and both honour `GlobalAlloc`'s contract: `RedisAlloc`
// rounds the size up to the alignment, as the server's allocator aligns on
// the size class.
unsafe impl GlobalAlloc for ModuleAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if in_server() {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
            // SAFETY: the caller's `layout` contract, passed on.
            unsafe { RedisAlloc.alloc(layout) }
        } else {
            // SAFETY: as above.
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if in_server() {
            // SAFETY: `ptr` was allocated in the server, by `RedisAlloc`
            // (the choice never changes once the server set its pointers).
            unsafe { RedisAlloc.dealloc(ptr, layout) }
        } else {
            // SAFETY: `ptr` was allocated by `System`, with `layout`.
            unsafe { System.dealloc(ptr, layout) }
        }
    }
}
