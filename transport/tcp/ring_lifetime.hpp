#pragma once
// Tells ThreadSanitizer that an io_uring's shared rings were unmapped or mapped.
//
// Why: liburing maps and unmaps the SQ/CQ rings with raw system calls (its nolibc
// syscall layer), so TSan never sees the munmap. When a ring is closed and a new
// one is created later at the same address, TSan compares the new owner's accesses
// with the old owner's and reports a data race that cannot happen (the kernel
// orders munmap before the next mmap). A release on teardown and an acquire on
// setup, on one process-wide token, state exactly that order. Outside TSan builds
// both functions are empty.

#if defined(__SANITIZE_THREAD__)
#define KVS_TSAN_RINGS 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVS_TSAN_RINGS 1
#endif
#endif

#ifdef KVS_TSAN_RINGS
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace kvstream::transport::tcp {

#ifdef KVS_TSAN_RINGS
inline char ring_lifetime_token;
/// Call right after io_uring_queue_init succeeded.
inline void note_ring_mapped() { __tsan_acquire(&ring_lifetime_token); }
/// Call right before io_uring_queue_exit.
inline void note_ring_unmapped() { __tsan_release(&ring_lifetime_token); }
#else
inline void note_ring_mapped() {}
inline void note_ring_unmapped() {}
#endif

}  // namespace kvstream::transport::tcp
