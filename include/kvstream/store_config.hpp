// One configuration for the front door (KvStore): a struct per part, nested in
// StoreConfig, every setting with a name, a default and a meaning in one table
// (store_settings()). from_env() is the only place that reads environment variables;
// describe() prints the table with the values in force; set() takes "name=value" as
// the CLIs' --set options do.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvstream/security.hpp"
#include "kvstream/settings.hpp"
#include "kvstream/status.hpp"

namespace kvstream {

/// Where chunks are stored and how to reach them.
struct StorageSettings {
  std::string kind = "node";                 ///< node | cluster | redis | redis-cluster
  std::string address = "127.0.0.1:7471";    ///< node or redis: host:port (redis-cluster: one node)
  std::vector<std::string> nodes;            ///< cluster: host:port of every node (redis-cluster: more seeds)
  std::vector<std::string> etcd;             ///< cluster: etcd client URLs; membership from etcd instead of `nodes`
  std::string etcd_prefix = "/kvstream/";    ///< cluster with etcd: the cluster's key prefix there
  uint32_t replication = 2;                  ///< cluster: replicas per chunk
  std::string backend = "tcp";               ///< node and cluster: tcp, ucx or libfabric
  std::string name_space = "default";        ///< namespace (tenant) on the node, key prefix on Redis
  std::string secret;                        ///< the namespace's secret (node and cluster); Redis: password
  uint32_t connections = 2;                  ///< connections per node (or to Redis)
  std::chrono::milliseconds connect_timeout{5000};  ///< bound on open()'s connect
  double paced_bits_per_second = 0;          ///< > 0: a rate-limited link in front of the client (demos, tests)
  /// A fetch takes the chunk sizes a lookup read up to this long ago instead of
  /// asking the store again (0: always asks). A chunk removed meanwhile then fails
  /// that fetch's chunk with not_found, as it would a moment later anyway.
  std::chrono::milliseconds stat_reuse{2000};
  /// TLS 1.3 on every connection: node and cluster over the tcp backend (the server's
  /// certificate and name verified; a client certificate for mutual TLS), redis and
  /// redis-cluster to Redis. kvstream-server takes the same settings for its listener
  /// (then cert_file and key_file are its own, ca_file that of its clients).
  TlsSettings tls;
  /// A key file of encryption at rest: redis and redis-cluster seal every value in the
  /// client; kvstream-server seals its objects (docs/security.md).
  AtRestSettings at_rest;
  /// redis with at_rest: values found in clear (stored before) are still read.
  bool redis_read_clear_values = true;
};

/// What is stored and how the chunks are cut.
struct CodecSettings {
  std::string profile_path;                  ///< codec profile file (required)
  std::string model_id;                      ///< the model whose KV this is; part of every key (required)
  uint32_t chunk_tokens = 256;               ///< tokens per stored chunk; only whole chunks are stored
};

/// The fetch pipeline (pipeline::PipelineConfig).
struct PipelineSettings {
  uint32_t depth = 4;                        ///< receive buffers
  uint64_t max_chunk_bytes = uint64_t(16) << 20;  ///< size of each receive buffer
  uint32_t decode_threads = 1;               ///< chunks decoding side by side
  std::string decode = "cpu";                ///< cpu, gpu or auto
  int gpu_device = 0;                        ///< CUDA device for gpu and auto
  uint32_t max_on_wire = 2;                  ///< transfers outstanding at once
  uint32_t max_running = 2;                  ///< fetches running at once (the rest queue by priority)
};

/// How each chunk's level (or text) is chosen.
struct PolicySettings {
  std::string chooser = "deadline";          ///< deadline or paper
  std::string estimator = "ewma";            ///< last, ewma, harmonic or percentile
  double prior_bits_per_second = 1e9;        ///< link rate assumed before the first transfer
  double max_quality_loss_pct = 1.0;         ///< no level worse than this (profile's ppl increase); < 0: no bound
  double recompute_tokens_per_second = 0;    ///< the runtime's prefill rate; 0: never send a chunk as text
  double decode_elements_per_second = 0;     ///< CPU or GPU decode rate, per worker; 0: decode cost ignored
};

/// What the store may drop (KvStore::evict, and after each put when set).
struct EvictionSettings {
  uint64_t max_bytes = 0;                    ///< 0: no bound; else the least recently used go until under it
  std::chrono::seconds max_age{0};           ///< 0: no bound; else chunks unused (stored or fetched) longer go
  /// A put the storage has no space for (no_space: the tenant's quota or a disk is
  /// full, Redis at maxmemory) removes chunks of this model and profile, in evict()'s
  /// order, none of the put's own and none without a record (another store may be
  /// writing it), until there is room, and goes on. Off: the put
  /// fails no_space. A busy storage (resource_exhausted) never evicts.
  bool when_full = false;
  /// Making room removes at least this share of what this model and profile store
  /// (0 to 1): each time lists and reads every chunk, so removing more at once keeps
  /// that cost off most puts (Mooncake's eviction_ratio does the same).
  double when_full_fraction = 0.05;
  /// Evict the least recently used first, by the use marks put and fetch leave
  /// (KvStore::evict). Off: the deepest chunks first, the oldest stored among equally
  /// deep ones, whatever was fetched since (the order before marks; max_age then
  /// counts from when a chunk was stored), read from each chunk's record.
  bool by_use = true;
};

/// The library's log (kvstream's one logger; see log.hpp).
struct LogSettings {
  std::string level = "info";                ///< trace, debug, info, warn, error or off
};

/// Everything KvStore::open needs.
struct StoreConfig {
  StorageSettings storage;
  CodecSettings codec;
  PipelineSettings pipeline;
  PolicySettings policy;
  EvictionSettings eviction;
  LogSettings log;

  /// Sets the library's log level from `log` (KvStore::open does; tools that read a
  /// StoreConfig without opening a store call it).
  [[nodiscard]] Status apply_log_level() const;

  /// `base` with every setting that has an environment variable set replaced by it
  /// (KVSTREAM_ + the name upper-cased, '.' as '_': storage.address is
  /// KVSTREAM_STORAGE_ADDRESS). Errors: invalid_argument naming the variable.
  static Result<StoreConfig> from_env(StoreConfig base);
  static Result<StoreConfig> from_env() { return from_env(StoreConfig{}); }
  /// Sets one setting from text ("storage.address", "127.0.0.1:7000"); lists take
  /// comma-separated values. Errors: not_found (no such setting), invalid_argument.
  Status set(std::string_view name, std::string_view value);
  /// set() for "name=value".
  Status set(std::string_view assignment);
  /// The value of a setting as text. Errors: not_found.
  [[nodiscard]] Result<std::string> get(std::string_view name) const;
  /// Every setting, one per line: name, value in force, default, environment
  /// variable, meaning.
  [[nodiscard]] std::string describe() const;
  /// Checks values and combinations (required fields, ranges). Errors: invalid_argument.
  [[nodiscard]] Status validate() const;
};

/// The whole table, in declaration order.
std::vector<SettingInfo> store_settings();

}  // namespace kvstream
