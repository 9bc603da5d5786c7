// The settings table: every StoreConfig field once, with its name, meaning and how it
// reads and writes as text. from_env, set, get and describe all walk this one table,
// so a setting added here is documented, settable and read from the environment.
#include "kvstream/store_config.hpp"

#include <fmt/format.h>

#include "core/settings_table.hpp"
#include "kvstream/log.hpp"

namespace kvstream {
namespace {


const settings::Table<StoreConfig>& table() {
  using C = StoreConfig;
  static const settings::Table<StoreConfig> t({
      KVS_SETTING(C, "storage.kind", "node (one kvstream-server), cluster (replicated nodes), redis or redis-cluster", storage.kind),
      KVS_SETTING(C, "storage.address", "host:port of the node, of Redis, or of one Redis Cluster node", storage.address),
      KVS_SETTING(C, "storage.nodes", "cluster: host:port of every node, comma-separated (redis-cluster: more nodes to learn the topology from)", storage.nodes),
      KVS_SETTING(C, "storage.etcd", "cluster: etcd client URLs, comma-separated: the nodes registered there, followed as they join and leave (instead of storage.nodes)", storage.etcd),
      KVS_SETTING(C, "storage.etcd_prefix", "cluster with etcd: the cluster's key prefix in etcd", storage.etcd_prefix),
      KVS_SETTING(C, "storage.replication", "cluster: nodes holding each chunk", storage.replication),
      KVS_SETTING(C, "storage.backend", "transport to the nodes: tcp, ucx or libfabric", storage.backend),
      KVS_SETTING(C, "storage.namespace", "namespace (tenant) on the nodes; key prefix on Redis", storage.name_space),
      KVS_SETTING(C, "storage.secret", "the namespace's secret (nodes); the password (Redis)", storage.secret),
      KVS_SETTING(C, "storage.connections", "connections per node, or to Redis", storage.connections),
      KVS_SETTING(C, "storage.connect_timeout_ms", "bound on connecting at open()", storage.connect_timeout),
      KVS_SETTING(C, "storage.stat_reuse_ms", "a fetch reuses chunk sizes a lookup read this recently (0: asks again)",
                storage.stat_reuse),
      KVS_SETTING(C, "storage.tls", "TLS 1.3 to the nodes (tcp backend) or to Redis", storage.tls.enabled),
      KVS_SETTING(C, "storage.tls_ca_file",
                "with TLS: PEM file of the CAs trusted to sign the server's certificate (empty: the system's)",
                storage.tls.ca_file),
      KVS_SETTING(C, "storage.tls_cert_file", "with TLS: PEM client certificate (mutual TLS; Redis tls-auth-clients)",
                storage.tls.cert_file),
      KVS_SETTING(C, "storage.tls_key_file", "with TLS: PEM key of the client certificate", storage.tls.key_file),
      KVS_SETTING(C, "storage.tls_server_name",
                "with TLS: the name the server's certificate must carry (empty: the host connected to)",
                storage.tls.server_name),
      KVS_SETTING(C, "storage.at_rest_key_file",
                "key file (\"<id> <64 hex>\" per line) sealing every value stored in Redis (kvstream-server: its "
                "objects); empty: in clear",
                storage.at_rest.key_file),
      KVS_SETTING(C, "storage.redis_read_clear_values",
                "redis with a key file: still read values stored in clear before encryption was on",
                storage.redis_read_clear_values),
      KVS_SETTING(C, "storage.paced_bits_per_second",
                "> 0: pace the link to this rate (demos, tests); 0: as fast as it goes",
                storage.paced_bits_per_second),
      KVS_SETTING(C, "codec.profile", "codec profile file (kvstream-profile writes one); required", codec.profile_path),
      KVS_SETTING(C, "codec.model_id", "id of the model whose KV is stored, part of every key; required",
                codec.model_id),
      KVS_SETTING(C, "codec.chunk_tokens", "tokens per chunk; lookups and puts work in whole chunks", codec.chunk_tokens),
      KVS_SETTING(C, "pipeline.depth", "receive buffers (chunks on the wire or waiting to decode)", pipeline.depth),
      KVS_SETTING(C, "pipeline.max_chunk_bytes", "size of each receive buffer; a larger chunk fails",
                pipeline.max_chunk_bytes),
      KVS_SETTING(C, "pipeline.decode_threads", "chunks decoding side by side", pipeline.decode_threads),
      KVS_SETTING(C, "pipeline.decode", "where chunks decode: cpu, gpu or auto", pipeline.decode),
      KVS_SETTING(C, "pipeline.gpu_device", "CUDA device for gpu and auto", pipeline.gpu_device),
      KVS_SETTING(C, "pipeline.max_on_wire", "transfers requested and not landed, at most", pipeline.max_on_wire),
      KVS_SETTING(C, "pipeline.max_running", "fetches running at once; the rest wait, by priority",
                pipeline.max_running),
      KVS_SETTING(C, "policy.chooser", "per-chunk level chooser: deadline or paper", policy.chooser),
      KVS_SETTING(C, "policy.estimator", "throughput estimator: last, ewma, harmonic or percentile", policy.estimator),
      KVS_SETTING(C, "policy.prior_bits_per_second", "link rate assumed before the first transfer",
                policy.prior_bits_per_second),
      KVS_SETTING(C, "policy.max_quality_loss_pct", "worst perplexity increase (%) a level may have; < 0: no bound",
                policy.max_quality_loss_pct),
      KVS_SETTING(C, "policy.recompute_tokens_per_second", "the runtime's prefill rate; > 0 lets chunks go as text",
                policy.recompute_tokens_per_second),
      KVS_SETTING(C, "policy.decode_elements_per_second",
                "decode rate per worker (KV elements/s); 0: decode cost ignored",
                policy.decode_elements_per_second),
      KVS_SETTING(C, "eviction.max_bytes",
                "0: no bound; else the least recently used chunks are removed until the store is under it",
                eviction.max_bytes),
      KVS_SETTING(C, "eviction.by_use",
                "evict the least recently used first (use marks); false: the deepest, then the oldest stored",
                eviction.by_use),
      KVS_SETTING(C, "eviction.max_age_s",
                "0: no bound; else chunks not used (stored or fetched) for longer are removed", eviction.max_age),
      KVS_SETTING(C, "eviction.when_full",
                "a put the storage has no space for (quota, disk) removes the least recently used chunks until it fits",
                eviction.when_full),
      KVS_SETTING(C, "eviction.when_full_fraction",
                "share of the stored chunks (0-1) removed at least, each time a put makes room",
                eviction.when_full_fraction),
      KVS_SETTING(C, "log.level", "the library's log level: trace, debug, info, warn, error or off", log.level),
  }, "KVSTREAM_");
  return t;
}

}  // namespace

Result<StoreConfig> StoreConfig::from_env(StoreConfig base) { return table().from_env(std::move(base)); }
Status StoreConfig::set(std::string_view name, std::string_view value) { return table().set(*this, name, value); }
Status StoreConfig::set(std::string_view assignment) { return table().set(*this, assignment); }
Result<std::string> StoreConfig::get(std::string_view name) const { return table().get(*this, name); }
std::vector<SettingInfo> store_settings() { return table().info(); }
// A secret is never printed, only whether one is set.
std::string StoreConfig::describe() const { return table().describe(*this, {"storage.secret"}); }

Status StoreConfig::apply_log_level() const {
  KVS_ASSIGN_OR_RETURN(LogLevel level, parse_log_level(log.level));
  set_log_level(level);
  return {};
}

Status StoreConfig::validate() const {
  auto bad_value = [](std::string_view what, auto v, std::string_view want) {
    return make_status(StatusCode::invalid_argument, "setting {} = {}: {}", what, v, want);
  };
  if (storage.kind != "node" && storage.kind != "cluster" && storage.kind != "redis" &&
      storage.kind != "redis-cluster")
    return bad_value("storage.kind", storage.kind, "must be node, cluster, redis or redis-cluster");
  if (storage.kind == "cluster" && storage.nodes.empty() && storage.etcd.empty())
    return bad_value("storage.nodes", "\"\"", "a cluster needs at least one node, or storage.etcd");
  if (storage.kind == "cluster" && !storage.nodes.empty() && !storage.etcd.empty())
    return bad_value("storage.etcd", fmt::format("{}", fmt::join(storage.etcd, ",")),
                     "membership comes from storage.nodes or from etcd, not both");
  if (storage.connections == 0) return bad_value("storage.connections", 0, "must be at least 1");
  if (storage.paced_bits_per_second < 0)
    return bad_value("storage.paced_bits_per_second", storage.paced_bits_per_second, "must be >= 0");
  if (codec.profile_path.empty()) return bad_value("codec.profile", "\"\"", "a codec profile is required");
  if (codec.model_id.empty()) return bad_value("codec.model_id", "\"\"", "a model id is required");
  if (codec.chunk_tokens == 0) return bad_value("codec.chunk_tokens", 0, "must be at least 1");
  if (pipeline.depth == 0) return bad_value("pipeline.depth", 0, "must be at least 1");
  if (pipeline.decode_threads == 0) return bad_value("pipeline.decode_threads", 0, "must be at least 1");
  if (pipeline.max_running == 0) return bad_value("pipeline.max_running", 0, "must be at least 1");
  if (!(eviction.when_full_fraction >= 0 && eviction.when_full_fraction <= 1))
    return bad_value("eviction.when_full_fraction", eviction.when_full_fraction, "must be from 0 to 1");
  if (policy.prior_bits_per_second <= 0)
    return bad_value("policy.prior_bits_per_second", policy.prior_bits_per_second, "must be > 0");
  if (!parse_log_level(log.level).ok()) return bad_value("log.level", log.level, "must be trace, debug, info, warn, error or off");
  if (policy.recompute_tokens_per_second < 0 || policy.decode_elements_per_second < 0)
    return make_status(StatusCode::invalid_argument, "policy rates must be >= 0");
  return {};
}

}  // namespace kvstream
