// The storage node and its client: encoded chunks (every level of every chunk) kept
// per namespace and context, served over any transport backend.
//
// Namespaces are isolated by per-namespace secrets proven by challenge-response
// (HMAC-SHA256 of a server nonce; the secret never crosses the wire). Every call has
// a deadline and can be cancelled; a chunk's checksum is verified before its bytes
// are handed to the caller.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvstream/membership.hpp"
#include "kvstream/security.hpp"
#include "kvstream/status.hpp"
#include "kvstream/transport.hpp"

namespace kvstream::storage {

/// Default port of kvstream-server.
inline constexpr uint16_t kDefaultPort = 7471;
/// Bounds that every peer enforces on the wire.
inline constexpr size_t kMaxNamespaceBytes = 64;
inline constexpr size_t kMaxContextBytes = 200;
inline constexpr uint32_t kMaxLevels = 32;
inline constexpr uint64_t kMaxChunkBytes = uint64_t(1) << 30;

/// Checks a namespace or context id: 1..max bytes of [A-Za-z0-9._-], not starting
/// with "." (the store's own names start so, and "." and ".." are ruled out), so it
/// can never name a path outside the store. Errors: invalid_argument.
Status validate_id(std::string_view id, size_t max_bytes, std::string_view what);

/// One prefix of a layered object, as its writer declared it: the prefix's byte end
/// (cumulative, strictly increasing, the last one == the object's size) and a
/// writer-defined score of that prefix (e.g. the codec's measured distortion of it).
/// Storage never interprets the score; it keeps it and gives it back.
struct ObjectPart {
  uint64_t end = 0;
  double score = 0;
  bool operator==(const ObjectPart&) const = default;
};
/// Most parts one object may declare (each travels as 16 bytes in the put header,
/// which must fit the transport's 4 KiB header bound): enough for every prefix of a
/// progressive chunk of a 32-layer model (193 for 512 tokens: a base, 3 x 64 groups).
inline constexpr size_t kMaxObjectParts = 224;

/// Checks a parts table against an object of `size` bytes: empty (no parts declared)
/// is valid; otherwise at most kMaxObjectParts parts, ends strictly increasing from
/// above 0, the last end == `size`, every score finite (so a table compares equal to
/// itself after a round trip). Errors: invalid_argument naming the first bad part.
Status validate_parts(std::span<const ObjectPart> parts, uint64_t size);

/// Sizes of every stored level of one chunk (0: that level is absent), and the parts
/// each level's writer declared.
struct ChunkStat {
  uint32_t chunk = 0;
  std::vector<uint64_t> level_bytes;
  /// Per level (same indexing as level_bytes), the parts declared at put (put_parts);
  /// may be shorter than level_bytes, a missing level = no parts. Every client
  /// returns it trimmed: it ends at the last level that has parts, so a chunk
  /// stored without parts has an empty level_parts.
  std::vector<std::vector<ObjectPart>> level_parts;
  /// Per level, the stored object's write version (0: level absent, or stored without
  /// one), as long as level_bytes; empty where the storage does not say (Redis, nodes
  /// from before 2026-12-06). Replicated clients give each level's newest among the
  /// replicas that answered. What a rebalance checks before it drops a copy a node no
  /// longer owns.
  std::vector<uint64_t> level_versions;
  bool operator==(const ChunkStat&) const = default;
};

/// A context marked used (Client::touch) and how deep it lies in its prefix chain: a
/// prompt's chunk i has depth i. Among contexts last used at the same stamp, the
/// deeper go first, so an evictor that goes by use never leaves a chunk whose
/// predecessor is gone.
struct ContextTouch {
  std::string context;
  uint32_t depth = 0;
  bool operator==(const ContextTouch&) const = default;
};

/// A remove of one context up to a write version (Client::remove_many).
struct ContextRemove {
  std::string context;
  uint64_t version = 0;
  bool operator==(const ContextRemove&) const = default;
};

/// One context as a usage listing shows it (Client::usage): what eviction needs, in
/// one reply for many contexts instead of a stat and a read each.
struct ContextUsage {
  std::string context;
  uint64_t bytes = 0;            ///< payload bytes of every level of every chunk
  std::vector<uint32_t> chunks;  ///< the chunk ids holding at least one level, ascending
  uint64_t written = 0;          ///< the newest object's write version (this library's: us since the epoch)
  uint64_t used = 0;             ///< the highest stamp a touch gave it; 0: never touched
  uint32_t depth = 0;            ///< the depth given with that stamp
  bool operator==(const ContextUsage&) const = default;
};

/// Storage node settings (one struct; defaults documented per field).
struct ServerConfig {
  std::string address = "127.0.0.1:7471";  ///< loopback unless told otherwise; port 0 = any
  transport::BackendConfig backend;        ///< transport backend (default tcp)
  std::string directory;                   ///< where chunks live (required; one node per directory)
  std::map<std::string, std::string> secrets;  ///< namespace -> secret; these namespaces (and tls_clients') exist
  /// Mutual TLS (tcp backend with backend.tcp.tls, ca_file set): namespace -> the
  /// names (subject CN, DNS or URI alternative name) of client certificates that may
  /// log into it. A namespace listed here needs a verified client certificate with
  /// one of these names, and its secret as well when `secrets` has one; one listed
  /// only here logs in by certificate alone (the client's secret is then ignored).
  std::map<std::string, std::vector<std::string>> tls_clients;
  uint64_t cache_bytes = uint64_t(256) << 20;  ///< in-memory cache of hot chunks (inside the budget)
  /// The node's one bound on memory held for requests: cached objects and the body
  /// segments of puts and gets in flight (1 MiB each) draw from it; a request that
  /// finds no room is answered resource_exhausted. 0 = cache_bytes + 256 MiB.
  uint64_t memory_budget_bytes = 0;
  /// Authenticated connections; further logins are refused with resource_exhausted.
  uint32_t max_connections = 256;
  /// Connections one namespace (tenant) may hold at once; further ones are refused
  /// after authentication with resource_exhausted, so one tenant cannot take every
  /// connection slot from the others.
  uint32_t max_connections_per_namespace = 64;
  /// Connections that have not authenticated yet, apart from the slots above; when
  /// all are taken, the oldest of the source holding the most is closed for a new one.
  uint32_t max_unauthenticated = 256;
  /// Unauthenticated connections from one source address; a further one from it
  /// closes that source's oldest.
  uint32_t max_unauthenticated_per_source = 64;
  /// A connection that has not authenticated by then is closed.
  std::chrono::milliseconds auth_timeout{2000};
  /// Bytes one namespace (tenant) may keep on this node's disk: each object's file
  /// (header, payload, seal tags) rounded up to the file system's allocation unit
  /// (4 KiB on most), and two units per context (its directory and use mark file), so
  /// a tenant of many tiny objects cannot keep more disk than its quota. A put that would go over is answered no_space and stores nothing (an
  /// overwrite is charged only what it adds, and puts under way count at their
  /// declared length). 0: no bound. Objects a rebalance copies in count too.
  /// namespace_quota_bytes overrides it per namespace.
  uint64_t default_namespace_quota_bytes = 0;
  std::map<std::string, uint64_t> namespace_quota_bytes;
  uint32_t max_inflight_per_connection = 64;  ///< requests queued per connection before back-pressure
  /// A silent client is disconnected after this (kvstream's clients connect again on
  /// their next call).
  std::chrono::milliseconds idle_timeout{60000};
  /// Removes the node remembers (in `<directory>/.removes`, synced before a remove is
  /// acknowledged), so that a copy of a removed context made before the remove (a
  /// node that was away hands it over when it comes back) is refused, and a rebalance
  /// hands them to nodes that join (docs/protocol.md, "Removes"): each for
  /// `remove_memory` after it was made, at most `max_removes_remembered` of them (the
  /// oldest of the namespace holding the most go first). 0 in either: none kept.
  /// In a cluster, a node whose store was last a member longer than `remove_memory`
  /// ago (`<directory>/.member`) drops the objects it held at start, as the members
  /// may have forgotten removes of them (not with 0); so does a node whose lease ran
  /// out while it ran, before it registers again. One back after a member forgot a
  /// remove made since (pushed out past `max_removes_remembered`, or a member's shorter
  /// `remove_memory`) drops those of its contexts no other member holds before it
  /// serves them.
  std::chrono::seconds remove_memory{24 * 3600};
  uint64_t max_removes_remembered = 100000;
  /// Warnings a peer can cause at will (refused connections, failed logins) are
  /// logged at most once per interval, with counts.
  std::chrono::milliseconds log_interval{10000};
  /// Membership in etcd and the rebalance after each change (off by default;
  /// include/kvstream/membership.hpp). The node serves its namespaces' chunks to the
  /// new owners with the secrets above.
  cluster::RebalanceConfig membership;
  /// Encryption at rest (off without a key file): every object is sealed under its
  /// tenant's key from the key file's highest id; objects under older keys (or in
  /// clear) are re-encrypted in the background, at start and after reload_keys().
  AtRestSettings at_rest;
  /// Pace of that re-encryption: payload bytes read and rewritten per second (0: unpaced).
  uint64_t reencrypt_bytes_per_second = uint64_t(64) << 20;
};

/// What one re-encryption pass over a node's store did (the node's background pass,
/// reencrypt_store).
struct ReencryptReport {
  uint64_t reencrypted = 0;  ///< objects rewritten under the current key
  uint64_t bytes = 0;        ///< their payload bytes
  uint64_t replaced = 0;     ///< left: a newer write or a remove came first (the newer write is under the current key)
  uint64_t missing_key = 0;  ///< left: sealed under a key the key file lacks (readable again once it is back)
  uint64_t failed = 0;       ///< damaged (moved aside) or an I/O error; the next pass tries again
  uint64_t remaining = 0;    ///< objects not under the current key when the pass ended
  bool cancelled = false;
};

/// Re-encrypts a node's directory offline (kvstream-server --reencrypt): one pass,
/// under the directory's lock, so no node may be serving it. Errors: invalid_argument
/// (no key file), not_found (key file), already_exists (a node holds the directory),
/// io_error.
Result<ReencryptReport> reencrypt_store(const std::string& directory, const AtRestSettings& at_rest,
                                        uint64_t bytes_per_second = 0);

/// A running storage node. Stops (and joins its threads) on destruction.
class Server {
 public:
  virtual ~Server() = default;
  /// Starts listening and serving. Errors: invalid_argument (config), io_error
  /// (directory), and the backend's errors.
  static Result<std::unique_ptr<Server>> start(const ServerConfig& config);
  /// The address clients connect to (actual port when 0 was asked).
  [[nodiscard]] virtual std::string address() const = 0;
  /// Stops accepting, closes connections, waits for the threads.
  virtual void stop() = 0;
  struct Counters {
    uint64_t requests = 0, errors = 0, bytes_out = 0, bytes_in = 0, cache_hits = 0, auth_failures = 0;
    uint64_t refused_connections = 0;     ///< closed before or at login (limits)
    uint64_t evicted_unauthenticated = 0; ///< pre-auth connections replaced by newer ones
    uint64_t budget_refusals = 0;         ///< requests answered resource_exhausted for memory
    uint64_t quota_refusals = 0;          ///< puts answered no_space for their namespace's quota
    uint64_t use_marks_raised = 0;        ///< contexts whose use mark a touch raised (Client::touch)
    uint64_t removes_remembered = 0;      ///< contexts whose remove the node keeps refusing older copies of
    uint64_t fenced_gets = 0;             ///< gets of objects held from before the node rejoined, answered not_found
    uint64_t fenced = 0;                  ///< 1 while those objects are not served (the node's fence is up)
    uint64_t budget_peak_bytes = 0;       ///< most memory held from the budget at once
    uint64_t budget_limit_bytes = 0;
    uint64_t objects_reencrypted = 0;     ///< rewritten under the current at-rest key since start
    uint64_t objects_under_old_keys = 0;  ///< stored under another key, or in clear with a key file, now
    /// Peers the transport keeps state for apart from their connections
    /// (transport::Listener::peer_entries: libfabric's address vector); none for tcp, UCX.
    std::optional<uint64_t> transport_peer_entries;
    /// Messages no receive would take that the transport dropped, and their bytes
    /// (transport::Listener::strays: UCX, libfabric over ofi_rxm); none for tcp, shm.
    std::optional<transport::Listener::Strays> transport_strays;
  };
  [[nodiscard]] virtual Counters counters() const = 0;
  /// What one namespace (tenant) keeps on this node.
  struct NamespaceUsage {
    std::string name_space;
    uint64_t stored_bytes = 0;  ///< disk bytes of its committed objects, as its quota counts them
    uint64_t quota_bytes = 0;   ///< its quota; 0: no bound
  };
  /// Every namespace the node serves (secrets, tls_clients) and every other that holds
  /// bytes or has a quota of its own, by name.
  [[nodiscard]] virtual std::vector<NamespaceUsage> namespace_usage() const = 0;
  /// Reads the at-rest key file again (rotation: kvstream-server does on SIGHUP): new
  /// writes are sealed under its highest id, and objects under other keys are
  /// re-encrypted in the background. On error the keys in use stay. Errors:
  /// invalid_argument (the node has no key file, or it is malformed), not_found, io_error.
  virtual Status reload_keys() = 0;
  /// Replaces the namespace quotas (ServerConfig's default_namespace_quota_bytes and
  /// namespace_quota_bytes; kvstream-server rereads --namespace-quotas on SIGHUP). Puts
  /// that begin afterwards are checked against them; nothing stored is removed, so a
  /// namespace over a lowered quota keeps its objects and is refused new bytes until it
  /// removes some.
  virtual void set_namespace_quotas(uint64_t default_bytes, std::map<std::string, uint64_t> per_namespace) = 0;
};

/// Client settings.
struct ClientConfig {
  std::string address;                  ///< "host:port" of the storage node
  transport::BackendConfig backend;     ///< must match the server's backend
  std::string name_space;               ///< namespace to use
  std::string secret;                   ///< its secret
  uint32_t connections = 1;             ///< parallel connections (requests are spread over them)
};

/// Completion of an asynchronous get: bytes written into the destination, or why not.
using GetCallback = std::function<void(Result<size_t>)>;

/// A connection (or several) to one storage node. Thread-safe. Connections the node
/// closes (its idle_timeout, a restart) are made again, logged in, by a thread of the
/// client while the requests that found none alive wait, each until its own
/// deadline or cancel (an asynchronous get returns at once; its callback never runs
/// on the caller's thread for a reconnection). A request that was on a lost
/// connection and may reach the node twice without harm is sent again once, on a
/// fresh connection, so it survives a node closing an idle connection or restarting
/// as the request went out:
///  - a read (get, range get, stat, list, usage);
///  - a put: the node keeps one write per version; where it refuses the resend as
///    not newer, the client reads the version it holds and answers ok when that is
///    the put's own (the first try was done), or when it holds none (a remove since
///    covered the put: done, then removed, or ordered before that remove);
///  - a touch: marks keep the highest stamp;
///  - a remove: it deletes only the writes at or before its version, so sent twice
///    it removes no write made in between; one that finds the context gone the
///    second time is done. To a node from before 2026-12-06 a remove on a lost
///    connection fails with it.
/// Where the resend fails too, the request fails with the loss's code (`unavailable`)
/// and both reasons, unless the node answered (not_found, already_exists, no_space,
/// resource_exhausted stand). A reconnection has at most 1 s; after a failed one,
/// requests answer its error for a pause (100 ms, doubling up to 5 s while the node
/// stays down).
class Client {
 public:
  virtual ~Client() = default;
  /// Connects and authenticates. Errors: permission_denied (wrong namespace or
  /// secret; no hint of what exists), unavailable, timed_out.
  static Result<std::unique_ptr<Client>> connect(const ClientConfig& config, transport::Deadline deadline,
                                                 const transport::CancelToken& cancel = {});
  /// connect() over a backend the caller made (transport::create_backend) instead of
  /// one of the client's own; `config.backend` is not used. Clients to several nodes
  /// on one backend share what it holds: a libfabric endpoint (about 100 MB resident
  /// on tcp;ofi_rxm), a UCX worker, and every registration, so a buffer registered
  /// once (with the backend or any of these clients) serves gets from all of them.
  /// The backend lives as long as any client on it. Errors: those of connect,
  /// invalid_argument (a null backend).
  static Result<std::unique_ptr<Client>> connect(const ClientConfig& config,
                                                 std::shared_ptr<transport::Backend> backend,
                                                 transport::Deadline deadline,
                                                 const transport::CancelToken& cancel = {});

  /// Registers a buffer of host memory with the client's backend (chunks land in it
  /// directly).
  virtual Result<transport::MemoryRegion> register_memory(void* data, size_t size) = 0;

  /// Registers a buffer of the given memory type. Device memory (MemoryType::cuda) is
  /// where GPUDirect lands chunks: possible only where capabilities() declares
  /// cuda_memory. Every client of this library passes the type to its backend (the
  /// node's and the replicated client), forwards it (the paced client), or refuses
  /// device memory (Redis: values pass through host memory). The default here
  /// registers host memory through register_memory and answers `unsupported` for any
  /// other type.
  virtual Result<transport::MemoryRegion> register_memory(void* data, size_t size, transport::MemoryType type);

  /// The capabilities of the client's transport (its backend and provider, the memory
  /// types bodies may land in), for callers that choose a path by them (the
  /// pipeline's GPUDirect check). Every client of this library reports them: the
  /// node's and the replicated client their backend's, the paced client its inner
  /// client's, the Redis client its own (host memory only). Null, the default here,
  /// for a client that does not say, which callers read as "host memory only".
  [[nodiscard]] virtual const transport::Capabilities* capabilities() const { return nullptr; }

  /// Stores one level of one chunk (replacing it). Durable when this returns ok.
  /// Concurrent puts of one object are ordered by their write versions (this
  /// process's clock, taken when put is called: see put_versioned); the newest wins
  /// and a put that finds a newer one stored is refused with already_exists, having
  /// changed nothing.
  virtual Status put(const std::string& context, uint32_t chunk, uint32_t level, std::span<const std::byte> bytes,
                     transport::Deadline deadline, const transport::CancelToken& cancel = {}) = 0;

  /// put at a given write version (> 0): a node keeps an object's highest version and
  /// refuses an equal or older one with already_exists. A client that writes one
  /// object to several places (replicas) gives each the same version, so all of them
  /// end with the newest write whatever order the writes reach them in. Clients
  /// without versions (Redis) store in arrival order.
  virtual Status put_versioned(const std::string& context, uint32_t chunk, uint32_t level,
                               std::span<const std::byte> bytes, uint64_t version, transport::Deadline deadline,
                               const transport::CancelToken& cancel = {}) {
    (void)version;
    return put(context, chunk, level, bytes, deadline, cancel);
  }

  /// put_versioned with a parts table (validate_parts against bytes.size()) stored
  /// atomically with the object: one write's bytes and parts replace the previous
  /// write's together, so a reader never sees the object with another write's parts
  /// (stat returns them in ChunkStat::level_parts; a stat and a later range get are
  /// two reads, and a write between them is seen by the second only). An empty table
  /// is a put without parts, which clears the parts of the write it replaces.
  /// `version` 0 takes next_write_version() (the clock put uses); clients without
  /// versions (Redis) ignore it. Errors: those of put, plus invalid_argument for bad
  /// parts (nothing is sent). Every client of this library implements it (the node's,
  /// the paced, the replicated and the Redis client); the default here stores a
  /// table-less put and answers `unsupported` for a non-empty table.
  virtual Status put_parts(const std::string& context, uint32_t chunk, uint32_t level, std::span<const std::byte> bytes,
                           std::span<const ObjectPart> parts, uint64_t version, transport::Deadline deadline,
                           const transport::CancelToken& cancel = {});

  /// Fetches one level of one chunk straight into dest[offset, offset + capacity).
  /// Pipelined: many gets may be in flight; `done` runs on a client thread once the
  /// bytes are in place and their checksum verified (or on error, including
  /// timed_out at the deadline and cancelled). After `done` the client no longer
  /// touches the destination.
  virtual void get_async(const std::string& context, uint32_t chunk, uint32_t level, transport::MemoryRegion dest,
                         size_t offset, size_t capacity, transport::Deadline deadline,
                         const transport::CancelToken& cancel, GetCallback done) = 0;

  /// Fetches bytes [offset, offset + length) of one stored object (one level of one
  /// chunk) straight into dest[dest_offset, dest_offset + length); `done` gets
  /// `length` on success, on a client thread, as get_async's. The bytes are verified
  /// before `done` reports success: a checksum over the range travels with it (the
  /// storage node also verifies the whole object it reads the range from, so a damaged
  /// object never yields a clean-looking range; the Redis client verifies each 64 KiB
  /// block the range touches). After `done` the client no longer touches the
  /// destination. Errors: invalid_argument (length 0, a destination outside its
  /// registered region), not_found, out_of_range (the range ends past the object's
  /// end, or the level is past kMaxLevels; nothing is written), corrupt_data, and the
  /// others of get_async (timed_out, cancelled, unavailable). Every client of this
  /// library implements it natively; the default here answers `unsupported`.
  virtual void get_range_async(const std::string& context, uint32_t chunk, uint32_t level, uint64_t offset,
                               uint64_t length, transport::MemoryRegion dest, size_t dest_offset,
                               transport::Deadline deadline, const transport::CancelToken& cancel, GetCallback done);
  /// Blocking get_range_async; returns `length`.
  Result<size_t> get_range(const std::string& context, uint32_t chunk, uint32_t level, uint64_t offset, uint64_t length,
                           transport::MemoryRegion dest, size_t dest_offset, transport::Deadline deadline,
                           const transport::CancelToken& cancel = {});

  /// Blocking get; returns the chunk's size.
  Result<size_t> get(const std::string& context, uint32_t chunk, uint32_t level, transport::MemoryRegion dest,
                     size_t offset, size_t capacity, transport::Deadline deadline,
                     const transport::CancelToken& cancel = {});
  /// The same as a future.
  std::future<Result<size_t>> get_future(const std::string& context, uint32_t chunk, uint32_t level,
                                         transport::MemoryRegion dest, size_t offset, size_t capacity,
                                         transport::Deadline deadline, const transport::CancelToken& cancel = {});

  /// Sizes of every level of every chunk of a context, with each level's declared
  /// parts (what the level chooser needs before fetching). Errors: not_found.
  virtual Result<std::vector<ChunkStat>> stat(const std::string& context, transport::Deadline deadline,
                                              const transport::CancelToken& cancel = {}) = 0;
  /// Deletes a context: every object written before the call. On a storage node, a
  /// write of it at a newer version (a put that crossed the remove on the way, from
  /// a writer whose clock is ahead) stays, with the context, as it would over an
  /// older put; nodes from before 2026-12-06 and the Redis clients delete all. A node
  /// remembers the remove for a while (ServerConfig::remove_memory) and refuses the
  /// older copies of the context that come later (already_exists), such as a put that
  /// crossed the remove. Errors: not_found.
  virtual Status remove(const std::string& context, transport::Deadline deadline,
                        const transport::CancelToken& cancel = {}) = 0;
  /// Deletes the writes of a context at or before write `version` (a clock as
  /// next_write_version()'s): what remove() does at this process's clock now, for a
  /// remove made elsewhere and carried on (a rebalance hands remembered removes to
  /// nodes that join). A storage node remembers it (ServerConfig::remove_memory) and
  /// refuses older copies of the context that come later. Errors: invalid_argument
  /// (version 0, the context id), not_found (nothing deleted; remembered all the
  /// same), unsupported (storage without write versions: Redis, nodes from before
  /// 2026-12-06; the default here).
  virtual Status remove_up_to(const std::string& context, uint64_t version, transport::Deadline deadline,
                              const transport::CancelToken& cancel = {});
  /// Many remove_up_to at once (a rebalance hands on what a node remembers), a context
  /// not stored included (not an error here). A storage node that declares them takes
  /// them in batches of up to 1 MiB, remembered with one sync each; otherwise (and in
  /// this default) one request each. Errors: those of remove_up_to but not_found; the
  /// removes before the failing one are done.
  virtual Status remove_many(std::span<const ContextRemove> removes, transport::Deadline deadline,
                             const transport::CancelToken& cancel = {});
  /// Contexts of the namespace. A storage node names only those it serves (not what
  /// it holds behind its fence after a return to its cluster; nodes from before
  /// 2026-12-06 named those too); usage() likewise.
  virtual Result<std::vector<std::string>> list(transport::Deadline deadline,
                                                const transport::CancelToken& cancel = {}) = 0;

  /// Marks `contexts` used at `stamp` (0: next_write_version(), this process's clock,
  /// the clock of write versions): each keeps the highest stamp it was given, with the
  /// depth given with it. Contexts not stored are passed over. Nothing is read; the
  /// node keeps the mark beside the context (it survives restarts, not a remove), Redis
  /// (one server or a cluster) in a hash per namespace (stamps below 2^53).
  /// Errors: invalid_argument (a context id), unsupported (a storage that keeps no
  /// marks: nodes from before 2026-12-06; the default here), the client's.
  virtual Status touch(std::span<const ContextTouch> contexts, uint64_t stamp, transport::Deadline deadline,
                       const transport::CancelToken& cancel = {});
  /// Every context of the namespace whose name starts with `prefix` (empty: all), by
  /// name, with its bytes, chunks, write and use marks: pages of up to 4096 contexts
  /// (8 MiB), read until a short one.
  /// Errors: unsupported (as touch; the default here), the client's.
  virtual Result<std::vector<ContextUsage>> usage(const std::string& prefix, transport::Deadline deadline,
                                                  const transport::CancelToken& cancel = {});
};

}  // namespace kvstream::storage
