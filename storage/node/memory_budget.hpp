// The storage node's one bound on memory held for requests: cached objects and body
// buffers in flight draw leases from it. When a buffer is wanted and the budget is
// full, the cache is asked to give room back first; what still does not fit is a
// resource_exhausted reply to that request, never an allocation that can kill the node.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>

#include "kvstream/status.hpp"

namespace kvstream::storage {

class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t limit) : limit_(limit) {}
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  /// Bytes held from the budget; returned when destroyed (move-only).
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept : budget_(std::exchange(o.budget_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
    Lease& operator=(Lease&& o) noexcept {
      if (this != &o) {
        reset();
        budget_ = std::exchange(o.budget_, nullptr), bytes_ = std::exchange(o.bytes_, 0);
      }
      return *this;
    }
    ~Lease() { reset(); }
    [[nodiscard]] uint64_t bytes() const { return bytes_; }
    void reset() noexcept {
      if (budget_) budget_->release(bytes_);
      budget_ = nullptr, bytes_ = 0;
    }

   private:
    friend class MemoryBudget;
    Lease(MemoryBudget* b, uint64_t n) : budget_(b), bytes_(n) {}
    MemoryBudget* budget_ = nullptr;
    uint64_t bytes_ = 0;
  };

  /// Takes `n` bytes, asking the reclaimer for room when the budget is short.
  /// Errors: resource_exhausted.
  Result<Lease> acquire(uint64_t n);
  /// Takes `n` bytes only when `leave` more would still be free afterwards, without
  /// asking the reclaimer and without counting a refusal: for a spare that speeds a
  /// transfer up but must cost no other request its room nor the cache its chunks.
  std::optional<Lease> try_acquire(uint64_t n, uint64_t leave);
  /// Who gives room back (the cache): called, without any lock of the budget held,
  /// with the number of bytes wanted.
  void set_reclaimer(std::function<void(uint64_t)> reclaim);

  [[nodiscard]] uint64_t limit() const { return limit_; }
  [[nodiscard]] uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  /// The most ever held at once (for the attack benchmark and tests).
  [[nodiscard]] uint64_t peak() const { return peak_.load(std::memory_order_relaxed); }
  /// Requests refused for want of room.
  [[nodiscard]] uint64_t refusals() const { return refusals_.load(std::memory_order_relaxed); }

 private:
  void release(uint64_t n) noexcept { used_.fetch_sub(n, std::memory_order_acq_rel); }
  bool take(uint64_t n, uint64_t leave = 0);  // n bytes, if `leave` more stay free
  const uint64_t limit_;
  std::atomic<uint64_t> used_{0}, peak_{0}, refusals_{0};
  std::mutex reclaim_mu_;
  std::function<void(uint64_t)> reclaim_;
};

}  // namespace kvstream::storage
