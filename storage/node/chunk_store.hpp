// The storage node's store: one file per (namespace, context, chunk, level) under a
// directory, an in-memory index rebuilt from the directory at start, and an LRU cache
// of hot objects inside the node's memory budget.
//
// Write order (docs/protocol.md, "Writes"): a put streams into its own temporary file
// under <dir>/.tmp, is checked against the checksum the client declared, fsynced, and
// committed by a rename under its context's lock, then the context directory is
// fsynced. Commits of one object are serialized; the last one to commit wins, and a
// put is acknowledged only after its commit, so every get returns exactly one
// committed version in full. Each put carries a write version: a commit whose version
// is not above the stored one is refused (already_exists: the put lost to a newer
// write), so writers that reach several replicas in different orders leave them all
// with the same, newest version. The cache is dropped at each commit and filled only
// with the version the disk holds.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvstream/storage.hpp"
#include "storage/node/dir_lock.hpp"
#include "storage/node/member_mark.hpp"
#include "storage/node/memory_budget.hpp"
#include "storage/node/namespace_quota.hpp"
#include "storage/node/object_file.hpp"
#include "storage/node/tombstones.hpp"
#include "storage/node/use_mark.hpp"
#include "storage/protocol.hpp"
#include "security/key_ring.hpp"

namespace kvstream::storage {

/// Which object: a tenant's (context, chunk, level).
struct ObjectKey {
  std::string ns, ctx;
  uint32_t chunk = 0, level = 0;
  /// "ns/ctx/c<chunk>.l<level>": what the object header binds and errors name.
  [[nodiscard]] std::string name() const;
};

/// An object's bytes in memory, and the budget they are held under.
struct Blob {
  std::vector<std::byte> data;
  uint64_t checksum = 0;
  MemoryBudget::Lease lease;
  /// The transport's registration of `data`, made by the first get that sends it and
  /// kept while the object lives (in the cache), so a hot object is not registered
  /// again per get (a memory map and unmap each on UCX and libfabric).
  mutable std::mutex region_mu;
  mutable transport::MemoryRegion region;
};
using Bytes = std::shared_ptr<const Blob>;

/// What a get found: the whole object in memory (`bytes`, its checksum verified when it
/// was read), or an open version of it to stream in pieces (`file`; its checksum is
/// verified as it streams).
struct ObjectRead {
  Bytes bytes;
  ObjectFile file;
  uint64_t size = 0;
  uint64_t checksum = 0;
  bool cache_hit = false;
};

class ChunkStore {
 public:
  /// Opens (creating) `directory`: takes its lock, removes temporary files of
  /// interrupted writes, indexes the objects whose headers verify and moves the others
  /// to <dir>/.quarantine. Cached objects draw from `budget` (which must outlive the
  /// store) up to `cache_bytes`. With `keys`, writes are sealed (see set_keys); sealed
  /// objects whose key `keys` lacks are indexed all the same (their structure
  /// verified), not moved aside. Errors: already_exists (another node holds the
  /// directory), io_error.
  static Result<std::unique_ptr<ChunkStore>> open(const std::string& directory, uint64_t cache_bytes,
                                                  MemoryBudget& budget,
                                                  std::shared_ptr<const security::KeyRing> keys = nullptr);
  ~ChunkStore();

  /// The keys of encryption at rest, swapped at once (rotation: a reloaded key file).
  /// Puts that begin afterwards are sealed under keys->current_id(); a put under way
  /// keeps the key it began with. Null: new writes in clear (sealed objects stay
  /// sealed, and unreadable).
  void set_keys(std::shared_ptr<const security::KeyRing> keys);
  [[nodiscard]] std::shared_ptr<const security::KeyRing> keys() const;
  /// Objects not under the current key: sealed under another key (or at all, without
  /// keys), or in clear while there are keys. What reencrypt() would rewrite.
  [[nodiscard]] uint64_t objects_under_old_keys() const;

  struct ReencryptOptions {
    uint64_t bytes_per_second = 0;  ///< payload read and rewritten per second; 0: unpaced
    transport::CancelToken cancel;  ///< ends the pass between pieces of an object
    /// Where given, counts each object as it is committed, before objects_under_old_keys()
    /// drops: a reader of both never sees an object gone from one and not yet in the other.
    std::atomic<uint64_t>* committed = nullptr;
  };
  /// One pass over the index: every object not under the current key is read, verified
  /// and rewritten under it with its write version and parts table, committed only if
  /// the index still names the version that was read (a newer write or a remove
  /// meanwhile wins; it is under the current key already). Objects whose key the ring
  /// lacks are left as they are. Damaged ones are moved aside as a get would. Errors:
  /// invalid_argument (no keys).
  Result<ReencryptReport> reencrypt(const ReencryptOptions& options);

  /// Bytes each namespace may keep on disk (none bound by default): each object's
  /// file, header and seal tags included, rounded up to the file system's allocation
  /// unit. Puts that begin afterwards are checked against them; what is stored stays,
  /// over a lowered quota.
  void set_quotas(QuotaLimits limits);
  /// What an object's file takes on disk, as the namespace quotas count it: its header
  /// (with `parts` parts) and `length` payload bytes (sealed: a tag per block), rounded
  /// up to the file system's allocation unit. A tenant of tiny objects would otherwise
  /// keep a block (and an inode) per object against a few payload bytes: 4096x its quota.
  [[nodiscard]] uint64_t disk_charge(uint64_t length, size_t parts, bool sealed) const;
  /// What a context takes on disk beside its objects, as the quotas count it: two
  /// allocation units, its directory and its use mark file (whether it has one yet or
  /// not). Without it a tenant of one tiny object per context keeps twice its quota.
  [[nodiscard]] uint64_t context_charge() const { return 2 * alloc_unit_; }
  /// Bytes `ns` holds on disk, as its quota counts them.
  [[nodiscard]] uint64_t namespace_bytes(const std::string& ns) const;
  /// Puts refused for their namespace's quota since the store opened.
  [[nodiscard]] uint64_t quota_refusals() const;
  /// NamespaceQuota::usage, under the index lock.
  [[nodiscard]] std::vector<Server::NamespaceUsage> namespace_usage(const std::vector<std::string>& names) const;

  // A put's claim on its namespace's quota (NamespaceQuota::reserve): ended by the
  // commit, in the step that counts the bytes, or given back when the put is dropped.
 private:
  class QuotaClaim {
   public:
    QuotaClaim() = default;
    QuotaClaim(ChunkStore* store, std::string ns, uint64_t bytes) : store_(store), ns_(std::move(ns)), bytes_(bytes) {}
    QuotaClaim(QuotaClaim&& o) noexcept
        : store_(std::exchange(o.store_, nullptr)), ns_(std::move(o.ns_)), bytes_(o.bytes_) {}
    QuotaClaim& operator=(QuotaClaim&& o) noexcept;
    ~QuotaClaim();

   private:
    friend class ChunkStore;
    ChunkStore* store_ = nullptr;  // null: nothing claimed (or already ended)
    std::string ns_;
    uint64_t bytes_ = 0;
  };
  /// Ends `claim` (its bytes leave the namespace's reserved count). Requires mu_.
  void end_claim_locked(QuotaClaim& claim);

 public:
  /// A put under way: its bytes go straight to a temporary file. It holds a claim on
  /// its namespace's quota, so it must end (commit or drop) before its store does.
  class PendingPut {
   public:
    Status append(std::span<const std::byte> bytes) { return tmp_.append(bytes); }
    [[nodiscard]] const ObjectKey& key() const { return key_; }

   private:
    friend class ChunkStore;
    ObjectKey key_;
    TempObject tmp_;
    uint64_t version_ = 0;
    QuotaClaim claim_;
  };
  /// Starts a put of `length` bytes at write `version` (0: unversioned, newer than
  /// whatever is stored) with its parts table (kept in the object's header: the
  /// commit's rename replaces bytes and parts at once). Errors: invalid_argument (ids,
  /// parts), out_of_range, io_error, no_space (disk full, or the namespace's
  /// quota: nothing stored changes).
  Result<PendingPut> begin_put(ObjectKey key, uint64_t length, uint64_t version = 0,
                               std::vector<ObjectPart> parts = {});
  /// Verifies the payload against `checksum`, makes it durable and visible. Errors:
  /// already_exists (the stored version is as new or newer, or a remove of the
  /// context covered this version: nothing changed),
  /// corrupt_data (checksum or length), io_error, no_space.
  Status commit(PendingPut&& put, uint64_t checksum);
  /// begin_put + append + commit of a whole body.
  Status put(const ObjectKey& key, std::span<const std::byte> bytes, uint64_t version = 0,
             std::vector<ObjectPart> parts = {});

  /// The object: from the cache, read whole into the budget (and cached when it fits),
  /// or open to stream. Errors: not_found, corrupt_data (the object is then moved
  /// aside and leaves the index), io_error.
  Result<ObjectRead> get(const ObjectKey& key);
  /// Reads the whole object into memory, checksum verified (tests and tools).
  Result<std::vector<std::byte>> read_all(const ObjectKey& key);
  /// One stored write as it was made: its bytes, write version and parts table, all
  /// from one version of the file (the rebalance copies objects to new owners with
  /// their version, so a newer write elsewhere still wins). Checksum verified.
  struct StoredObject {
    std::vector<std::byte> bytes;
    uint64_t version = 0;
    std::vector<ObjectPart> parts;
  };
  /// Errors: not_found, corrupt_data (moved aside), io_error.
  Result<StoredObject> read_stored(const ObjectKey& key);
  /// A streamed read of `file` failed its checksum: the object is moved aside (if
  /// the name still holds that version) and leaves the index.
  void report_corrupt(const ObjectKey& key, const ObjectFile& file);

  /// Every chunk of a context: its level sizes and parts tables, from the index (which
  /// each commit updates with the file it renamed into place); with `hide_fenced`,
  /// without the objects behind the fence (fence_held_at_open, rejoin). Errors: not_found.
  Result<std::vector<ChunkStat>> stat(const std::string& ns, const std::string& ctx, bool hide_fenced = false);

  /// Puts the objects the store held when it opened (or when rejoin() last ran) behind
  /// a fence: get() answers not_found for them and a stat that hides fenced objects
  /// leaves them out, until lift_fence() (their rewrite under a new at-rest key keeps
  /// them there). Writes since are served. A node that comes back into a cluster serves
  /// nothing it held before until its members have handed it the removes made while it
  /// was away (they report their rebalance done), so a removed context is not read from
  /// its copy meanwhile. read_stored() and read_all() see everything.
  void fence_held_at_open();
  void lift_fence();
  /// Whether objects held when the fence went up are behind it now.
  [[nodiscard]] bool fenced() const;
  /// The namespaces of the objects behind the fence whose removes a member may have
  /// forgotten since this node was last a member (come_back: its mark; rejoin: its
  /// last renewal): those whose horizon in `horizons` (per namespace, the latest time
  /// before which some member may have forgotten a remove: Tombstones::complete_since,
  /// from their reports) is later. None when nothing is fenced or that time is unknown.
  [[nodiscard]] std::vector<std::string> forgotten_namespaces(
      const std::map<std::string, std::chrono::system_clock::time_point>& horizons) const;
  /// The contexts of `ns` with objects behind the fence.
  [[nodiscard]] std::vector<std::string> held_contexts(const std::string& ns) const;
  /// Every remove of `ns` recorded after this time is remembered here (what a
  /// rebalance report says of this node; Tombstones::complete_since).
  [[nodiscard]] std::optional<std::chrono::system_clock::time_point> removes_complete_since(const std::string& ns) {
    return tombstones_.complete_since(ns);
  }
  /// Gets answered not_found for the fence since the store opened.
  [[nodiscard]] uint64_t fenced_gets() const { return fenced_gets_.load(std::memory_order_relaxed); }
  /// When the store was last served by a member of a cluster, as its mark said at
  /// open (member_mark.hpp); nullopt where it had none.
  [[nodiscard]] std::optional<std::chrono::system_clock::time_point> member_at_open() const { return member_at_open_; }
  /// Records `now` as a time the node was a member (its lease renewed), in the mark;
  /// written at most once per kMemberMarkEvery (less where removes are remembered for
  /// less: set_tombstone_limits). Errors: io_error.
  Status note_member(std::chrono::system_clock::time_point now);
  static constexpr std::chrono::seconds kMemberMarkEvery{60};
  /// Deletes every object the store held when the fence last went up (its open, or
  /// rejoin()) and holds unchanged (a write since, of the same object, stays): for a
  /// node back in its cluster after longer than removes are remembered
  /// (member_mark.hpp); with `which`, only the contexts it picks. Returns how many
  /// went. Errors: io_error (those before the failing one are gone).
  Result<uint64_t> drop_held(const std::function<bool(const std::string& ns, const std::string& ctx)>& which = {});
  /// A node starting in a cluster: where its mark says it was last a member longer
  /// than `remove_memory` before `now` (and that is not 0), drop_held(), as the members
  /// may have forgotten removes made meanwhile; else fence_held_at_open(). Returns how
  /// many objects went. Errors: those of drop_held.
  Result<uint64_t> come_back(std::chrono::seconds remove_memory, std::chrono::system_clock::time_point now);
  /// The same for a running node about to register again after its cluster dropped it
  /// (its lease ran out: cut off from etcd, or stalled), `away` after it was last known
  /// a member: every object it holds now counts as held, and goes where `away` is
  /// longer than the removes are remembered (set_tombstone_limits; not 0), else waits
  /// behind the fence. Call it before the node is a member again. Errors: those of
  /// drop_held (the objects are fenced all the same).
  Result<uint64_t> rejoin(std::chrono::seconds away);
  /// Deletes a context's objects written at or before `max_version` (all of them by
  /// default); the context, and its use mark, go with its last object, while a newer
  /// write stays with them (it wins over the remove, as over an older put). The
  /// remove is remembered (tombstones.hpp, synced to the store's `.removes` file
  /// first): at `max_version`, or by default at the newest write it deletes, and
  /// whether the context was here or not, so a copy at or below it that comes later is
  /// refused. Errors: not_found (nothing was deleted), io_error.
  Status remove(const std::string& ns, const std::string& ctx,
                uint64_t max_version = std::numeric_limits<uint64_t>::max());
  /// remove(ns, context, version) of each of `removes`, all remembered first with one
  /// sync (a context not stored is no error here). Errors: invalid_argument (ids, a
  /// version 0), io_error (the removes before the failing one are done).
  Status remove_many(const std::string& ns, std::span<const ContextRemove> removes);
  /// The file of remembered removes in the store's directory (tombstone_log.hpp).
  static constexpr const char* kRemovesFile = ".removes";
  /// The version up to which a remembered remove covered `ctx` (0: none).
  [[nodiscard]] uint64_t removed_up_to(const std::string& ns, const std::string& ctx) {
    return tombstones_.removed_up_to(ns, ctx);
  }
  /// The remembered removes of `ns`: context and version (what a rebalance hands to
  /// nodes that join).
  [[nodiscard]] std::vector<std::pair<std::string, uint64_t>> removed(const std::string& ns) {
    return tombstones_.list(ns);
  }
  /// How many removes are remembered, and for how long (Tombstones::Limits).
  [[nodiscard]] size_t removes_remembered() { return tombstones_.size(); }
  /// Also sets how often the member mark is written: an eighth of the memory, at
  /// most kMemberMarkEvery, at least every second.
  void set_tombstone_limits(Tombstones::Limits limits);
  /// Deletes one object if its write version is at most `max_version` (the version
  /// the caller found elsewhere: a newer write since then wins and stays). The
  /// context, and its use mark, go with its last object. Returns the payload bytes
  /// freed. Errors: not_found, already_exists (a newer write is stored: nothing
  /// changed), io_error.
  Result<uint64_t> remove_object(const ObjectKey& key, uint64_t max_version);
  /// The contexts of `ns`; with `hide_fenced` (what a client is answered) only those
  /// with an object not behind the fence.
  std::vector<std::string> list(const std::string& ns, bool hide_fenced = false);

  /// Raises the use mark of each of `touches` stored in `ns` to `stamp` (a context
  /// keeps the highest stamp it was given, with the depth given with it; an equal
  /// stamp takes the depth given now) and writes the mark beside the context
  /// (storage/node/use_mark.hpp). Contexts not stored are passed over. Returns how many
  /// were stored. Errors: io_error (a mark that could not be written; the index holds
  /// it all the same, until a restart).
  Result<uint32_t> touch(const std::string& ns, std::span<const ContextTouch> touches, uint64_t stamp);
  /// The use mark of one context (none: stamp 0).
  [[nodiscard]] UseMark use_mark(const std::string& ns, const std::string& ctx) const;
  /// Use marks raised by touch() since the store opened.
  [[nodiscard]] uint64_t marks_raised() const { return marks_raised_.load(std::memory_order_relaxed); }
  /// Up to `limit` contexts of `ns` whose names start with `prefix` and sort after
  /// `after`, by name, each with its payload bytes, chunks, newest write version and use
  /// mark; fewer once their wire form (encode_usage) passes `max_bytes` (at least one,
  /// when there is one), so a page of contexts with many chunks stays a bounded reply.
  /// Objects behind the fence are left out (as from list, get and stat).
  [[nodiscard]] std::vector<ContextUsage> usage(const std::string& ns, const std::string& prefix,
                                                const std::string& after, uint32_t limit,
                                                uint64_t max_bytes = kMaxUsageBodyBytes) const;

 private:
  ChunkStore(MemoryBudget& budget) : budget_(budget) {}
  struct Entry {
    uint64_t size = 0;
    uint64_t generation = 0;  // 0: absent
    uint64_t version = 0;     // the write version in its header
    std::vector<ObjectPart> parts;  // the parts table in its header
    uint32_t key_id = 0;      // the master key it is sealed under (0: clear)
    // Held when the fence last went up: the store's open, or rejoin() (a rewrite under
    // a new key keeps it).
    bool held_at_fence = false;
  };
  // Puts the objects held at the fence behind it, then drops them where `away` (since
  // the node was last a member, as `since` says) is longer than `remove_memory` (not 0).
  Result<uint64_t> fence_or_drop(std::chrono::seconds remove_memory, std::optional<std::chrono::seconds> away,
                                 std::string_view since);
  // Whether `e` is behind the fence. Requires mu_.
  [[nodiscard]] bool fenced_locked(const Entry& e) const { return fenced_ && e.generation != 0 && e.held_at_fence; }
  [[nodiscard]] uint64_t disk_charge(const Entry& e) const {
    return disk_charge(e.size, e.parts.size(), e.key_id != 0);
  }
  struct Context {
    std::map<uint32_t, std::vector<Entry>> chunks;  // chunk -> per level
    UseMark use;                                    // the highest touch (also in <context dir>/use)
  };
  using Lru = std::list<std::pair<std::string, Bytes>>;
  // Whether `c` has an object that is served (committed, not behind the fence).
  [[nodiscard]] bool served_locked(const Context& c) const;

  std::string dir_, tmp_dir_, quarantine_dir_;
  uint64_t cache_limit_ = 0;
  uint64_t alloc_unit_ = 4096;  // the directory's file system allocation unit (statvfs f_frsize)
  MemoryBudget& budget_;
  DirLock lock_;
  // Commits, removes and the opening of an object for reading take their context's
  // stripe, so a reader's descriptor and the generation it records belong together.
  std::array<std::mutex, 64> stripes_;
  mutable std::mutex mu_;  // the index, the cache and the counters (taken after a stripe)
  std::map<std::string, std::map<std::string, Context>> index_;
  uint64_t next_generation_ = 1;
  Lru lru_;  // most recent at the front
  std::unordered_map<std::string, Lru::iterator> cache_;
  uint64_t cache_used_ = 0;
  struct {
    uint64_t quarantined = 0, stale_temporaries = 0;
  } counters_;  // logged at open
  NamespaceQuota quota_;           // guarded by mu_
  Tombstones tombstones_;          // recorded and checked under the context's stripe
  std::atomic<uint64_t> marks_raised_{0};
  // The objects held when the store opened are behind the fence (guarded by mu_).
  bool fenced_ = false;
  // When the node was last known a member before the fence went up (nullopt: not
  // known; guarded by mu_).
  std::optional<std::chrono::system_clock::time_point> away_since_;
  std::atomic<uint64_t> fenced_gets_{0};
  std::optional<std::chrono::system_clock::time_point> member_at_open_;
  std::mutex member_mu_;  // the mark's writes (a leaf)
  std::optional<std::chrono::system_clock::time_point> member_written_;  // guarded by member_mu_
  std::chrono::seconds member_mark_every_{kMemberMarkEvery};              // guarded by member_mu_
  uint32_t current_key_id_ = 0;    // keys_'s current id, 0 without keys (guarded by mu_)
  uint64_t under_old_keys_ = 0;    // entries whose key_id is not current_key_id_ (guarded by mu_)
  mutable std::mutex keys_mu_;     // keys_ (a leaf: taken under a stripe or mu_, nothing under it)
  std::shared_ptr<const security::KeyRing> keys_;

  std::mutex& stripe(const std::string& ns, const std::string& ctx);
  std::string context_dir(const std::string& ns, const std::string& ctx) const;
  // remove()'s deletion of the objects up to `max_version`. Requires the context's
  // stripe. Errors: not_found, io_error.
  Status delete_up_to_locked(const std::string& ns, const std::string& ctx, uint64_t max_version);
  // Deletes `keys` (objects of one context), files then index; the context's
  // directory goes with its last object, else it is synced. Requires the context's
  // stripe. Errors: io_error.
  Status delete_objects_locked(const std::string& ns, const std::string& ctx, std::span<const ObjectKey> keys);
  // Deletes a context's directory (its objects and use mark) and syncs the namespace's.
  // Requires the context's stripe. Errors: io_error.
  Status remove_context_dir(const std::string& ns, const std::string& ctx);
  /// Deletes an object's file (already gone is fine). Errors: io_error.
  Status unlink_object(const ObjectKey& k);
  std::string object_path(const ObjectKey& k) const;
  static Status check_key(const ObjectKey& k);
  Entry* entry_locked(const ObjectKey& k);
  void set_entry_locked(const ObjectKey& k, Entry e);
  void quarantine_locked(const ObjectKey& k, const std::string& path, std::string_view why);
  void cache_put_locked(const std::string& key, Bytes b);
  void cache_drop_locked(const std::string& key);
  void cache_drop_prefix_locked(const std::string& prefix);
  void reclaim(uint64_t bytes);
  void scan();
  // reencrypt(): one object, if it still is the version `generation` names.
  Status reencrypt_one(const ObjectKey& k, uint64_t generation, const security::KeyRing& keys,
                       std::span<std::byte> buffer, const std::function<bool(uint64_t)>& pace,
                       std::atomic<uint64_t>* committed, ReencryptReport& report);
};

}  // namespace kvstream::storage
