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

unsafe impl GlobalAlloc for ModuleAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if in_server() {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
            RedisAlloc.alloc(layout)
        } else {
            System.alloc(layout)
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if in_server() {
            RedisAlloc.dealloc(ptr, layout)
        } else {
            System.dealloc(ptr, layout)
        }
    }
}
