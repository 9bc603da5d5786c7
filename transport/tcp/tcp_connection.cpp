// What both directions of a tcp connection share: setup, connect, the broken state.
#include "transport/tcp/tcp_connection.hpp"

#include <unistd.h>

#include <cerrno>

#include "core/log.hpp"
#include "security/socket_bio.hpp"
#include "transport/common/address.hpp"
#include "transport/tcp/tcp_socket.hpp"

namespace kvstream::transport::tcp {

TcpConnection::TcpConnection(int fd, std::string peer, const TcpSettings& opt, Side side)
    : fd_(fd), peer_(std::move(peer)), side_(side), who_("tcp " + peer_), opt_(opt) {
  rx_buf_.resize(kTcpRxBufferBytes);
}

TcpConnection::~TcpConnection() {
  // Posted messages nobody waited for: take them back from the kernel first.
  if (tx_ops_ > 0 || !tx_notif_.empty()) tx_abort();
  if (fd_ >= 0) close(fd_);
}

Status TcpConnection::init(unsigned depth) {
  KVS_RETURN_IF_ERROR(tx_.init(depth, /*coop=*/false));
  return rx_.init(depth);
}

Status TcpConnection::connect_to(const sockaddr_storage& addr, Deadline deadline, const CancelToken& cancel) {
  std::lock_guard lock(tx_mu_);
  io_uring_sqe* s = tx_.sqe();
  const uint64_t id = tx_.next_id();
  io_uring_prep_connect(s, fd_, reinterpret_cast<const sockaddr*>(&addr), sockaddr_len(addr));
  io_uring_sqe_set_data64(s, id);
  int res = 0;
  bool got = false;
  Status st = await_op(tx_, fd_, id, deadline, cancel, res, got);
  if (!st.ok()) return st.with_context(fmt::format("tcp: connecting to {}", peer_));
  if (res < 0) return make_status(code_for_errno(-res), "tcp: cannot connect to {}: {}", peer_, errno_text(-res));
  return {};
}

std::string TcpConnection::describe() const {
  if (tls_) return fmt::format("tcp {} (io_uring, {})", peer_, tls_path_);
  return fmt::format("tcp {} (io_uring{})", peer_, opt_.send_zc ? ", send_zc" : "");
}

Status TcpConnection::check_usable() {
  if (!broken_.load(std::memory_order_acquire)) return {};
  std::lock_guard lock(broken_mu_);
  return detail::repeated_status(StatusCode::unavailable, "tcp connection to {} is closed after an earlier error: {}",
                                 peer_, broken_why_);
}

Status TcpConnection::fail(Status why) {
  {
    std::lock_guard lock(broken_mu_);
    if (!broken_.load(std::memory_order_relaxed)) broken_why_ = why.to_string();
    broken_.store(true, std::memory_order_release);
  }
  shutdown(fd_, SHUT_RDWR);
  return why;
}

namespace {

// The client's handshake on a connected socket, then the record layer.
Result<std::unique_ptr<Connection>> handshake_tls(std::unique_ptr<TcpConnection> conn,
                                                  const security::TlsContext& tls, const std::string& host,
                                                  Deadline deadline, const CancelToken& cancel) {
  KVS_ASSIGN_OR_RETURN(auto ssl, tls.new_session(host));
  KVS_RETURN_IF_ERROR(security::attach_socket(ssl.get(), conn->fd()));  // no SIGPIPE if the server leaves
  KVS_RETURN_IF_ERROR(security::run_handshake(ssl.get(), conn->fd(), deadline,
                                              [&cancel] { return cancel.cancelled(); }, conn->peer_address()));
  KVS_ASSIGN_OR_RETURN(auto established, security::finish_handshake(ssl.get(), security::TlsRole::client));
  ssl.reset();  // never sends: close_notify would be a record the layer below does not know of
  KVS_RETURN_IF_ERROR(conn->use_tls(std::move(established), tls.settings().kernel_tls));
  return std::unique_ptr<Connection>(std::move(conn));
}

}  // namespace

Result<std::unique_ptr<Connection>> connect_tcp(const std::string& address, const TcpSettings& opt, unsigned depth,
                                                std::shared_ptr<const security::TlsContext> tls, Deadline deadline,
                                                const CancelToken& cancel) {
  auto resolved = resolve_address("tcp", address, false);
  if (!resolved.ok()) return resolved.status();
  const std::vector<sockaddr_storage>& addrs = *resolved;
  Status last;
  for (const sockaddr_storage& a : addrs) {
    auto fd = open_socket(a, opt, "connect to", address);
    if (!fd.ok()) {
      last = fd.status();
      continue;
    }
    auto conn = std::make_unique<TcpConnection>(*fd, format_address(a), opt);
    if (Status st = conn->init(depth); !st.ok()) return st;
    last = conn->connect_to(a, deadline, cancel);
    if (last.ok() && tls) {
      // A refused certificate is final: the name's other addresses reach the same server.
      std::string host;
      uint16_t port = 0;
      (void)parse_host_port(address, host, port);  // resolve_address accepted it
      return handshake_tls(std::move(conn), *tls, host, deadline, cancel);
    }
    if (last.ok()) return std::unique_ptr<Connection>(std::move(conn));
    if (last.code() == StatusCode::timed_out || last.code() == StatusCode::cancelled) break;
  }
  return last;
}

}  // namespace kvstream::transport::tcp
