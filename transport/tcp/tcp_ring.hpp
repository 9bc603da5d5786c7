// One io_uring and the way the tcp backend waits on it.
//
// Every wait is cut into slices of at most kTcpWaitSlice so a CancelToken is seen
// promptly, and an operation interrupted by a deadline or a cancel is cancelled in
// the kernel and reaped before the wait returns (no late write into caller memory).
#pragma once

#include <liburing.h>

#include <chrono>
#include <cstdint>

#include "kvstream/transport.hpp"

namespace kvstream::transport::tcp {

/// Longest single wait on a ring: the latency with which a cancel is noticed.
inline constexpr std::chrono::milliseconds kTcpWaitSlice{50};

/// One completion, copied out of the completion queue.
struct Completion {
  uint64_t user_data = 0;
  int res = 0;
  uint32_t flags = 0;
};

/// One io_uring, used by one thread at a time (callers hold the direction's mutex).
class Ring {
 public:
  Ring() = default;
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  ~Ring();

  /// `coop`: IORING_SETUP_COOP_TASKRUN, i.e. operations continue (a send after its
  /// socket had room again, the next link of a chain) only when this thread enters
  /// the kernel; saves an interrupt per step. Right for rings that are only used
  /// by a thread waiting on them; not for the send ring, whose posted messages must
  /// keep moving while the caller does something else (even sleeps elsewhere).
  /// Errors: unavailable (io_uring disabled or out of resources).
  Status init(unsigned depth, bool coop = true);

  io_uring* get() { return &ring_; }
  uint64_t next_id() { return ++last_id_; }

  /// A free SQE (flushing the queue if it is full).
  io_uring_sqe* sqe();

  /// Takes the next completion when there is one.
  bool pop(Completion& out);

  /// Submits what is queued and sleeps until `want` completions are there or one
  /// slice (at most kTcpWaitSlice, at most until `deadline`, at least 1 us) ends.
  /// A timeout, a signal or a busy ring is not an error: the caller looks again.
  /// Errors: io_error when the ring itself fails.
  Status submit_and_wait(unsigned want, Deadline deadline);

 private:
  io_uring ring_{};
  bool ready_ = false;
  uint64_t last_id_ = 0;
};

/// Submits what is queued and waits for the next completion, in slices. Errors:
/// timed_out at `deadline`, cancelled when `cancel` fires (nothing is reaped then),
/// io_error when the ring itself fails.
Status next_completion(Ring& ring, Completion& out, Deadline deadline, const CancelToken* cancel);

/// Runs the submitted operation `id` on socket `fd` to its end: its result and, for
/// zero-copy sends, the notification that the kernel no longer reads the buffers.
/// On a deadline or cancel the operation is cancelled in the kernel and reaped
/// before this returns, so nothing writes to (or reads from) caller memory
/// afterwards; `res` then holds what the operation did anyway (bytes moved, or
/// -ECANCELED) and `got` whether it reported at all. When the kernel does not let
/// go within a second, the socket is shut down, which ends any socket operation.
Status await_op(Ring& ring, int fd, uint64_t id, Deadline deadline, const CancelToken& cancel, int& res, bool& got);

}  // namespace kvstream::transport::tcp
