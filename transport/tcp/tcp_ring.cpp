// The io_uring wrapper and the sliced, cancel-aware wait of the tcp backend.
#include "transport/tcp/tcp_ring.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "core/log.hpp"
#include "transport/tcp/ring_lifetime.hpp"
#include "transport/tcp/tcp_socket.hpp"

namespace kvstream::transport::tcp {

Ring::~Ring() {
  if (ready_) {
    note_ring_unmapped();
    io_uring_queue_exit(&ring_);
  }
}

Status Ring::init(unsigned depth, bool coop) {
  int rc = io_uring_queue_init(depth, &ring_, coop ? IORING_SETUP_COOP_TASKRUN : 0);
  if (rc == -EINVAL && coop) rc = io_uring_queue_init(depth, &ring_, 0);  // older kernel
  if (rc < 0)
    return make_status(StatusCode::unavailable, "tcp: io_uring_queue_init({}) failed: {}", depth, errno_text(-rc));
  ready_ = true;
  note_ring_mapped();
  return {};
}

io_uring_sqe* Ring::sqe() {
  io_uring_sqe* s = io_uring_get_sqe(&ring_);
  if (!s) {
    io_uring_submit(&ring_);
    s = io_uring_get_sqe(&ring_);
  }
  return s;
}

bool Ring::pop(Completion& out) {
  io_uring_cqe* cqe = nullptr;
  if (io_uring_peek_cqe(&ring_, &cqe) != 0 || !cqe) return false;
  out = Completion{cqe->user_data, cqe->res, cqe->flags};
  io_uring_cqe_seen(&ring_, cqe);
  return true;
}

Status Ring::submit_and_wait(unsigned want, Deadline deadline) {
  const auto slice = std::min<Clock::duration>(deadline - Clock::now(), kTcpWaitSlice);
  // At least 1 us: a zero timeout would return at once and spin.
  const auto ns = std::max<long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count(), 1000);
  __kernel_timespec ts{};
  ts.tv_sec = ns / 1000000000;
  ts.tv_nsec = ns % 1000000000;
  io_uring_cqe* cqe = nullptr;
  const int rc = io_uring_submit_and_wait_timeout(&ring_, &cqe, want, &ts, nullptr);
  if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)
    return make_status(StatusCode::io_error, "io_uring wait failed: {}", errno_text(-rc));
  return {};
}

Status next_completion(Ring& ring, Completion& out, Deadline deadline, const CancelToken* cancel) {
  for (;;) {
    if (ring.pop(out)) return {};
    if (cancel && cancel->cancelled()) return make_status(StatusCode::cancelled, "cancelled");
    if (Clock::now() >= deadline) return make_status(StatusCode::timed_out, "deadline passed");
    KVS_RETURN_IF_ERROR(ring.submit_and_wait(1, deadline));
  }
}

Status await_op(Ring& ring, int fd, uint64_t id, Deadline deadline, const CancelToken& cancel, int& res, bool& got) {
  got = false;
  bool need_notif = false;
  // Accounts a completion of `id`: its result (and whether a zero-copy notification
  // follows), or that notification.
  auto take = [&](const Completion& c) {
    if (c.flags & IORING_CQE_F_NOTIF) {
      need_notif = false;
    } else {
      res = c.res;
      got = true;
      need_notif = (c.flags & IORING_CQE_F_MORE) != 0;
    }
  };
  Status st;
  for (;;) {
    Completion c;
    st = next_completion(ring, c, deadline, &cancel);
    if (!st.ok()) break;
    if (c.user_data != id) continue;  // a stale completion (an earlier cancel request)
    take(c);
    if (got && !need_notif) return {};
  }
  if (st.code() != StatusCode::timed_out && st.code() != StatusCode::cancelled) {
    // The ring failed: nothing more can be waited for safely; stop the socket.
    shutdown(fd, SHUT_RDWR);
    return st;
  }
  if (!got) {
    if (io_uring_sqe* s = ring.sqe()) {
      io_uring_prep_cancel64(s, id, 0);
      io_uring_sqe_set_data64(s, ring.next_id());
    }
  }
  bool shut = false;
  Deadline drain_until = Clock::now() + std::chrono::seconds(1);
  const CancelToken never;
  while (!got || need_notif) {
    Completion c;
    Status w = next_completion(ring, c, drain_until, &never);
    if (w.code() == StatusCode::timed_out) {
      if (!shut) {
        shutdown(fd, SHUT_RDWR);
        shut = true;
      } else {
        KVS_LOG_WARN("tcp: still waiting for the kernel to release an operation on fd {}", fd);
      }
      drain_until = Clock::now() + std::chrono::seconds(5);
      continue;
    }
    if (!w.ok()) return w;  // the ring itself failed
    if (c.user_data != id) continue;
    take(c);
  }
  return st;
}

}  // namespace kvstream::transport::tcp
