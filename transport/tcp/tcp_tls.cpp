// TLS on a tcp connection once OpenSSL's handshake is done (connect_tcp on the
// client, tls_acceptor.hpp on the server): each direction's record layer in the
// kernel (kTLS, where it takes the key) or here (security/tls_record.hpp), never
// OpenSSL's own: an SSL object cannot be used by a sending and a receiving thread at
// once, and a connection has one of each.
#include <algorithm>
#include <atomic>
#include <cstring>

#include "core/log.hpp"
#include <openssl/crypto.h>

#include "security/tls_keys.hpp"
#include "transport/common/peer_closed.hpp"
#include "transport/common/wait.hpp"
#include "transport/tcp/kernel_tls.hpp"
#include "transport/tcp/tcp_connection.hpp"
#include "transport/tcp/tcp_socket.hpp"

namespace kvstream::transport::tcp {
namespace {

/// Ciphertext received ahead: at least a full record, room for several per recv.
constexpr size_t kTlsInBytes = 256 * 1024;

/// The path of each kind is logged once per process (then per connection at debug).
void log_path_once(const std::string& path) {
  static std::mutex mu;
  static std::vector<std::string> seen;
  std::lock_guard lock(mu);
  if (std::find(seen.begin(), seen.end(), path) != seen.end()) return;
  seen.push_back(path);
  KVS_LOG_INFO("tcp: {}", path);
}

}  // namespace

Status TcpConnection::use_tls(security::TlsEstablished tls, bool kernel_tls) {
  tls_ = true;
  peer_names_ = std::move(tls.peer_names);
  // Which directions the kernel took: only the path's text needs it afterwards; the
  // data path reads tx_user_tls_ / rx_user_tls_.
  bool tx_kernel = false, rx_kernel = false;
  std::string kernel_why;
  if (kernel_tls) {
    Status attached = attach_kernel_tls(fd_);
    if (attached.ok()) {
      Status tx = install_kernel_tls(fd_, tls.keys.send, true);
      tx_kernel = tx.ok();
      Status rx = install_kernel_tls(fd_, tls.keys.receive, false);
      rx_kernel = rx.ok();
      if (!tx.ok()) kernel_why = tx.message();
      else if (!rx.ok()) kernel_why = rx.message();
    } else {
      kernel_why = attached.message();
    }
  } else {
    kernel_why = "kernel_tls is off";
  }
  tx_user_tls_ = !tx_kernel;
  rx_user_tls_ = !rx_kernel;
  Status st;
  if (tx_user_tls_) st = sealer_.init(tls.keys.send);
  if (st.ok() && rx_user_tls_) {
    st = opener_.init(tls.keys.receive);
    tls_in_.resize(kTlsInBytes);
    tls_plain_.resize(security::kTlsMaxRecordBytes);
  }
  OPENSSL_cleanse(&tls.keys, sizeof tls.keys);
  if (!st.ok()) return fail(std::move(st));
  auto side = [](bool kernel) { return kernel ? "kernel (kTLS)" : "user space"; };
  tls_path_ = fmt::format("TLS 1.3 {}, records sent by the {}, received by the {}", tls.suite, side(tx_kernel),
                          side(rx_kernel));
  log_path_once(kernel_why.empty() ? tls_path_ : fmt::format("{} ({})", tls_path_, kernel_why));
  KVS_LOG_DEBUG("tcp {}: {}", peer_, tls_path_);
  return {};
}

Result<size_t> TcpConnection::seal_message(TxMsg& m, std::span<const std::byte> head,
                                           std::span<const std::byte> body) {
  const size_t need = security::sealed_bytes(head.size()) + security::sealed_bytes(body.size());
  if (m.sealed_capacity < need) {
    m.sealed = std::make_unique_for_overwrite<std::byte[]>(need);
    m.sealed_capacity = need;
  }
  const std::span<std::byte> out(m.sealed.get(), need);
  KVS_ASSIGN_OR_RETURN(const size_t first, sealer_.seal(head, out));
  if (body.empty()) return first;
  KVS_ASSIGN_OR_RETURN(const size_t second, sealer_.seal(body, out.subspan(first)));
  return first + second;
}

Result<size_t> TcpConnection::tls_read(std::byte* to, size_t n, uint64_t coming, bool at_message_start,
                                       Deadline deadline, const CancelToken& cancel) {
  if (tls_plain_begin_ < tls_plain_end_) {
    const size_t take = std::min(n, tls_plain_end_ - tls_plain_begin_);
    std::memcpy(to, tls_plain_.data() + tls_plain_begin_, take);
    tls_plain_begin_ += take;
    return take;
  }
  // The record layer's errors are the peer's doing (it logs none of them), except an
  // internal one, which it has logged.
  const auto record_error = [&](const Status& s) {
    const Status out = s.with_context(fmt::format("tls recv from {}", peer_));
    return fail(s.code() == StatusCode::internal ? out : peer_fault(out));
  };
  for (;;) {
    const std::span<const std::byte> have(tls_in_.data() + tls_in_begin_, tls_in_end_ - tls_in_begin_);
    auto whole = opener_.record_bytes(have);
    if (!whole.ok()) return record_error(whole.status());
    if (*whole != 0 && have.size() >= *whole) {
      const auto record = have.first(*whole);
      const size_t inner = *whole - security::kTlsRecordHeaderBytes - 16;
      // Straight into the caller's memory when the record's inner plaintext fits.
      const bool direct = n >= inner;
      auto got = opener_.open(record, direct ? std::span(to, inner) : std::span(tls_plain_));
      tls_in_begin_ += *whole;
      if (!got.ok()) return record_error(got.status());
      if (*got == 0) continue;  // an empty record
      if (direct) return *got;
      tls_plain_begin_ = 0, tls_plain_end_ = *got;
      const size_t take = std::min(n, *got);
      std::memcpy(to, tls_plain_.data(), take);
      tls_plain_begin_ = take;
      return take;
    }
    // More ciphertext: keep the partial record at the front.
    if (tls_in_begin_ == tls_in_end_) {
      tls_in_begin_ = tls_in_end_ = 0;
    } else if (tls_in_.size() - tls_in_begin_ < security::kTlsMaxRecordBytes + 256) {
      std::memmove(tls_in_.data(), tls_in_.data() + tls_in_begin_, tls_in_end_ - tls_in_begin_);
      tls_in_end_ -= tls_in_begin_;
      tls_in_begin_ = 0;
    }
    KVS_RETURN_IF_ERROR(wait_verdict(deadline, &cancel, who_, "recv"));
    io_uring_sqe* s = rx_.sqe();
    const uint64_t id = rx_.next_id();
    // Bytes certainly on their way (a record is never smaller than its data) are
    // waited for in one receive; past them, whatever is there.
    const size_t room = tls_in_.size() - tls_in_end_;
    const uint64_t buffered = tls_in_end_ - tls_in_begin_;
    const bool all = coming > buffered && coming - buffered >= 4096;
    const size_t want = all ? size_t(std::min<uint64_t>(room, coming - buffered)) : room;
    io_uring_prep_recv(s, fd_, tls_in_.data() + tls_in_end_, want, all ? MSG_WAITALL : 0);
    io_uring_sqe_set_data64(s, id);
    int res = 0;
    bool got = false;
    Status st = await_op(rx_, fd_, id, deadline, cancel, res, got);
    if (got && res > 0) tls_in_end_ += size_t(res);  // kept even when the wait ended first
    if (!st.ok()) {
      if (st.code() == StatusCode::timed_out || st.code() == StatusCode::cancelled)
        return st.with_context(fmt::format("tls recv from {}", peer_));
      return fail(st.with_context(fmt::format("tls recv from {}", peer_)));
    }
    if (res == 0) {
      const size_t partial = tls_in_end_ - tls_in_begin_;
      if (partial == 0 && at_message_start)
        return fail(peer_closed(fmt::format("tls recv from {}: peer closed the connection", peer_)));
      return fail(peer_fault(StatusCode::unavailable, "tls recv from {}: peer closed the connection {}", peer_,
                             partial ? fmt::format("inside a record ({} bytes of it received)", partial)
                                     : std::string("in the middle of a message")));
    }
    if (res < 0) return fail(peer_fault(code_for_errno(-res), "tls recv from {}: {}", peer_, errno_text(-res)));
  }
}

}  // namespace kvstream::transport::tcp
