// The storage node behind Server (include/kvstream/storage.hpp): accepts connections
// on any backend, admits each to a bounded pre-authentication pool, authenticates it
// against its namespace secret, then serves its requests in order, one thread per
// connection. Bodies move in segments through buffers leased from the node's memory
// budget. Its parts: server.cpp (start, stop, accepting, counters), server_login.cpp
// (the challenge-response and the connection limits), server_requests.cpp (a
// connection's requests, and the bodies it receives), server_get.cpp (a get's reply).
#pragma once

#include <atomic>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/rate_limited_log.hpp"
#include "kvstream/storage.hpp"
#include "storage/node/chunk_store.hpp"
#include "storage/node/memory_budget.hpp"
#include "storage/node/preauth_pool.hpp"
#include "storage/node/reencryptor.hpp"
#include "storage/node/segment_pool.hpp"
#include "storage/protocol.hpp"

namespace kvstream::cluster {
class Rebalancer;
}

namespace kvstream::storage {

class ServerImpl final : public Server {
 public:
  explicit ServerImpl(const ServerConfig& cfg);
  ~ServerImpl() override;

  /// Checks `cfg`, opens the store, listens, and (in a cluster) joins the membership.
  static Result<std::unique_ptr<Server>> create(const ServerConfig& cfg);

  std::string address() const override { return address_; }
  void stop() override;
  Status reload_keys() override;
  void set_namespace_quotas(uint64_t default_bytes, std::map<std::string, uint64_t> per_namespace) override;
  Counters counters() const override;
  std::vector<NamespaceUsage> namespace_usage() const override;

 private:
  // A logged-in connection: its namespace, and where its request ids start.
  struct Login {
    std::string ns;
    uint64_t first_id = 0;
  };

  void accept_loop();
  Status reply(transport::Connection& c, const Response& r, transport::Deadline deadline,
               const transport::CancelToken& cancel);

  // Challenge-response: the client proves it knows the namespace's secret without
  // sending it. A failure says nothing about which namespaces exist. Its own errors are
  // not logged here: serve() notes them in the rate-limited login log.
  // `ticket` (the pre-auth place) is given back before the answer goes out, so the
  // place of a login that succeeded is never taken from it.
  Result<Login> authenticate(transport::Connection& c, const transport::CancelToken& cancel,
                             PreAuthPool::Ticket& ticket);
  // Mutual TLS maps certificates to namespaces: it needs TLS on tcp asking for client
  // certificates, and (for now) a secret wherever the node copies chunks to others.
  static Status check_tls_clients(const ServerConfig& cfg);
  // Whether the peer's verified certificate carries one of `allowed`.
  static bool certificate_names_one_of(const transport::Connection& c, const std::vector<std::string>& allowed);
  // Gives back the connection slots (the node's, the namespace's) a login took.
  void release_namespace(const std::string& ns);

  // A connection's life after it was admitted: its login, then its requests in order.
  void serve(transport::Connection& c, const transport::CancelToken& handshake, const transport::CancelToken& cancel,
             PreAuthPool::Ticket& ticket);
  // Serves one request. Returns an error only when the connection must end.
  Status handle(transport::Connection& c, const std::string& ns, const Request& req,
                const transport::CancelToken& cancel);
  // Whether this node's member set is newer than the one `req` names (a client whose
  // etcd watch is behind: docs/protocol.md, "Member sets"). A node alone, or not yet
  // following its cluster, knows none. A request that names a newer set than this
  // node's has its set read again (this node's watch may be the one behind).
  bool members_newer(const Request& req);
  // Receives every segment of a put, streaming them into the store. The whole body is
  // always read off the wire, so a refused put (budget, disk, ids) leaves the
  // connection in step and is answered with its reason (`outcome`). Returns an error
  // only when the connection must end.
  Status receive_put(transport::Connection& c, const ObjectKey& key, const Request& req,
                     const transport::CancelToken& cancel, Status& outcome);
  // Receives the one-segment body of a touch or a batch of removes (bounded by
  // decode_request) and hands it, its checksum verified, to `apply` (which decodes and
  // does it); the reason it was refused (budget, checksum, a malformed list) goes to
  // `outcome`. As a put's, the body is always read off the wire, so the connection
  // stays in step. Returns an error only when the connection must end.
  template <typename Apply>
  Status receive_small_body(transport::Connection& c, const Request& req, const transport::CancelToken& cancel,
                            Status& outcome, Apply apply);
  // Sends a get's reply: the object, or the range of it the request asks for, from
  // memory, or streamed from its open file through two segments (one is read while
  // the other is on the wire). The reply's checksum is over exactly the bytes sent.
  Status send_get(transport::Connection& c, const ObjectKey& key, const Request& req, Response& r,
                  const transport::CancelToken& cancel);

  ServerConfig cfg_;
  MemoryBudget budget_;
  PreAuthPool preauth_;
  detail::RateLimitedLog refused_log_, login_log_, conn_log_;
  // Declared before the store and the segments: their buffers hold registrations with
  // it, so it goes after them.
  std::unique_ptr<transport::Backend> backend_;
  std::unique_ptr<ChunkStore> store_;
  std::unique_ptr<cluster::Rebalancer> rebalancer_;  // etcd membership (holds store_)
  // What the request threads tell of their writes (Rebalancer::on_write) and ask of
  // the member set (Rebalancer::members_revision): set once the rebalancer runs,
  // cleared before it goes, under its own lock since both happen while the node
  // serves.
  std::mutex writes_mu_;
  cluster::Rebalancer* write_watch_ = nullptr;
  mutable std::mutex keys_mu_;                       // reload_keys, stop and counters against each other
  std::unique_ptr<Reencryptor> reencryptor_;         // with a key file (holds store_; gone at stop)
  uint64_t reencrypted_at_stop_ = 0;
  std::unique_ptr<SegmentPool> segments_;
  std::unique_ptr<transport::Listener> listener_;
  std::string address_;
  transport::CancelToken stop_;
  std::atomic<bool> stopped_{false};
  std::thread acceptor_;
  std::mutex mu_;
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
    transport::CancelToken cancel;     // this connection's waits: cancelled at stop
    transport::CancelToken handshake;  // its login's waits: cancelled at stop or eviction
  };
  std::list<Worker> workers_;
  uint32_t authenticated_ = 0;                      // guarded by mu_
  std::map<std::string, uint32_t> per_namespace_;  // connections held per namespace (guarded by mu_)
  std::atomic<uint64_t> requests_{0}, errors_{0}, bytes_out_{0}, bytes_in_{0}, cache_hits_{0}, auth_failures_{0},
      refused_{0};
};

}  // namespace kvstream::storage
