// The send side of a tcp connection: posted messages and the chain of linked
// SENDMSGs that hands them to the kernel (all under tx_mu_).
//
// Posted messages wait in txq_, in order. At most one chain of linked SENDMSGs
// (IOSQE_IO_LINK, one SQE per message gathering prefix + header + body) is in the
// kernel at a time: a chain keeps its messages in order on the stream, and two
// chains could interleave, so the next chain (everything posted meanwhile) goes
// in when the current one has reported. With MSG_WAITALL a send is short only
// when the socket failed; a short send fails the chain (the kernel completes the
// later links with -ECANCELED, having sent none of their bytes), and the next
// chain starts with the remainder of the short one, so the order holds.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/log.hpp"
#include "transport/tcp/tcp_connection.hpp"
#include "transport/tcp/tcp_socket.hpp"

namespace kvstream::transport::tcp {

Result<uint64_t> TcpConnection::post_send(std::span<const std::byte> header, std::span<const std::byte> body) {
  std::lock_guard lock(tx_mu_);
  KVS_RETURN_IF_ERROR(check_usable());
  KVS_RETURN_IF_ERROR(check_send_args(header, body));
  return post_locked(header, body);
}

Status TcpConnection::wait_sends(uint64_t seq, Deadline deadline, const CancelToken& cancel) {
  std::lock_guard lock(tx_mu_);
  return wait_locked(seq, deadline, cancel);
}

Status TcpConnection::check_send_args(std::span<const std::byte> header, std::span<const std::byte> body) const {
  if (header.size() > kMaxHeaderBytes)
    return make_status(StatusCode::invalid_argument, "tcp send to {}: header of {} bytes exceeds {}", peer_,
                       header.size(), kMaxHeaderBytes);
  if (body.size() > kTcpMaxBodyBytes)
    return make_status(StatusCode::invalid_argument, "tcp send to {}: body of {} bytes exceeds {}", peer_, body.size(),
                       kTcpMaxBodyBytes);
  if (!body.empty() && body.data() == nullptr)
    return make_status(StatusCode::invalid_argument, "tcp send to {}: null body", peer_);
  return {};
}

Result<uint64_t> TcpConnection::post_locked(std::span<const std::byte> header, std::span<const std::byte> body) {
  std::unique_ptr<TxMsg> m;
  if (!tx_pool_.empty()) {
    m = std::move(tx_pool_.back());
    tx_pool_.pop_back();
  } else {
    m = std::make_unique<TxMsg>();
  }
  encode_prefix(m->head.data(), uint32_t(header.size()), body.size());
  if (!header.empty()) std::memcpy(m->head.data() + kTcpPrefixBytes, header.data(), header.size());
  m->iov[0] = {m->head.data(), kTcpPrefixBytes + header.size()};
  m->iov_count = 1;
  if (!body.empty()) m->iov[m->iov_count++] = {const_cast<std::byte*>(body.data()), body.size()};
  m->first = 0;
  m->total = m->left = kTcpPrefixBytes + header.size() + body.size();
  m->op = 0;
  m->notifs = 0;
  // Zero-copy only in clear: a kTLS socket encrypts from the pages it is given.
  m->zc = opt_.send_zc && !tls_ && body.size() >= opt_.send_zc_min_bytes;
  if (tx_user_tls_) {
    // The records are the message now (the caller's body may be reused at once after
    // wait_sends as before; it is not read again).
    auto sealed = seal_message(*m, std::span<const std::byte>(m->head.data(), kTcpPrefixBytes + header.size()), body);
    if (!sealed.ok()) {
      tx_pool_.push_back(std::move(m));
      return fail(sealed.status().with_context(fmt::format("tls send to {}", peer_)));
    }
    m->iov[0] = {m->sealed.get(), *sealed};
    m->iov_count = 1;
    m->total = m->left = *sealed;
  }
  m->seq = ++tx_posted_;
  const uint64_t seq = m->seq;
  txq_.push_back(std::move(m));
  if (Status st = tx_pump(); !st.ok()) return tx_abort_and_fail(std::move(st));
  return seq;
}

Status TcpConnection::wait_locked(uint64_t seq, Deadline deadline, const CancelToken& cancel) {
  if (seq > tx_posted_)
    return make_status(StatusCode::invalid_argument, "tcp wait_sends to {}: sequence {} was never posted (last is {})",
                       peer_, seq, tx_posted_);
  if (seq <= tx_done_) return {};
  if (Status st = check_usable(); !st.ok()) {
    tx_abort();  // broken from the receive side: reap what is still in the kernel
    return st;
  }
  for (;;) {
    if (Status st = tx_pump(); !st.ok()) return tx_abort_and_fail(std::move(st));
    if (tx_done_ >= seq) return {};
    Status why;
    if (cancel.cancelled()) {
      why = make_status(StatusCode::cancelled, "cancelled");
    } else if (Clock::now() >= deadline) {
      why = make_status(StatusCode::timed_out, "deadline passed");
    }
    if (!why.ok()) return tx_abort_and_fail(std::move(why));
    // Sleep until at least the completions that `seq` still needs could be there.
    unsigned need = 0;
    for (const auto& m : txq_) {
      if (m->seq > seq) break;
      need += (m->op != 0 ? 1u : 0u) + unsigned(m->notifs);
    }
    if (Status st = tx_.submit_and_wait(std::max(need, 1u), deadline); !st.ok())
      return tx_abort_and_fail(std::move(st));
  }
}

void TcpConnection::retire(std::unique_ptr<TxMsg> m) {
  // A sealed copy is kept for reuse by two pooled messages at most: a burst of large
  // messages in flight must not leave the connection holding a copy of each.
  if (m->sealed_capacity > kKeepSealedBytes) {
    size_t kept = 0;
    for (const auto& p : tx_pool_) kept += p->sealed_capacity > kKeepSealedBytes;
    if (kept >= 2) m->sealed.reset(), m->sealed_capacity = 0;
  }
  tx_pool_.push_back(std::move(m));
}

Status TcpConnection::tx_pump() {
  Completion c;
  while (tx_.pop(c)) tx_complete(c);
  if (!tx_err_.ok()) return tx_err_;
  while (!txq_.empty()) {
    TxMsg& m = *txq_.front();
    if (m.left > 0 || m.op != 0 || m.notifs > 0) break;
    tx_done_ = m.seq;
    retire(std::move(txq_.front()));
    txq_.pop_front();
  }
  if (tx_ops_ == 0) return tx_submit_chain();
  return {};
}

void TcpConnection::tx_complete(const Completion& c) {
  if (c.flags & IORING_CQE_F_NOTIF) {
    for (size_t i = 0; i < tx_notif_.size(); ++i) {
      if (tx_notif_[i].first != c.user_data) continue;
      --tx_notif_[i].second->notifs;
      tx_notif_[i] = tx_notif_.back();
      tx_notif_.pop_back();
      break;
    }
    return;
  }
  TxMsg* m = nullptr;
  for (const auto& q : txq_) {
    if (q->op == c.user_data) {
      m = q.get();
      break;
    }
  }
  if (m == nullptr) return;  // a cancel request's own completion
  m->op = 0;
  --tx_ops_;
  if (c.flags & IORING_CQE_F_MORE) {
    ++m->notifs;
    tx_notif_.emplace_back(c.user_data, m);
  }
  if (!tx_err_.ok() || tx_aborting_) return;  // only reaping now
  if (c.res == -ECANCELED) {
    tx_chain_cancelled_ = true;  // a link after a short send: none of it was sent
  } else if (c.res < 0) {
    tx_err_ = peer_fault(code_for_errno(-c.res), "tcp send to {}: {}", peer_, errno_text(-c.res));  // a reset, a pipe
  } else if (c.res == 0) {
    tx_err_ = peer_fault(StatusCode::unavailable, "tcp send to {}: connection closed", peer_);
  } else {
    size_t done = std::min<uint64_t>(uint64_t(c.res), m->left);
    m->left -= done;
    while (done > 0 && m->first < m->iov_count) {
      iovec& v = m->iov[m->first];
      const size_t take = std::min(done, v.iov_len);
      v.iov_base = static_cast<std::byte*>(v.iov_base) + take;
      v.iov_len -= take;
      done -= take;
      if (v.iov_len == 0) ++m->first;
    }
    if (m->left > 0) tx_chain_short_ = true;
  }
  if (tx_ops_ == 0 && tx_err_.ok() && tx_chain_cancelled_ && !tx_chain_short_)
    tx_err_ = make_status(StatusCode::io_error, "tcp send to {}: the kernel cancelled a send", peer_);
}

Status TcpConnection::tx_submit_chain() {
  auto it = std::find_if(txq_.begin(), txq_.end(), [](const auto& m) { return m->left > 0; });
  if (it == txq_.end()) return {};
  const size_t room = std::min<size_t>(io_uring_sq_space_left(tx_.get()), size_t(txq_.end() - it));
  if (room == 0) return make_status(StatusCode::io_error, "tcp send to {}: no free submission entry", peer_);
  tx_chain_short_ = tx_chain_cancelled_ = false;
  for (size_t i = 0; i < room; ++i, ++it) {
    TxMsg& m = **it;
    m.msg = msghdr{};
    m.msg.msg_iov = m.iov + m.first;
    m.msg.msg_iovlen = size_t(m.iov_count - m.first);
    io_uring_sqe* s = io_uring_get_sqe(tx_.get());
    if (m.zc)
      io_uring_prep_sendmsg_zc(s, fd_, &m.msg, MSG_NOSIGNAL | MSG_WAITALL);
    else
      io_uring_prep_sendmsg(s, fd_, &m.msg, MSG_NOSIGNAL | MSG_WAITALL);
    if (i + 1 < room) s->flags |= IOSQE_IO_LINK;
    m.op = tx_.next_id();
    io_uring_sqe_set_data64(s, m.op);
    ++tx_ops_;
  }
  const int rc = io_uring_submit(tx_.get());
  if (rc < 0)
    return make_status(StatusCode::io_error, "tcp send to {}: io_uring submit failed: {}", peer_, errno_text(-rc));
  return {};
}

void TcpConnection::tx_abort() {
  tx_aborting_ = true;
  const CancelToken never;
  const auto t0 = Clock::now();
  auto next_cancel = t0;
  bool shut = false;
  while (tx_ops_ > 0 || !tx_notif_.empty()) {
    const auto now = Clock::now();
    if (tx_ops_ > 0 && now >= next_cancel) {
      // Repeated: a link not yet started when a cancel went in starts later.
      for (const auto& m : txq_) {
        if (m->op == 0) continue;
        if (io_uring_sqe* s = tx_.sqe()) {
          io_uring_prep_cancel64(s, m->op, 0);
          io_uring_sqe_set_data64(s, tx_.next_id());
        }
      }
      next_cancel = now + std::chrono::milliseconds(100);
    }
    if (!shut && now - t0 >= std::chrono::seconds(1)) {
      shutdown(fd_, SHUT_RDWR);
      shut = true;
    }
    Completion c;
    Status w = next_completion(tx_, c, std::min(next_cancel, now + std::chrono::milliseconds(100)), &never);
    if (w.code() == StatusCode::timed_out) {
      if (shut && now - t0 >= std::chrono::seconds(6)) {
        KVS_LOG_WARN("tcp: still waiting for the kernel to release sends on fd {}", fd_);
      }
      continue;
    }
    if (!w.ok()) {
      // The ring failed: the kernel may still read these buffers; never free them.
      KVS_LOG_ERROR("tcp: send ring of fd {} failed while aborting sends: {}", fd_, w.to_string());
      shutdown(fd_, SHUT_RDWR);
      for (auto& m : txq_) (void)m.release();
      txq_.clear();
      tx_notif_.clear();
      tx_ops_ = 0;
      break;
    }
    tx_complete(c);
  }
  for (auto& m : txq_) retire(std::move(m));
  txq_.clear();
  tx_aborting_ = false;
}

Status TcpConnection::tx_abort_and_fail(Status why) {
  const size_t unsent = txq_.size();
  tx_abort();
  return fail(why.with_context(fmt::format("tcp send to {} ({} posted message(s) not handed over)", peer_, unsent)));
}

}  // namespace kvstream::transport::tcp
