// Socket addresses as the backends take them: "host:port" text in, resolved socket
// addresses out, and back to text for logs and per-peer limits.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvstream/status.hpp"

namespace kvstream::transport {

/// Splits "host:port" (a bracketed IPv6 host loses its brackets); the port must be
/// 0..65535. Errors: invalid_argument.
Status parse_host_port(const std::string& address, std::string& host, uint16_t& port);

/// Every stream-socket address "host:port" resolves to, in resolver order; `passive`
/// for a listener (an empty host then means every interface). `backend` names the
/// caller in errors. Errors: invalid_argument (bad text, unknown host, no address).
Result<std::vector<sockaddr_storage>> resolve_address(std::string_view backend, const std::string& address,
                                                      bool passive);

/// The length of the address held in `ss` (IPv4 or IPv6).
socklen_t sockaddr_len(const sockaddr_storage& ss);

/// Whether `ss` is a loopback address (127/8, ::1, or IPv4-mapped 127/8).
bool is_loopback(const sockaddr_storage& ss);

/// "1.2.3.4:5" or "[::1]:5"; "?" for other families.
std::string format_address(const sockaddr* sa);
inline std::string format_address(const sockaddr_storage& ss) { return format_address(reinterpret_cast<const sockaddr*>(&ss)); }

}  // namespace kvstream::transport
