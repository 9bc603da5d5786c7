// One tcp connection: framed messages (tcp_framing.hpp) over a socket, driven by
// io_uring.
//
// Each connection owns two rings (one for sends, one for receives) so that one
// thread may send while another receives without the two stealing each other's
// completions; a mutex per direction serialises callers of the same direction.
// The send side is tcp_send.cpp, the receive side tcp_receive.cpp, TLS (the
// handshake, then the record layer in the kernel or in user space) tcp_tls.cpp;
// this header's .cpp has what all share (setup, connect, the broken state).
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/log.hpp"
#include "kvstream/transport.hpp"
#include "security/tls_context.hpp"
#include "security/tls_record.hpp"
#include "transport/common/peer_fault.hpp"
#include "transport/tcp/tcp_framing.hpp"
#include "transport/tcp/tcp_ring.hpp"

namespace kvstream::transport::tcp {

/// Internal receive buffer: prefix and header reads are batched through it (many
/// small messages per recv). Body bytes that arrive with a header are copied out of
/// it (at most this much per message); the rest of a body is received straight
/// into the caller's memory.
inline constexpr size_t kTcpRxBufferBytes = 32 * 1024;

class TcpConnection final : public Connection {
 public:
  /// Takes `fd` (a socket, connected or not); `peer` names the other side in errors.
  /// `side`: whether this side opened it (how the peer's faults are logged).
  TcpConnection(int fd, std::string peer, const TcpSettings& opt, Side side = Side::connected);
  ~TcpConnection() override;

  /// Sets up both rings of `depth` entries. Errors: unavailable.
  Status init(unsigned depth);

  /// Connects the (not yet connected) socket to `addr` through the send ring.
  Status connect_to(const sockaddr_storage& addr, Deadline deadline, const CancelToken& cancel);

  /// Turns TLS on for a connection whose handshake is done (connect_tcp, the
  /// listener's TlsAcceptor): each direction's records are made by the kernel where
  /// `kernel_tls` and the kernel allow, here otherwise. Errors: internal.
  Status use_tls(security::TlsEstablished tls, bool kernel_tls);
  [[nodiscard]] std::vector<std::string> peer_certificate_names() const override { return peer_names_; }

  Result<uint64_t> post_send(std::span<const std::byte> header, std::span<const std::byte> body) override;
  Status wait_sends(uint64_t seq, Deadline deadline, const CancelToken& cancel) override;
  Result<size_t> recv_header(std::vector<std::byte>& header, Deadline deadline, const CancelToken& cancel) override;
  Status recv_body(std::span<std::byte> dest, Deadline deadline, const CancelToken& cancel) override;

  [[nodiscard]] std::string peer_address() const override { return peer_; }
  [[nodiscard]] int fd() const { return fd_; }
  [[nodiscard]] std::string describe() const override;

 private:
  /// One posted message: its prefix and header (copied), where its bytes are and
  /// what of it the kernel still holds.
  struct TxMsg {
    uint64_t seq = 0;
    std::array<std::byte, kTcpPrefixBytes + kMaxHeaderBytes> head{};
    iovec iov[2]{};
    int iov_count = 0, first = 0;
    msghdr msg{};
    uint64_t total = 0, left = 0;
    uint64_t op = 0;  ///< id of its SENDMSG in the kernel, 0 when none
    int notifs = 0;   ///< zero-copy notifications still to come
    bool zc = false;
    /// The message as TLS records (user-space TLS): never zero-filled, grown as needed.
    std::unique_ptr<std::byte[]> sealed;
    size_t sealed_capacity = 0;
  };

  // ---- both directions (tcp_connection.cpp) ----

  /// unavailable once the connection was closed by an earlier error.
  Status check_usable();
  /// Marks the connection broken, shuts the socket down (the peer sees the close,
  /// the other direction's call ends) and returns `why` (logged unless it is a
  /// deadline or cancel, which the caller asked for).
  Status fail(Status why);
  /// An error the peer caused: logged as this connection's side calls for
  /// (transport/common/peer_fault.hpp), and returned.
  template <typename... Args>
  Status peer_fault(StatusCode code, fmt::format_string<Args...> f, Args&&... args) const {
    return transport::peer_fault(side_, code, f, std::forward<Args>(args)...);
  }
  Status peer_fault(Status why) const { return transport::peer_fault(side_, std::move(why)); }

  // ---- TLS (tcp_tls.cpp) ----

  /// Puts the message's framing + header and body into m.sealed as TLS records and
  /// returns their size.
  Result<size_t> seal_message(TxMsg& m, std::span<const std::byte> head, std::span<const std::byte> body);
  /// Reads at most `n` (> 0) bytes of plaintext into `to` through the user-space
  /// record layer (under rx_mu_); `coming`: plaintext bytes the stream certainly
  /// still holds for the caller (a body's rest), so they are waited for in one
  /// receive; `at_message_start`: no byte of the next message has been read, so a
  /// close here is the peer ending the conversation (transport/common/peer_closed.hpp).
  /// A deadline or cancel leaves what arrived buffered (the next call continues); other
  /// errors break the connection.
  Result<size_t> tls_read(std::byte* to, size_t n, uint64_t coming, bool at_message_start, Deadline deadline,
                          const CancelToken& cancel);

  // ---- the send pipeline, all under tx_mu_ (tcp_send.cpp) ----

  Status check_send_args(std::span<const std::byte> header, std::span<const std::byte> body) const;
  /// Queues one message (arguments already checked) and starts it when no chain is busy.
  Result<uint64_t> post_locked(std::span<const std::byte> header, std::span<const std::byte> body);
  /// Waits until every message up to `seq` is handed to the socket.
  Status wait_locked(uint64_t seq, Deadline deadline, const CancelToken& cancel);
  /// Puts a finished (or dropped) message back in the pool.
  void retire(std::unique_ptr<TxMsg> m);
  /// Sealed buffers above this are kept by two pooled messages at most.
  static constexpr size_t kKeepSealedBytes = 256 * 1024;
  /// Reaps the completions that are there, retires finished messages and submits
  /// the next chain when none is in flight. Returns the first send error.
  Status tx_pump();
  /// Accounts one completion of the send ring.
  void tx_complete(const Completion& c);
  /// Submits the unsent messages (from the first one with bytes left) as one chain.
  Status tx_submit_chain();
  /// Cancels what the kernel still holds of posted messages, reaps it (so nothing
  /// reads caller memory afterwards) and drops every unfinished message. When the
  /// kernel does not let go within a second, the socket is shut down.
  void tx_abort();
  /// tx_abort, then fail() with `why` and how many posted messages were lost.
  Status tx_abort_and_fail(Status why);

  // ---- the receive side, all under rx_mu_ (tcp_receive.cpp) ----

  /// Reads until rx_buf_ holds at least `need` unread bytes (need <= buffer size).
  Status fill(size_t need, Deadline deadline, const CancelToken& cancel);

  const int fd_;
  const std::string peer_;
  const Side side_;
  const std::string who_;  ///< "tcp <peer>": names this connection in wait verdicts
  const TcpSettings opt_;

  // TLS: set by use_tls() before the connection is handed out.
  bool tls_ = false;
  bool tx_user_tls_ = false, rx_user_tls_ = false;      ///< a direction's records made here
  std::string tls_path_;                                ///< for describe()
  std::vector<std::string> peer_names_;
  security::RecordSealer sealer_;  // under tx_mu_
  security::RecordOpener opener_;  // under rx_mu_
  std::vector<std::byte> tls_in_;  ///< received records not yet opened [tls_in_begin_, tls_in_end_)
  size_t tls_in_begin_ = 0, tls_in_end_ = 0;
  std::vector<std::byte> tls_plain_;  ///< an opened record's data the caller had no room for
  size_t tls_plain_begin_ = 0, tls_plain_end_ = 0;

  std::atomic<bool> broken_{false};
  std::mutex broken_mu_;
  std::string broken_why_;

  std::mutex tx_mu_;
  Ring tx_;
  std::deque<std::unique_ptr<TxMsg>> txq_;  ///< posted and not yet handed over, in order
  std::vector<std::unique_ptr<TxMsg>> tx_pool_;
  std::vector<std::pair<uint64_t, TxMsg*>> tx_notif_;  ///< zero-copy notifications awaited
  size_t tx_ops_ = 0;                                   ///< SENDMSGs of the chain in flight
  bool tx_chain_short_ = false, tx_chain_cancelled_ = false, tx_aborting_ = false;
  uint64_t tx_posted_ = 0, tx_done_ = 0;
  Status tx_err_;

  std::mutex rx_mu_;
  Ring rx_;
  std::vector<std::byte> rx_buf_;
  size_t rx_begin_ = 0, rx_end_ = 0;
  bool body_pending_ = false;
  uint64_t body_left_ = 0;
};

/// Connects to `address` ("host:port"), trying each address it resolves to in
/// turn until one accepts (a deadline or cancel stops the tries). Errors:
/// invalid_argument (bad address), unavailable (refused, unreachable), timed_out,
/// cancelled, io_error.
/// With `tls`, the TLS handshake follows the connect, by the same deadline (the
/// server's certificate must name the address's host, or TlsSettings::server_name):
/// permission_denied when a certificate is refused.
Result<std::unique_ptr<Connection>> connect_tcp(const std::string& address, const TcpSettings& opt, unsigned depth,
                                                std::shared_ptr<const security::TlsContext> tls, Deadline deadline,
                                                const CancelToken& cancel);

}  // namespace kvstream::transport::tcp
