#include "storage/node/memory_budget.hpp"

namespace kvstream::storage {

bool MemoryBudget::take(uint64_t n, uint64_t leave) {
  if (leave > limit_ || n > limit_ - leave) return false;
  uint64_t cur = used_.load(std::memory_order_relaxed);
  do {
    if (cur > limit_ - n - leave) return false;
  } while (!used_.compare_exchange_weak(cur, cur + n, std::memory_order_acq_rel));
  uint64_t peak = peak_.load(std::memory_order_relaxed);
  while (cur + n > peak && !peak_.compare_exchange_weak(peak, cur + n, std::memory_order_relaxed)) {
  }
  return true;
}

Result<MemoryBudget::Lease> MemoryBudget::acquire(uint64_t n) {
  if (take(n)) return Lease(this, n);
  std::function<void(uint64_t)> reclaim;
  {
    std::lock_guard lock(reclaim_mu_);
    reclaim = reclaim_;
  }
  if (reclaim) {
    reclaim(n);
    if (take(n)) return Lease(this, n);
  }
  refusals_.fetch_add(1, std::memory_order_relaxed);
  return make_status(StatusCode::resource_exhausted, "the node's memory budget ({} bytes) is full", limit_);
}

std::optional<MemoryBudget::Lease> MemoryBudget::try_acquire(uint64_t n, uint64_t leave) {
  if (!take(n, leave)) return std::nullopt;
  return Lease(this, n);
}

void MemoryBudget::set_reclaimer(std::function<void(uint64_t)> reclaim) {
  std::lock_guard lock(reclaim_mu_);
  reclaim_ = std::move(reclaim);
}

}  // namespace kvstream::storage
