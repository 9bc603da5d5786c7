// ChunkStore's share of the namespace quotas (namespace_quota.hpp): a put's claim on
// its namespace's room, held from begin_put until the commit stores it or the put is
// dropped, and the counts the node reports.
#include "storage/node/chunk_store.hpp"

namespace kvstream::storage {

ChunkStore::QuotaClaim& ChunkStore::QuotaClaim::operator=(QuotaClaim&& o) noexcept {
  if (this != &o) {
    QuotaClaim gone(std::move(*this));
    store_ = std::exchange(o.store_, nullptr);
    ns_ = std::move(o.ns_);
    bytes_ = o.bytes_;
  }
  return *this;
}

ChunkStore::QuotaClaim::~QuotaClaim() {
  if (!store_) return;
  std::lock_guard lock(store_->mu_);
  store_->end_claim_locked(*this);
}

void ChunkStore::end_claim_locked(QuotaClaim& claim) {
  if (!claim.store_) return;
  quota_.release(claim.ns_, claim.bytes_);
  claim.store_ = nullptr;
}

void ChunkStore::set_quotas(QuotaLimits limits) {
  std::lock_guard lock(mu_);
  quota_.set_limits(std::move(limits));
}

uint64_t ChunkStore::namespace_bytes(const std::string& ns) const {
  std::lock_guard lock(mu_);
  return quota_.used(ns);
}

std::vector<Server::NamespaceUsage> ChunkStore::namespace_usage(const std::vector<std::string>& names) const {
  std::lock_guard lock(mu_);
  return quota_.usage(names);
}

uint64_t ChunkStore::quota_refusals() const {
  std::lock_guard lock(mu_);
  return quota_.refusals();
}

}  // namespace kvstream::storage
