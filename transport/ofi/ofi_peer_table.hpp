// Which peers' addresses an endpoint's address vector holds, and who still uses each.
//
// An RDM endpoint reaches a peer through an entry in its address vector (fi_av_insert).
// libfabric leaves two duties to the application: insert an address once only (a
// duplicate insert is undefined behaviour; libfabric 1.17's util AV happens to count
// duplicates), and remove an entry (fi_av_remove) only when no operation in flight
// names it (also undefined). Before this table the listener inserted the address of
// every hello and every liveness question and never removed one, so a long-running
// node kept an entry (and, over ofi_rxm, a peer record) for every client endpoint that
// ever connected, and a peer could grow it without bound by asking questions under
// addresses it made up.
//
// The table only keeps the books; the endpoint makes the provider calls
// (Endpoint::peer inserts, Endpoint::remove_unused_peers removes). A connection holds a
// Use of its peer's entry, and so does every operation posted to or from that peer
// until the operation is destroyed; an entry nothing uses is handed to the endpoint
// for removal, and one wanted again before that is used again as it is.
#pragma once

#include <rdma/fabric.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvstream::transport::ofi {

class PeerTable : public std::enable_shared_from_this<PeerTable> {
 public:
  /// One counted use of an entry; copies count too. An empty Use names no entry
  /// (FI_ADDR_UNSPEC). It may outlive the endpoint: it refers to the table only.
  class Use {
   public:
    Use() = default;
    Use(const Use& other);
    Use& operator=(const Use& other);
    Use(Use&& other) noexcept;
    Use& operator=(Use&& other) noexcept;
    ~Use();

    [[nodiscard]] fi_addr_t addr() const { return addr_; }
    explicit operator bool() const { return table_ != nullptr; }

   private:
    friend class PeerTable;
    Use(std::shared_ptr<PeerTable> table, fi_addr_t addr) : table_(std::move(table)), addr_(addr) {}
    void reset();
    std::shared_ptr<PeerTable> table_;
    fi_addr_t addr_ = FI_ADDR_UNSPEC;
  };

  static std::shared_ptr<PeerTable> create() { return std::shared_ptr<PeerTable>(new PeerTable()); }

  /// A new use of the entry for the address `key` (its bytes), if the table has one:
  /// in use, or unused and not removed yet.
  std::optional<Use> find(const std::string& key);
  /// Records `addr` as the entry just inserted for `key`; returns its first use.
  Use add(std::string key, fi_addr_t addr);
  /// Another use of the entry `addr` (an operation posted to or from that peer); an
  /// empty Use where the table has no such entry (FI_ADDR_UNSPEC: anyone).
  Use hold(fi_addr_t addr);
  /// Takes the entries nothing uses out of the table: the caller removes them from
  /// the address vector.
  std::vector<fi_addr_t> take_unused();

  /// Entries the table holds, used or waiting for removal.
  [[nodiscard]] size_t size() const;
  /// Entries waiting for removal (read without the lock: a hint for the progress loop).
  [[nodiscard]] size_t unused() const { return unused_.load(std::memory_order_relaxed); }
  /// Uses of the entry `addr` (0 where there is none).
  [[nodiscard]] size_t uses(fi_addr_t addr) const;

 private:
  PeerTable() = default;
  void acquire_locked(fi_addr_t addr);  // mu_ held
  void release(fi_addr_t addr);

  struct Entry {
    std::string key;
    size_t users = 0;
  };
  mutable std::mutex mu_;  // a leaf: nothing else is locked while it is held
  std::unordered_map<fi_addr_t, Entry> by_addr_;
  std::unordered_map<std::string, fi_addr_t> by_key_;
  std::atomic<size_t> unused_{0};  // entries with no user
};

}  // namespace kvstream::transport::ofi
