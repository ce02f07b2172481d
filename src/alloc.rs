//! The process's global allocator: mimalloc instead of glibc's malloc.
//!
//! Profiling the approve workload (benches/PROFILE.md) put a quarter of all
//! CPU in glibc's allocator (`_int_malloc`, `unlink_chunk`,
//! `malloc_consolidate`, arena growth through `mprotect`): every checkpoint
//! allocates its encoded rows, sled copies tree nodes on insert, and tokio
//! and ractor allocate per message. mimalloc's per-thread free lists make
//! those small, short-lived allocations cheap and return freed pages to the
//! OS in place. Declared in the library so that the binary, the benchmark
//! harness and the tests all run on the allocator production runs on.
//!
//! It owns nothing else: no tuning knobs, no statistics.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
