// The receive side of a tcp connection (all under rx_mu_): prefix and header
// through the internal buffer, bodies straight into the caller's memory.
#include <algorithm>
#include <cstring>

#include "core/log.hpp"
#include "transport/common/peer_closed.hpp"
#include "transport/common/wait.hpp"
#include "transport/tcp/tcp_connection.hpp"
#include "transport/tcp/tcp_socket.hpp"

namespace kvstream::transport::tcp {

Result<size_t> TcpConnection::recv_header(std::vector<std::byte>& header, Deadline deadline,
                                          const CancelToken& cancel) {
  std::lock_guard lock(rx_mu_);
  KVS_RETURN_IF_ERROR(check_usable());
  if (body_pending_ && body_left_ > 0)
    return make_status(StatusCode::invalid_argument,
                       "tcp recv from {}: {} body bytes of the previous message were not read "
                       "(call recv_body, with an empty span to discard)",
                       peer_, body_left_);
  body_pending_ = false;
  // Prefix and header accumulate in rx_buf_, so a deadline or cancel here loses
  // nothing: the next recv_header continues the same message.
  KVS_RETURN_IF_ERROR(fill(kTcpPrefixBytes, deadline, cancel));
  const TcpPrefix p = decode_prefix(rx_buf_.data() + rx_begin_);
  if (p.magic != kTcpMagic)
    return fail(peer_fault(StatusCode::corrupt_data, "tcp recv from {}: bad frame magic {:#010x} (want {:#010x})",
                           peer_, p.magic, kTcpMagic));
  if (p.header_len > kMaxHeaderBytes)
    return fail(peer_fault(StatusCode::corrupt_data, "tcp recv from {}: header length {} exceeds {}", peer_,
                           p.header_len, kMaxHeaderBytes));
  if (p.body_len > kTcpMaxBodyBytes)
    return fail(peer_fault(StatusCode::corrupt_data, "tcp recv from {}: body length {} exceeds {}", peer_,
                           p.body_len, kTcpMaxBodyBytes));
  KVS_RETURN_IF_ERROR(fill(kTcpPrefixBytes + p.header_len, deadline, cancel));
  const std::byte* h = rx_buf_.data() + rx_begin_ + kTcpPrefixBytes;
  header.assign(h, h + p.header_len);
  rx_begin_ += kTcpPrefixBytes + p.header_len;
  body_pending_ = true;
  body_left_ = p.body_len;
  return size_t(p.body_len);
}

Status TcpConnection::recv_body(std::span<std::byte> dest, Deadline deadline, const CancelToken& cancel) {
  std::lock_guard lock(rx_mu_);
  KVS_RETURN_IF_ERROR(check_usable());
  if (!body_pending_)
    return make_status(StatusCode::invalid_argument, "tcp recv_body from {}: no message header was received", peer_);
  if (!dest.empty() && dest.size() < body_left_)
    return make_status(StatusCode::invalid_argument,
                       "tcp recv_body from {}: destination of {} bytes is smaller than the {} byte body", peer_,
                       dest.size(), body_left_);
  if (!dest.empty() && dest.data() == nullptr)
    return make_status(StatusCode::invalid_argument, "tcp recv_body from {}: null destination", peer_);
  if (body_left_ == 0) {
    body_pending_ = false;
    return {};
  }
  KVS_RETURN_IF_ERROR(wait_verdict(deadline, &cancel, who_, "recv_body"));
  const bool discard = dest.empty();
  const uint64_t total = body_left_;
  uint64_t off = 0;
  // Body bytes that came in with the header (bounded by kTcpRxBufferBytes).
  const size_t buffered = std::min<uint64_t>(rx_end_ - rx_begin_, body_left_);
  if (buffered > 0) {
    if (!discard) std::memcpy(dest.data(), rx_buf_.data() + rx_begin_, buffered);
    rx_begin_ += buffered;
    off += buffered;
  }
  if (rx_begin_ == rx_end_) rx_begin_ = rx_end_ = 0;
  // The rest goes straight into dest (or through rx_buf_ when discarding).
  while (rx_user_tls_ && off < total) {
    std::byte* to = discard ? rx_buf_.data() : dest.data() + off;
    const uint64_t want = discard ? std::min<uint64_t>(total - off, rx_buf_.size()) : total - off;
    auto got = tls_read(to, size_t(want), total - off, /*at_message_start=*/false, deadline, cancel);
    if (!got.ok()) {
      if (broken_.load(std::memory_order_acquire)) return got.status();
      return fail(got.status().with_context(
          fmt::format("tcp recv_body from {} ({} of {} body bytes received)", peer_, off, total)));
    }
    off += *got;
  }
  while (off < total) {
    std::byte* to = discard ? rx_buf_.data() : dest.data() + off;
    const uint64_t want = discard ? std::min<uint64_t>(total - off, rx_buf_.size())
                                  : std::min<uint64_t>(total - off, uint64_t(1) << 30);
    io_uring_sqe* s = rx_.sqe();
    const uint64_t id = rx_.next_id();
    io_uring_prep_recv(s, fd_, to, size_t(want), MSG_WAITALL);
    io_uring_sqe_set_data64(s, id);
    int res = 0;
    bool got = false;
    Status st = await_op(rx_, fd_, id, deadline, cancel, res, got);
    if (!st.ok())
      return fail(st.with_context(
          fmt::format("tcp recv_body from {} ({} of {} body bytes received)", peer_, off, total)));
    if (res == 0)
      return fail(peer_fault(StatusCode::unavailable,
                             "tcp recv_body: peer {} closed the connection after {} of {} body bytes", peer_, off,
                             total));
    if (res < 0) return fail(peer_fault(code_for_errno(-res), "tcp recv_body from {}: {}", peer_, errno_text(-res)));
    off += uint64_t(res);
  }
  body_left_ = 0;
  body_pending_ = false;
  return {};
}

Status TcpConnection::fill(size_t need, Deadline deadline, const CancelToken& cancel) {
  while (rx_end_ - rx_begin_ < need) {
    if (rx_buf_.size() - rx_begin_ < need) {  // not enough room behind: compact
      std::memmove(rx_buf_.data(), rx_buf_.data() + rx_begin_, rx_end_ - rx_begin_);
      rx_end_ -= rx_begin_;
      rx_begin_ = 0;
    }
    KVS_RETURN_IF_ERROR(wait_verdict(deadline, &cancel, who_, "recv_header"));
    if (rx_user_tls_) {
      auto got = tls_read(rx_buf_.data() + rx_end_, rx_buf_.size() - rx_end_, need - (rx_end_ - rx_begin_),
                          /*at_message_start=*/rx_end_ == rx_begin_, deadline, cancel);
      if (!got.ok()) return got.status();
      rx_end_ += *got;
      continue;
    }
    io_uring_sqe* s = rx_.sqe();
    const uint64_t id = rx_.next_id();
    io_uring_prep_recv(s, fd_, rx_buf_.data() + rx_end_, rx_buf_.size() - rx_end_, 0);
    io_uring_sqe_set_data64(s, id);
    int res = 0;
    bool got = false;
    Status st = await_op(rx_, fd_, id, deadline, cancel, res, got);
    if (got && res > 0) rx_end_ += size_t(res);  // kept even when the wait ended first
    if (!st.ok()) {
      if (st.code() == StatusCode::timed_out || st.code() == StatusCode::cancelled) {
        const Status out = st.with_context(fmt::format("tcp recv_header from {}", peer_));
        KVS_LOG_DEBUG("{}", out.to_string());
        return out;
      }
      return fail(st.with_context(fmt::format("tcp recv_header from {}", peer_)));
    }
    if (res == 0) {
      const size_t partial = rx_end_ - rx_begin_;
      if (partial == 0)
        return fail(peer_closed(fmt::format("tcp recv from {}: peer closed the connection", peer_)));
      return fail(peer_fault(StatusCode::unavailable,
                             "tcp recv from {}: peer closed the connection in the middle of a message ({} bytes "
                             "of its prefix/header received)",
                             peer_, partial));
    }
    if (res < 0) return fail(peer_fault(code_for_errno(-res), "tcp recv from {}: {}", peer_, errno_text(-res)));
  }
  return {};
}

}  // namespace kvstream::transport::tcp
