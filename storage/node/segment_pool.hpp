// Registered buffers of one protocol segment each, for put and get bodies in flight.
// Each is a lease on the node's memory budget; a few idle ones are kept (registration
// is not free on UCX and libfabric), the rest go back to the budget and the system.
#pragma once

#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "kvstream/transport.hpp"
#include "storage/node/memory_budget.hpp"

namespace kvstream::storage {

class SegmentPool {
 public:
  /// `segment_bytes` per buffer; at most `keep_idle` idle buffers are kept.
  SegmentPool(transport::Backend& backend, MemoryBudget& budget, size_t segment_bytes, size_t keep_idle = 8);
  ~SegmentPool();

  // Anonymous pages of their own, so a buffer's memory is returned to the system when
  // it goes (the node's resident size follows its budget, not the allocator's heap).
  struct Buffer {
    std::byte* data = nullptr;
    size_t size = 0;
    transport::MemoryRegion region;
    MemoryBudget::Lease lease;
    ~Buffer();
  };
  /// One buffer, returned to the pool when destroyed (move-only).
  class Segment {
   public:
    Segment() = default;
    Segment(Segment&&) noexcept = default;
    Segment& operator=(Segment&& o) noexcept;
    ~Segment();
    /// The first `n` bytes (registered), n <= the segment size.
    [[nodiscard]] std::span<std::byte> span(size_t n) const;
    [[nodiscard]] bool valid() const { return buffer_ != nullptr; }

   private:
    friend class SegmentPool;
    Segment(SegmentPool* p, std::unique_ptr<Buffer> b);
    SegmentPool* pool_ = nullptr;
    std::unique_ptr<Buffer> buffer_;
  };

  /// A buffer from the idle ones or a new one. Errors: resource_exhausted (the budget
  /// has no room or the system no memory), the backend's registration errors.
  Result<Segment> acquire();
  /// A second buffer for a transfer that can use one (a put's next segment landing
  /// while the last is written): an idle one, or a new one only while the budget
  /// would keep room for another segment besides (MemoryBudget::try_acquire). Invalid
  /// when there is none; never an error.
  Segment acquire_spare();

 private:
  std::unique_ptr<Buffer> take_idle();  // null when none is idle
  Result<Segment> make(MemoryBudget::Lease lease);  // a new buffer under `lease`
  void give_back(std::unique_ptr<Buffer> b);
  transport::Backend& backend_;
  MemoryBudget& budget_;
  const size_t segment_bytes_, keep_idle_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Buffer>> idle_;
};

}  // namespace kvstream::storage
