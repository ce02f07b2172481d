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
//! It owns nothing else: no tuning knobs, no statistics.

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
