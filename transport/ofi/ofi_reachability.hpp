// Whether anything listens where a client is saying hello. RDM hides a refused
// connection: ofi_rxm answers every send to an address where nothing listens with
// EAGAIN and keeps retrying its connection, so a connect to a dead node waited for
// its whole deadline, where the tcp and UCX backends fail at once. On providers whose
// endpoint names are TCP listeners (tcp, tcp;ofi_rxm, sockets) a plain TCP connect
// to the same address tells a refused port apart from a slow node.
#pragma once

#include <rdma/fabric.h>

#include <chrono>
#include <string>

#include "kvstream/status.hpp"
#include "transport/common/wait.hpp"

namespace kvstream::transport::ofi {

/// How long a hello may wait to be taken before the client looks for a listener. A
/// live node on a LAN takes it in a millisecond or two (ofi_rxm's TCP and CM
/// handshakes: two round trips), so a healthy connect rarely checks; where one does
/// (a busy node, a long path), the check is one extra TCP connection that the node's
/// provider drops.
inline constexpr auto kListenerCheckAfter = std::chrono::milliseconds(100);

/// Whether `provider` (fi_info's prov_name) names its endpoints by TCP listener
/// addresses. verbs;ofi_rxm listens through rdma_cm and shm by name: neither.
bool listens_on_tcp(const std::string& provider);

/// Connects a plain TCP socket to `addr` (a sockaddr of `len` bytes) and closes it.
/// unavailable, naming `address`, where the connection is refused or the host or
/// network is unreachable; ok where it connects, and where it cannot tell by
/// `until` (a host that drops the SYN is left to the hello's own deadline).
Status check_listener(const void* addr, size_t len, const std::string& address, Deadline until);

}  // namespace kvstream::transport::ofi
