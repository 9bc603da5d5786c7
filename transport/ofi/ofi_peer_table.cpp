// The books of an endpoint's address vector: see ofi_peer_table.hpp.
#include "transport/ofi/ofi_peer_table.hpp"

#include <utility>

namespace kvstream::transport::ofi {

PeerTable::Use::Use(const Use& other) : table_(other.table_), addr_(other.addr_) {
  if (table_) {
    std::lock_guard lock(table_->mu_);
    table_->acquire_locked(addr_);
  }
}

PeerTable::Use& PeerTable::Use::operator=(const Use& other) {
  if (this != &other) *this = Use(other);
  return *this;
}

PeerTable::Use::Use(Use&& other) noexcept
    : table_(std::move(other.table_)), addr_(std::exchange(other.addr_, FI_ADDR_UNSPEC)) {}

PeerTable::Use& PeerTable::Use::operator=(Use&& other) noexcept {
  if (this != &other) {
    reset();
    table_ = std::move(other.table_);
    addr_ = std::exchange(other.addr_, FI_ADDR_UNSPEC);
  }
  return *this;
}

PeerTable::Use::~Use() { reset(); }

void PeerTable::Use::reset() {
  if (auto t = std::move(table_)) t->release(addr_);
  addr_ = FI_ADDR_UNSPEC;
}

void PeerTable::acquire_locked(fi_addr_t addr) {
  auto it = by_addr_.find(addr);
  if (it == by_addr_.end()) return;  // cannot happen while a Use of it lives
  if (it->second.users++ == 0) unused_.fetch_sub(1, std::memory_order_relaxed);
}

void PeerTable::release(fi_addr_t addr) {
  std::lock_guard lock(mu_);
  auto it = by_addr_.find(addr);
  if (it == by_addr_.end() || it->second.users == 0) return;
  if (--it->second.users == 0) unused_.fetch_add(1, std::memory_order_relaxed);
}

std::optional<PeerTable::Use> PeerTable::find(const std::string& key) {
  std::lock_guard lock(mu_);
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return std::nullopt;
  acquire_locked(it->second);
  return Use(shared_from_this(), it->second);
}

PeerTable::Use PeerTable::add(std::string key, fi_addr_t addr) {
  std::lock_guard lock(mu_);
  by_key_[key] = addr;
  by_addr_[addr] = Entry{std::move(key), 1};
  return Use(shared_from_this(), addr);
}

PeerTable::Use PeerTable::hold(fi_addr_t addr) {
  if (addr == FI_ADDR_UNSPEC) return {};
  std::lock_guard lock(mu_);
  if (!by_addr_.contains(addr)) return {};
  acquire_locked(addr);
  return Use(shared_from_this(), addr);
}

std::vector<fi_addr_t> PeerTable::take_unused() {
  std::vector<fi_addr_t> out;
  std::lock_guard lock(mu_);
  for (auto it = by_addr_.begin(); it != by_addr_.end();) {
    if (it->second.users == 0) {
      out.push_back(it->first);
      by_key_.erase(it->second.key);
      it = by_addr_.erase(it);
    } else {
      ++it;
    }
  }
  unused_.fetch_sub(out.size(), std::memory_order_relaxed);
  return out;
}

size_t PeerTable::size() const {
  std::lock_guard lock(mu_);
  return by_addr_.size();
}

size_t PeerTable::uses(fi_addr_t addr) const {
  std::lock_guard lock(mu_);
  auto it = by_addr_.find(addr);
  return it == by_addr_.end() ? 0 : it->second.users;
}

}  // namespace kvstream::transport::ofi
