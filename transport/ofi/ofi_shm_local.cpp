// This process's shm endpoints: see ofi_shm_local.hpp.
#include "transport/ofi/ofi_shm_local.hpp"

#include <unistd.h>

#include <rdma/fi_endpoint.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "core/log.hpp"

namespace kvstream::transport::ofi {
namespace {

constexpr std::string_view kByAddress = "fi_ns://";
constexpr std::string_view kByProcess = "fi_shm://";

struct Local {
  size_t holds = 0;
  std::optional<ShmEndpointObjects> parked;  // set: closed by its owner, held open for others
};

struct Registry {
  std::mutex mu;
  std::unordered_set<std::string> closed;        // names chosen by address, closed
  std::unordered_map<std::string, Local> local;  // live and parked endpoints, by list name
};

Registry& registry() {
  static auto* r = new Registry();  // never destroyed: endpoints may close during static destruction
  return *r;
}

void close_objects(const std::string& name, ShmEndpointObjects o) {
  // The order of Endpoint's own close: the endpoint, then its queue and vector.
  if (o.ep) fi_close(&o.ep->fid);
  if (o.cq) fi_close(&o.cq->fid);
  if (o.av) fi_close(&o.av->fid);
  KVS_LOG_DEBUG("libfabric: shm endpoint {} closed", name);
}

}  // namespace

std::string shm_list_name(std::string_view name) {
  name = name.substr(0, name.find('\0'));
  for (std::string_view prefix : {kByAddress, kByProcess})
    if (name.starts_with(prefix)) return std::string(name.substr(prefix.size()));
  return std::string(name);
}

bool shm_name_was_closed(std::string_view name) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  return r.closed.contains(shm_list_name(name));
}

bool shm_name_on_host(std::string_view name) {
  const std::string path = "/dev/shm/" + shm_list_name(name);
  return ::access(path.c_str(), F_OK) == 0;
}

void shm_endpoint_opened(std::string_view name) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  r.local[shm_list_name(name)] = Local{};
}

bool shm_hold(std::string_view name) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.local.find(shm_list_name(name));
  if (it == r.local.end() || it->second.parked) return false;
  ++it->second.holds;
  return true;
}

void shm_release(std::string_view name) {
  const std::string key = shm_list_name(name);
  std::optional<ShmEndpointObjects> to_close;
  {
    auto& r = registry();
    std::lock_guard lock(r.mu);
    auto it = r.local.find(key);
    if (it == r.local.end() || it->second.holds == 0) return;
    if (--it->second.holds > 0 || !it->second.parked) return;
    to_close = std::move(it->second.parked);
    r.local.erase(it);
  }
  if (to_close) close_objects(key, std::move(*to_close));  // outside the lock: the close may release more
}

void shm_endpoint_closing(std::string_view name, ShmEndpointObjects objects) {
  const std::string key = shm_list_name(name);
  {
    auto& r = registry();
    std::lock_guard lock(r.mu);
    if (name.starts_with(kByAddress)) r.closed.insert(key);
    auto it = r.local.find(key);
    if (it != r.local.end() && it->second.holds > 0) {
      it->second.parked = std::move(objects);
      KVS_LOG_DEBUG("libfabric: shm endpoint {} parked: {} holds in this process", key, it->second.holds);
      return;
    }
    if (it != r.local.end()) r.local.erase(it);
  }
  close_objects(key, std::move(objects));
}

size_t shm_endpoints_parked() {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  return size_t(std::count_if(r.local.begin(), r.local.end(), [](const auto& l) { return l.second.parked.has_value(); }));
}

}  // namespace kvstream::transport::ofi
