// A storage node's logins (server_impl.hpp): the challenge-response over a
// namespace's secret or a client certificate's names, and the node's and each
// namespace's bound on connections held.
#include <algorithm>

#include "core/log.hpp"
#include "storage/node/server_impl.hpp"

namespace kvstream::storage {

using transport::CancelToken;
using transport::Connection;
using transport::deadline_in;
using transport::Deadline;

Result<ServerImpl::Login> ServerImpl::authenticate(Connection& c, const CancelToken& cancel,
                                                   PreAuthPool::Ticket& ticket) {
  const Deadline deadline = deadline_in(cfg_.auth_timeout);
  KVS_ASSIGN_OR_RETURN(auto nonce, make_nonce());
  Response hello;
  hello.op = Op::hello;
  hello.nonce = nonce;
  hello.features = kFeatureUsage | kFeatureVersions | kFeatureRemoveUpTo | kFeatureIdWindow | kFeatureRemoveBatch |
                   kFeatureServedOnly | kFeatureMembersCheck;
  KVS_RETURN_IF_ERROR(reply(c, hello, deadline, cancel));
  std::vector<std::byte> header;
  KVS_ASSIGN_OR_RETURN(size_t body, c.recv_header(header, deadline, cancel));
  if (body != 0) return detail::unlogged_status(StatusCode::corrupt_data, "authentication message with a body");
  KVS_ASSIGN_OR_RETURN(Request req, decode_request(header));
  Response r;
  r.op = Op::auth;
  r.id = req.id;
  const auto it = cfg_.secrets.find(req.name_space);
  const auto names = cfg_.tls_clients.find(req.name_space);
  const bool known = it != cfg_.secrets.end() || names != cfg_.tls_clients.end();
  // Compute a MAC even for unknown namespaces so timing does not reveal which exist.
  const auto want = auth_mac(it == cfg_.secrets.end() ? std::string(32, '\0') : it->second, nonce, req.name_space);
  const bool secret_ok = it == cfg_.secrets.end() || mac_equal(want, req.mac);
  const bool cert_ok = names == cfg_.tls_clients.end() || certificate_names_one_of(c, names->second);
  if (req.op != Op::auth || !known || !secret_ok || !cert_ok) {
    ++auth_failures_;
    r.code = StatusCode::permission_denied;
    r.message = "authentication failed";
    (void)reply(c, r, deadline, cancel);
    return detail::unlogged_status(StatusCode::permission_denied, "authentication failed from {}", c.describe());
  }
  {
    std::lock_guard lock(mu_);
    uint32_t& held = per_namespace_[req.name_space];
    std::string refusal;
    if (authenticated_ >= cfg_.max_connections)
      refusal = fmt::format("the node holds {} connections, the limit", authenticated_);
    else if (held >= cfg_.max_connections_per_namespace)
      refusal = fmt::format("namespace holds {} connections, the limit", held);
    if (!refusal.empty()) {
      ++refused_;
      r.code = StatusCode::resource_exhausted;
      r.message = refusal;
      (void)reply(c, r, deadline, cancel);
      return detail::unlogged_status(StatusCode::resource_exhausted, "refusing {} for '{}': {}", c.describe(),
                                     req.name_space, refusal);
    }
    ++held, ++authenticated_;
  }
  ticket.release();
  if (Status s = reply(c, r, deadline, cancel); !s.ok()) {
    release_namespace(req.name_space);
    return s;
  }
  return Login{req.name_space, first_request_id(nonce)};
}

Status ServerImpl::check_tls_clients(const ServerConfig& cfg) {
  if (cfg.tls_clients.empty()) return {};
  for (const auto& [ns, names] : cfg.tls_clients) {
    KVS_RETURN_IF_ERROR(validate_id(ns, kMaxNamespaceBytes, "namespace"));
    if (names.empty())
      return make_status(StatusCode::invalid_argument, "tls_clients of namespace '{}' lists no certificate name",
                         ns);
    if (!cfg.membership.etcd.endpoints.empty() && !cfg.secrets.count(ns))
      return make_status(StatusCode::invalid_argument,
                         "namespace '{}' has no secret: a node of an etcd cluster logs into other nodes with its "
                         "namespaces' secrets to rebalance them",
                         ns);
  }
  const auto& tls = cfg.backend.tcp.tls;
  if (cfg.backend.name != "tcp" || !tls.enabled || tls.ca_file.empty())
    return make_status(StatusCode::invalid_argument,
                       "tls_clients needs the tcp backend with TLS on and tcp.tls.ca_file (the authorities that "
                       "sign client certificates)");
  return {};
}

bool ServerImpl::certificate_names_one_of(const Connection& c, const std::vector<std::string>& allowed) {
  for (const auto& n : c.peer_certificate_names())
    if (std::find(allowed.begin(), allowed.end(), n) != allowed.end()) return true;
  return false;
}

void ServerImpl::release_namespace(const std::string& ns) {
  std::lock_guard lock(mu_);
  if (auto it = per_namespace_.find(ns); it != per_namespace_.end() && it->second > 0) --it->second;
  if (authenticated_ > 0) --authenticated_;
}

}  // namespace kvstream::storage
