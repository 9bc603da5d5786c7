// Whether anything listens at a libfabric peer's address. RDM hides a refused
// connection: ofi_rxm answers every send to an address where nothing listens with
// EAGAIN and keeps retrying its connection, so a connect to a dead node waited for its
// whole deadline, and a client whose node was killed learned of it only when its
// liveness probes timed out (ofi_liveness.hpp), where the tcp and UCX backends fail
// at once. On providers whose endpoint names are TCP listeners (tcp, tcp;ofi_rxm,
// sockets) a plain TCP connect to the same address tells a port where nothing
// listens apart from a slow node.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <optional>
#include <string>

#include "kvstream/status.hpp"
#include "transport/common/wait.hpp"

namespace kvstream::transport::ofi {

/// How long a hello, or a liveness probe, may go unanswered before the client looks
/// for a listener. A live node on a LAN takes a hello in a millisecond or two (ofi_rxm's
/// TCP and CM handshakes: two round trips), so a healthy connect rarely checks; where
/// one does (a busy node, a long path), the check is one extra TCP connection that the
/// node's provider drops.
inline constexpr auto kListenerCheckAfter = std::chrono::milliseconds(100);

/// A check of one peer address.
class ListenerCheck {
 public:
  /// The check of `addr` (`len` bytes; `address` names it in errors) where `provider`
  /// (fi_info's prov_name) names endpoints by TCP listener addresses; none elsewhere
  /// (verbs;ofi_rxm listens through rdma_cm, shm by name).
  static std::optional<ListenerCheck> of(const std::string& provider, const void* addr, size_t len,
                                         std::string address);

  /// Connects a plain TCP socket to the address and closes it. unavailable where the
  /// connection is refused or the host or network is unreachable; ok where it
  /// connects, and where it cannot tell within kListenerCheckAfter or by `until` (a
  /// host that drops the SYN is left to the caller's own deadline).
  [[nodiscard]] Status operator()(Deadline until) const;

 private:
  ListenerCheck() = default;
  sockaddr_storage addr_{};
  socklen_t len_ = 0;
  std::string address_;
};

}  // namespace kvstream::transport::ofi
