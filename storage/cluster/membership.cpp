// Node membership from a static list or a small file (one "host:port" per line), and
// the checks of a ClusterConfig that settle where its members come from.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "core/text.hpp"
#include "kvstream/cluster.hpp"
#include "kvstream/storage.hpp"

namespace kvstream::cluster {

namespace {

// "host:port" with a non-empty host of [A-Za-z0-9.-] (a name or IPv4) or a bracketed
// IPv6 address, and a port 1..65535.
Status check_address(std::string_view a) {
  const size_t colon = a.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == a.size())
    return make_status(StatusCode::invalid_argument, "not host:port");
  const std::string_view host = a.substr(0, colon), port = a.substr(colon + 1);
  const bool v6 = host.size() > 2 && host.front() == '[' && host.back() == ']';
  for (char c : v6 ? host.substr(1, host.size() - 2) : host) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || (v6 && c == ':');
    if (!ok) return make_status(StatusCode::invalid_argument, "host '{}' has a character '{}' that no host name has", host, c);
  }
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc() || end != port.data() + port.size())
    return make_status(StatusCode::invalid_argument, "port '{}' is not a number", port);
  if (value == 0 || value > 65535) return make_status(StatusCode::invalid_argument, "port {} is outside 1..65535", value);
  return {};
}

}  // namespace

Result<std::vector<std::string>> parse_membership(std::string_view text, std::string_view origin) {
  std::vector<std::string> out;
  std::set<std::string, std::less<>> seen;
  size_t line_no = 0;
  for (size_t pos = 0; pos <= text.size();) {
    ++line_no;
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (const size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    line = trim(line);
    if (line.empty()) continue;
    if (line.find_first_of(" \t") != std::string_view::npos)
      return make_status(StatusCode::invalid_argument, "{} line {}: '{}': one host:port per line, no blanks inside",
                         origin, line_no, line);
    if (Status s = check_address(line); !s.ok())
      return make_status(StatusCode::invalid_argument, "{} line {}: '{}': {}", origin, line_no, line, s.message());
    if (!seen.emplace(line).second)
      return make_status(StatusCode::invalid_argument, "{} line {}: '{}' is listed twice", origin, line_no, line);
    out.emplace_back(line);
  }
  if (out.empty()) return make_status(StatusCode::invalid_argument, "{} lists no storage node", origin);
  return out;
}

Result<std::vector<std::string>> load_membership(const std::string& path) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int e = errno;
    return make_status(e == ENOENT ? StatusCode::not_found : StatusCode::io_error, "membership file '{}': {}", path,
                       std::strerror(e ? e : EIO));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return make_status(StatusCode::io_error, "membership file '{}': read failed", path);
  return parse_membership(ss.str(), path);
}

Status check_cluster_config(ClusterConfig& cfg) {
  if (!cfg.etcd.endpoints.empty()) {
    if (!cfg.nodes.empty() || !cfg.membership_file.empty())
      return make_status(StatusCode::invalid_argument,
                         "cluster: membership comes from etcd or from a list, not both (nodes or membership_file set)");
  } else if (cfg.nodes.empty()) {
    if (cfg.membership_file.empty())
      return make_status(StatusCode::invalid_argument, "cluster: neither nodes, a membership file nor etcd given");
    KVS_ASSIGN_OR_RETURN(cfg.nodes, load_membership(cfg.membership_file));
  } else {
    std::string joined;
    for (const auto& n : cfg.nodes) joined += n + "\n";
    KVS_ASSIGN_OR_RETURN(cfg.nodes, parse_membership(joined, "cluster node list"));
  }
  if (cfg.replication == 0) return make_status(StatusCode::invalid_argument, "cluster: replication must be >= 1");
  if (cfg.write_quorum > cfg.replication)
    return make_status(StatusCode::invalid_argument, "cluster: write quorum {} above replication {}", cfg.write_quorum,
                       cfg.replication);
  if (!(cfg.ewma_weight > 0 && cfg.ewma_weight <= 1))
    return make_status(StatusCode::invalid_argument, "cluster: EWMA weight {} outside (0, 1]", cfg.ewma_weight);
  return storage::validate_id(cfg.name_space, storage::kMaxNamespaceBytes, "namespace");
}

}  // namespace kvstream::cluster
