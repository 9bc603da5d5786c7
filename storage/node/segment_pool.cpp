#include "storage/node/segment_pool.hpp"

#include <sys/mman.h>

namespace kvstream::storage {

SegmentPool::Buffer::~Buffer() {
  region = {};  // deregistered before its pages go
  if (data) ::munmap(data, size);
}

SegmentPool::SegmentPool(transport::Backend& backend, MemoryBudget& budget, size_t segment_bytes, size_t keep_idle)
    : backend_(backend), budget_(budget), segment_bytes_(segment_bytes), keep_idle_(keep_idle) {}

SegmentPool::~SegmentPool() = default;

SegmentPool::Segment::Segment(SegmentPool* p, std::unique_ptr<Buffer> b) : pool_(p), buffer_(std::move(b)) {}
SegmentPool::Segment& SegmentPool::Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    if (buffer_) pool_->give_back(std::move(buffer_));
    pool_ = o.pool_, buffer_ = std::move(o.buffer_);
  }
  return *this;
}
SegmentPool::Segment::~Segment() {
  if (buffer_) pool_->give_back(std::move(buffer_));
}
std::span<std::byte> SegmentPool::Segment::span(size_t n) const {
  return buffer_ ? std::span<std::byte>(buffer_->data, std::min(n, buffer_->size)) : std::span<std::byte>();
}

std::unique_ptr<SegmentPool::Buffer> SegmentPool::take_idle() {
  std::lock_guard lock(mu_);
  if (idle_.empty()) return nullptr;
  auto b = std::move(idle_.back());
  idle_.pop_back();
  return b;
}

Result<SegmentPool::Segment> SegmentPool::make(MemoryBudget::Lease lease) {
  auto b = std::make_unique<Buffer>();
  void* p = ::mmap(nullptr, segment_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return make_status(StatusCode::resource_exhausted, "no memory for a body segment");
  b->data = static_cast<std::byte*>(p), b->size = segment_bytes_;
  b->lease = std::move(lease);
  KVS_ASSIGN_OR_RETURN(b->region, backend_.register_memory(b->data, b->size, transport::MemoryType::host));
  return Segment(this, std::move(b));
}

Result<SegmentPool::Segment> SegmentPool::acquire() {
  if (auto b = take_idle()) return Segment(this, std::move(b));
  KVS_ASSIGN_OR_RETURN(auto lease, budget_.acquire(segment_bytes_));
  return make(std::move(lease));
}

SegmentPool::Segment SegmentPool::acquire_spare() {
  if (auto b = take_idle()) return Segment(this, std::move(b));
  auto lease = budget_.try_acquire(segment_bytes_, segment_bytes_);
  if (!lease) return {};
  auto s = make(std::move(*lease));
  return s.ok() ? std::move(s).value() : Segment();
}

void SegmentPool::give_back(std::unique_ptr<Buffer> b) {
  std::lock_guard lock(mu_);
  if (idle_.size() < keep_idle_) idle_.push_back(std::move(b));
  // else: deregistered, unmapped and its lease returned as `b` goes
}

}  // namespace kvstream::storage
