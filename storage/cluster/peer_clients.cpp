// A rebalance's connections to the other nodes (peer_clients.hpp).
#include "storage/cluster/peer_clients.hpp"

#include <algorithm>

#include "core/log.hpp"

namespace kvstream::cluster {

using namespace std::chrono_literals;
using transport::Clock;

storage::Client* PeerClients::get(const std::string& ns, const std::string& node) {
  const auto key = std::make_pair(ns, node);
  if (auto it = clients_.find(key); it != clients_.end()) return it->second.get();
  if (unreachable_.contains(key)) return nullptr;
  if (!backend_) {
    auto b = transport::create_backend(backend_config_);
    if (!b.ok()) {
      KVS_LOG_WARN("rebalance: node {} cannot make its {} backend ({}); its objects wait for the next pass", self_,
                   backend_config_.name, b.status().to_string());
      unreachable_.insert(key);
      return nullptr;
    }
    backend_ = std::move(b).value();
  }
  const auto secret = secrets_.find(ns);
  if (secret == secrets_.end()) {  // the node's own namespaces only: a bug if reached
    unreachable_.insert(key);
    return nullptr;
  }
  storage::ClientConfig cc;
  cc.address = node, cc.name_space = ns, cc.secret = secret->second;
  auto c = storage::Client::connect(cc, backend_, Clock::now() + 2s, stop_);
  if (!c.ok()) {
    KVS_LOG_WARN("rebalance: node {} cannot reach {} for '{}' ({}); its objects wait for the next pass", self_, node,
                 ns, c.status().to_string());
    unreachable_.insert(key);
    return nullptr;
  }
  return (clients_[key] = std::move(c).value()).get();
}

void PeerClients::drop(const std::string& ns, const std::string& node) {
  const auto key = std::make_pair(ns, node);
  clients_.erase(key);
  unreachable_.insert(key);
}

Status PeerClients::send(const storage::ObjectKey& key, const storage::ChunkStore::StoredObject& obj,
                         const std::string& node) {
  storage::Client* c = get(key.ns, node);
  if (!c) return Status(StatusCode::unavailable, "unreachable");
  const Status s = c->put_parts(key.ctx, key.chunk, key.level, obj.bytes, obj.parts, std::max<uint64_t>(obj.version, 1),
                                Clock::now() + 30s, stop_);
  if (s.code() == StatusCode::unavailable || s.code() == StatusCode::timed_out) drop(key.ns, node);
  return s;
}

}  // namespace kvstream::cluster
