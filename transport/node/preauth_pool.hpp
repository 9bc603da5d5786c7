// Places for connections that have not yet proven a namespace. They are few and
// bounded per source address, apart from the slots of authenticated tenants, so a
// flood of idle or slow unauthenticated sockets cannot lock tenants out: a source at
// its limit is refused at once, and when every place is taken a newcomer takes the
// place of the oldest, whose waits are cancelled (a tenant's own handshake takes a
// round trip; an idle socket has had longer).
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <string>

#include "kvstream/status.hpp"
#include "kvstream/transport.hpp"

namespace kvstream::storage {

class PreAuthPool {
 public:
  PreAuthPool(uint32_t max_total, uint32_t max_per_source) : max_total_(max_total), max_per_source_(max_per_source) {}

  /// Holds a place until released or destroyed (move-only).
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& o) noexcept : pool_(std::exchange(o.pool_, nullptr)), id_(o.id_) {}
    Ticket& operator=(Ticket&& o) noexcept {
      if (this != &o) release(), pool_ = std::exchange(o.pool_, nullptr), id_ = o.id_;
      return *this;
    }
    ~Ticket() { release(); }
    void release() noexcept {
      if (pool_) pool_->release(id_);
      pool_ = nullptr;
    }

   private:
    friend class PreAuthPool;
    Ticket(PreAuthPool* p, uint64_t id) : pool_(p), id_(id) {}
    PreAuthPool* pool_ = nullptr;
    uint64_t id_ = 0;
  };

  /// A place for a connection from `source` (a host; empty when unknown, which has
  /// no per-source bound) whose waits `cancel` ends if it is evicted. Errors:
  /// resource_exhausted (the source holds its limit).
  Result<Ticket> admit(const std::string& source, const transport::CancelToken& cancel);

  [[nodiscard]] uint64_t evicted() const;
  [[nodiscard]] uint32_t held() const;

 private:
  struct Place {
    uint64_t id;
    std::string source;
    transport::CancelToken cancel;
  };
  void release(uint64_t id) noexcept;
  void drop_locked(std::list<Place>::iterator it);
  const uint32_t max_total_, max_per_source_;
  mutable std::mutex mu_;
  std::list<Place> places_;  // oldest first
  std::map<std::string, uint32_t> per_source_;
  uint64_t next_id_ = 1, evicted_ = 0;
};

/// The host part of "host:port" or "[v6]:port" ("" when there is none).
std::string host_of(const std::string& address);

}  // namespace kvstream::storage
