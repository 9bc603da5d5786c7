// Places for connections that have not yet proven a namespace, bounded in all and per
// source address, apart from the slots of authenticated tenants, so a flood of idle or
// slow unauthenticated sockets cannot lock tenants out. A newcomer always gets a place:
// a source at its limit gives up its own oldest one, and when every place is taken the
// source holding the most gives up its oldest. The connection that loses its place has
// its waits cancelled. A tenant's handshake takes one round trip, while a flood's
// sockets sit, so the oldest places are the flood's.
#pragma once

#include <cstdint>
#include <functional>
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

  /// A place for a connection from `source` (a host; empty when unknown: such
  /// connections count as one source) whose waits `cancel` ends if it is evicted.
  /// Errors: resource_exhausted only when the limits are 0.
  Result<Ticket> admit(const std::string& source, const transport::CancelToken& cancel);

  [[nodiscard]] uint64_t evicted() const;

 private:
  struct Place {
    uint64_t id;
    std::string source;
    transport::CancelToken cancel;
  };
  void release(uint64_t id) noexcept;
  void drop_locked(std::list<Place>::iterator it);
  // Closes the oldest place that `which` picks.
  void evict_first_locked(const std::function<bool(const Place&)>& which);
  const uint32_t max_total_, max_per_source_;
  mutable std::mutex mu_;
  std::list<Place> places_;  // oldest first
  std::map<std::string, uint32_t> per_source_;  // places per source; "" is every unknown one
  uint64_t next_id_ = 1, evicted_ = 0;
};

/// The host part of "host:port" or "[v6]:port" ("" when there is none).
std::string host_of(const std::string& address);

}  // namespace kvstream::storage
