// Closed shm endpoint names: see ofi_shm_names.hpp.
#include "transport/ofi/ofi_shm_names.hpp"

#include <mutex>
#include <unordered_set>

namespace kvstream::transport::ofi {
namespace {

constexpr std::string_view kByAddress = "fi_ns://";
constexpr std::string_view kByProcess = "fi_shm://";

struct ClosedNames {
  std::mutex mu;
  std::unordered_set<std::string> names;
};

ClosedNames& closed() {
  static auto* c = new ClosedNames();  // never destroyed: endpoints may close during static destruction
  return *c;
}

}  // namespace

std::string shm_list_name(std::string_view name) {
  name = name.substr(0, name.find('\0'));
  for (std::string_view prefix : {kByAddress, kByProcess})
    if (name.starts_with(prefix)) return std::string(name.substr(prefix.size()));
  return std::string(name);
}

void remember_closed_shm_name(std::string_view name) {
  if (!name.starts_with(kByAddress)) return;
  auto& c = closed();
  std::lock_guard lock(c.mu);
  c.names.insert(shm_list_name(name));
}

bool shm_name_was_closed(std::string_view name) {
  auto& c = closed();
  std::lock_guard lock(c.mu);
  return c.names.contains(shm_list_name(name));
}

}  // namespace kvstream::transport::ofi
