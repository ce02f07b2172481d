//! The process's global allocator: jemalloc instead of glibc's malloc.
//!
//! Profiling the approve workload (benches/PROFILE.md) put a quarter of all
//! CPU in glibc's allocator (`_int_malloc`, `unlink_chunk`,
//! `malloc_consolidate`, arena growth through `mprotect`): every checkpoint
//! allocates its encoded rows, sled copies tree nodes on insert, tokio and
//! ractor allocate per message, and much of it is freed on another thread
//! (the store's writer frees what session tasks allocated), where glibc's
//! arenas do worst. Measured back to back on the same machine, jemalloc
//! cost the least CPU per session and the least RSS per live session of the
//! three tried (glibc, mimalloc, jemalloc; figures in PROFILE.md), and it is
//! what long-running Rust servers standardly use. Declared in the library so
//! that the binary, the benchmark harness and the tests all run on the
//! allocator production runs on.
//!
//! It also sets jemalloc's options (below) and offers
//! [`release_freed_memory`]; it owns no statistics.

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read once at its start (the prefixed build's name
/// for `malloc_conf`). `background_thread`: freed pages go back to the
/// system from jemalloc's own thread as they age (its default decay, 10 s),
/// rather than from whichever request thread happens to allocate next, so a
/// long-running server returns the memory of a burst (thousands of request
/// futures, a batch of sessions that finished) without stalling requests.
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: &[u8; 23] = b"background_thread:true\0";

/// Returns every freed page jemalloc still holds to the system now, instead
/// of as it ages. For measuring what live data costs (the benchmark reads
/// RSS after it); `false` if jemalloc refused.
pub fn release_freed_memory() -> bool {
    // MALLCTL_ARENAS_ALL: the `arena.<i>.purge` index that means every arena.
    const PURGE_ALL: &std::ffi::CStr = c"arena.4096.purge";
    // SAFETY: a NUL-terminated name of a control that takes no value, with
    // null old/new pointers and lengths, as jemalloc documents for it.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            PURGE_ALL.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    rc == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn jemalloc_takes_the_options_and_releases_freed_memory() {
        assert_eq!(super::MALLOC_CONF.last(), Some(&0), "NUL-terminated");
        let mut on = false;
        let mut len = std::mem::size_of::<bool>();
        // SAFETY: `opt.background_thread` is a bool read into a bool-sized
        // buffer whose length is passed along.
        let rc = unsafe {
            tikv_jemalloc_sys::mallctl(
                c"opt.background_thread".as_ptr(),
                (&mut on as *mut bool).cast(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        assert_eq!(rc, 0);
        assert!(on, "jemalloc did not read MALLOC_CONF");
        drop(vec![0u8; 1 << 20]);
        assert!(super::release_freed_memory());
    }
}
