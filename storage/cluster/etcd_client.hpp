// A small etcd v3 client over etcd's JSON gateway (HTTP POST of JSON to /v3/...,
// keys and values base64) with libcurl: the calls membership needs (leases, put,
// prefix range, delete, watch) and nothing more. Each call has a deadline and a
// cancel token; endpoints are tried in order, starting with the last that answered.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "kvstream/membership.hpp"

namespace kvstream::cluster {

struct EtcdKv {
  std::string key, value;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

struct EtcdEvent {
  bool deleted = false;
  EtcdKv kv;  // a delete carries only the key
};

/// The end of a prefix range: the prefix with its last byte incremented (etcd's
/// "range_end" for "every key that starts with").
std::string etcd_prefix_end(std::string_view prefix);

class EtcdClient {
 public:
  /// Checks the config (endpoints "http://host:port", a prefix, a TTL >= 2 s).
  /// Errors: invalid_argument.
  static Result<EtcdClient> create(const EtcdConfig& config);

  /// A new lease of `ttl`; returns its id.
  Result<int64_t> grant(std::chrono::seconds ttl, transport::Deadline deadline, const transport::CancelToken& cancel);
  /// Renews a lease; returns the seconds it has left (0: it expired or was revoked).
  Result<int64_t> keep_alive(int64_t lease, transport::Deadline deadline, const transport::CancelToken& cancel);
  /// Ends a lease now (its keys are deleted).
  Status revoke(int64_t lease, transport::Deadline deadline, const transport::CancelToken& cancel);
  /// Puts a key, under `lease` when not 0.
  Status put(const std::string& key, const std::string& value, int64_t lease, transport::Deadline deadline,
             const transport::CancelToken& cancel);

  struct Range {
    std::vector<EtcdKv> kvs;
    int64_t revision = 0;  ///< the store's revision when read (watch from revision + 1)
  };
  /// Every key under `prefix`.
  Result<Range> range_prefix(const std::string& prefix, transport::Deadline deadline,
                             const transport::CancelToken& cancel);

  /// Streams the changes under `prefix` from `start_revision` on: `on_events` runs on
  /// this thread for each batch with the revision it brings the reader to. Returns
  /// when cancelled (cancelled), when the stream ends or fails (unavailable), or when
  /// `start_revision` was compacted away (out_of_range: read the range again).
  Status watch_prefix(const std::string& prefix, int64_t start_revision, const transport::CancelToken& cancel,
                      const std::function<void(const std::vector<EtcdEvent>&, int64_t revision)>& on_events);

  [[nodiscard]] const EtcdConfig& config() const { return cfg_; }

  EtcdClient(const EtcdClient& o) : cfg_(o.cfg_), preferred_(o.preferred_.load()) {}
  EtcdClient(EtcdClient&& o) noexcept : cfg_(std::move(o.cfg_)), preferred_(o.preferred_.load()) {}

 private:
  explicit EtcdClient(EtcdConfig cfg) : cfg_(std::move(cfg)) {}
  // POSTs `body` to `path` on the endpoints in turn; the parsed answer, or why not.
  Result<nlohmann::json> call(const char* path, const nlohmann::json& body, transport::Deadline deadline,
                              const transport::CancelToken& cancel);

  EtcdConfig cfg_;
  std::atomic<size_t> preferred_{0};  // the endpoint that answered last
};

}  // namespace kvstream::cluster
