#include "transport/common/address.hpp"

#include "kvstream/transport.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <charconv>
#include <cstring>

namespace kvstream::transport {

Status parse_host_port(const std::string& address, std::string& host, uint16_t& port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size())
    return make_status(StatusCode::invalid_argument, "address '{}' is not host:port", address);
  host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  unsigned value = 0;
  const char* b = address.data() + colon + 1;
  const char* e = address.data() + address.size();
  auto [ptr, ec] = std::from_chars(b, e, value);
  if (ec != std::errc() || ptr != e || value > 65535)
    return make_status(StatusCode::invalid_argument, "address '{}' has a bad port", address);
  port = uint16_t(value);
  return {};
}

Result<std::vector<sockaddr_storage>> resolve_address(std::string_view backend, const std::string& address,
                                                      bool passive) {
  std::string host;
  uint16_t port = 0;
  KVS_RETURN_IF_ERROR(parse_host_port(address, host, port));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  const std::string port_text = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port_text.c_str(), &hints, &res);
  if (rc != 0)
    return make_status(StatusCode::invalid_argument, "{}: cannot resolve '{}': {}", backend, address, gai_strerror(rc));
  std::vector<sockaddr_storage> out;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    if (ai->ai_addrlen > sizeof(sockaddr_storage)) continue;
    sockaddr_storage ss{};
    std::memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    out.push_back(ss);
  }
  freeaddrinfo(res);
  if (out.empty()) return make_status(StatusCode::invalid_argument, "{}: '{}' resolves to no address", backend, address);
  return out;
}

socklen_t sockaddr_len(const sockaddr_storage& ss) {
  return ss.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

bool is_loopback(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    if (IN6_IS_ADDR_LOOPBACK(&a->sin6_addr)) return true;
    return IN6_IS_ADDR_V4MAPPED(&a->sin6_addr) && a->sin6_addr.s6_addr[12] == 127;
  }
  return false;
}

bool is_loopback_address(const std::string& address) {
  auto resolved = resolve_address("tcp", address, true);
  if (!resolved.ok() || resolved->empty()) return false;
  for (const auto& a : *resolved)
    if (!is_loopback(a)) return false;
  return true;
}

std::string format_address(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf);
    return fmt::format("{}:{}", buf, ntohs(in->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof buf);
    return fmt::format("[{}]:{}", buf, ntohs(in6->sin6_port));
  }
  return "?";
}

}  // namespace kvstream::transport
