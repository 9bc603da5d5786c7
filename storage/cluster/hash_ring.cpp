// Consistent-hash ring with virtual nodes (xxh3-64), see include/kvstream/cluster.hpp.
#include <algorithm>

#include <xxhash.h>

#include "kvstream/cluster.hpp"

namespace kvstream::cluster {

namespace {
uint64_t hash_of(std::string_view s) { return XXH3_64bits(s.data(), s.size()); }
}  // namespace

HashRing::HashRing(uint32_t virtual_nodes) : vnodes_(std::max<uint32_t>(1, virtual_nodes)) {}

Status HashRing::add(const std::string& address) {
  if (address.empty()) return make_status(StatusCode::invalid_argument, "empty node address");
  if (std::find(nodes_.begin(), nodes_.end(), address) != nodes_.end())
    return make_status(StatusCode::already_exists, "node {} is already on the ring", address);
  nodes_.push_back(address);
  rebuild();
  return {};
}

Status HashRing::remove(const std::string& address) {
  auto it = std::find(nodes_.begin(), nodes_.end(), address);
  if (it == nodes_.end()) return make_status(StatusCode::not_found, "node {} is not on the ring", address);
  nodes_.erase(it);
  rebuild();
  return {};
}

// A point's position depends only on its node's address and number, never on the
// other nodes, which is what keeps placements stable as membership changes. Ties
// (equal hashes) are broken by address so the order does not depend on insertion.
void HashRing::rebuild() {
  points_.clear();
  points_.reserve(nodes_.size() * vnodes_);
  std::string name;
  for (uint32_t n = 0; n < nodes_.size(); ++n)
    for (uint32_t i = 0; i < vnodes_; ++i) {
      name = fmt::format("{}#{}", nodes_[n], i);
      points_.emplace_back(hash_of(name), n);
    }
  std::sort(points_.begin(), points_.end(), [&](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first < b.first;
    return nodes_[a.second] < nodes_[b.second];
  });
}

std::vector<uint32_t> HashRing::replica_indexes(std::string_view key, uint32_t r) const {
  std::vector<uint32_t> out;
  const size_t want = std::min<size_t>(r, nodes_.size());
  if (want == 0) return out;
  out.reserve(want);
  const uint64_t h = hash_of(key);
  auto it = std::lower_bound(points_.begin(), points_.end(), h,
                             [](const std::pair<uint64_t, uint32_t>& p, uint64_t v) { return p.first < v; });
  size_t i = size_t(it - points_.begin());
  for (size_t step = 0; step < points_.size() && out.size() < want; ++step, ++i) {
    const uint32_t n = points_[i % points_.size()].second;
    if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  }
  return out;
}

std::vector<std::string> HashRing::replicas(std::string_view key, uint32_t r) const {
  std::vector<std::string> out;
  for (uint32_t i : replica_indexes(key, r)) out.push_back(nodes_[i]);
  return out;
}

std::string HashRing::chunk_key(std::string_view context, uint32_t chunk) { return fmt::format("{}/{}", context, chunk); }

}  // namespace kvstream::cluster
