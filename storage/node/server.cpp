// The storage node: accepts connections on any backend, admits each to a bounded
// pre-authentication pool, authenticates it against its namespace secret, then serves
// its requests in order, one thread per connection. Bodies move in segments through
// buffers leased from the node's memory budget.
#include <algorithm>
#include <limits>
#include <atomic>
#include <list>
#include <map>
#include <new>
#include <optional>
#include <thread>

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include "core/log.hpp"
#include "core/rate_limited_log.hpp"
#include "storage/cluster/rebalancer.hpp"
#include "storage/node/chunk_store.hpp"
#include "storage/node/preauth_pool.hpp"
#include "storage/node/reencryptor.hpp"
#include "storage/node/segment_pool.hpp"
#include "storage/protocol.hpp"

namespace kvstream::storage {

using namespace std::chrono_literals;
using transport::CancelToken;
using transport::Connection;
using transport::deadline_in;
using transport::Deadline;

namespace {

constexpr uint64_t kDefaultInflightBytes = uint64_t(256) << 20;

class ServerImpl final : public Server {
 public:
  ServerImpl(const ServerConfig& cfg)
      : cfg_(cfg),
        budget_(cfg.memory_budget_bytes ? cfg.memory_budget_bytes : cfg.cache_bytes + kDefaultInflightBytes),
        preauth_(cfg.max_unauthenticated, cfg.max_unauthenticated_per_source),
        refused_log_("storage node refused a connection", cfg.log_interval),
        login_log_("storage node login failed", cfg.log_interval),
        conn_log_("storage node closed a connection", cfg.log_interval) {}
  ~ServerImpl() override { stop(); }

  static Result<std::unique_ptr<Server>> create(const ServerConfig& cfg) {
    if (cfg.secrets.empty() && cfg.tls_clients.empty())
      return make_status(StatusCode::invalid_argument, "server needs at least one namespace");
    for (const auto& [ns, secret] : cfg.secrets) {
      KVS_RETURN_IF_ERROR(validate_id(ns, kMaxNamespaceBytes, "namespace"));
      if (secret.size() < 16)
        return make_status(StatusCode::invalid_argument, "secret of namespace '{}' is shorter than 16 bytes", ns);
    }
    KVS_RETURN_IF_ERROR(check_tls_clients(cfg));
    if (cfg.memory_budget_bytes && cfg.memory_budget_bytes < cfg.cache_bytes + 2 * kSegmentBytes)
      return make_status(StatusCode::invalid_argument,
                         "memory budget of {} bytes leaves less than two body segments beside a cache of {}",
                         cfg.memory_budget_bytes, cfg.cache_bytes);
    auto s = std::make_unique<ServerImpl>(cfg);
    std::shared_ptr<const security::KeyRing> keys;
    if (!cfg.at_rest.key_file.empty()) {
      KVS_ASSIGN_OR_RETURN(keys, security::KeyRing::load(cfg.at_rest.key_file));
    }
    KVS_ASSIGN_OR_RETURN(s->store_, ChunkStore::open(cfg.directory, cfg.cache_bytes, s->budget_, keys));
    s->store_->set_quotas({cfg.default_namespace_quota_bytes, cfg.namespace_quota_bytes});
    s->store_->set_tombstone_limits({cfg.remove_memory, size_t(cfg.max_removes_remembered)});
    // In a cluster, what this node held before it (re)joined is not served until every
    // member has rebalanced for a set with it, handing it the removes made meanwhile:
    // the trim that waits for the same reports lifts the fence (docs/protocol.md,
    // "Removes"). Set before the node serves anything.
    if (!cfg.membership.etcd.endpoints.empty()) {
      KVS_RETURN_IF_ERROR(s->store_->come_back(cfg.remove_memory, std::chrono::system_clock::now()).status());
    }
    if (keys) {
      KVS_LOG_INFO("encryption at rest: {} keys, new writes under key {}; {} objects under other keys or in clear",
                   keys->size(), keys->current_id(), s->store_->objects_under_old_keys());
      s->reencryptor_ = std::make_unique<Reencryptor>(*s->store_, cfg.reencrypt_bytes_per_second);
      s->reencryptor_->kick();
    }
    KVS_ASSIGN_OR_RETURN(s->backend_, transport::create_backend(cfg.backend));
    s->segments_ = std::make_unique<SegmentPool>(*s->backend_, s->budget_, kSegmentBytes);
    KVS_ASSIGN_OR_RETURN(s->listener_, s->backend_->listen(cfg.address));
    s->address_ = s->listener_->address();
    s->acceptor_ = std::thread([p = s.get()] { p->accept_loop(); });
    if (!cfg.membership.etcd.endpoints.empty()) {
      const std::string self = cfg.membership.advertise.empty() ? s->address_ : cfg.membership.advertise;
      KVS_ASSIGN_OR_RETURN(s->rebalancer_, cluster::Rebalancer::start(cfg.membership, self, *s->store_, s->budget_,
                                                                      cfg.secrets, cfg.backend));
      std::lock_guard lock(s->writes_mu_);
      s->write_watch_ = s->rebalancer_.get();
    }
    KVS_LOG_INFO("storage node on {} ({}), {} namespaces, store '{}', memory budget {} MiB", s->address_,
                 s->backend_->capabilities().backend, cfg.secrets.size(), cfg.directory, s->budget_.limit() >> 20);
    return std::unique_ptr<Server>(std::move(s));
  }

  std::string address() const override { return address_; }

  void stop() override {
    if (stopped_.exchange(true)) return;
    {
      std::lock_guard lock(writes_mu_);
      write_watch_ = nullptr;
    }
    rebalancer_.reset();  // leaves the membership before the node stops serving
    stop_.cancel();
    if (acceptor_.joinable()) acceptor_.join();
    std::list<Worker> workers;
    {
      std::lock_guard lock(mu_);
      workers.swap(workers_);
    }
    for (auto& w : workers) w.cancel.cancel(), w.handshake.cancel();
    for (auto& w : workers) w.thread.join();
    std::lock_guard lock(keys_mu_);
    if (reencryptor_) reencrypted_at_stop_ = reencryptor_->reencrypted();
    reencryptor_.reset();
  }

  Status reload_keys() override {
    if (cfg_.at_rest.key_file.empty())
      return make_status(StatusCode::invalid_argument, "the node has no at-rest key file to reload");
    KVS_ASSIGN_OR_RETURN(auto keys, security::KeyRing::load(cfg_.at_rest.key_file));
    std::lock_guard lock(keys_mu_);
    if (stopped_) return make_status(StatusCode::unavailable, "the node is stopping");
    const uint32_t current = keys->current_id();
    const size_t count = keys->size();
    store_->set_keys(std::move(keys));
    KVS_LOG_INFO("at-rest key file reloaded: {} keys, new writes under key {}; {} objects to re-encrypt", count,
                 current, store_->objects_under_old_keys());
    reencryptor_->kick();
    return {};
  }

  void set_namespace_quotas(uint64_t default_bytes, std::map<std::string, uint64_t> per_namespace) override {
    const size_t listed = per_namespace.size();
    store_->set_quotas({default_bytes, std::move(per_namespace)});
    KVS_LOG_INFO("namespace quotas set: {} for each namespace, {} namespaces with their own",
                 default_bytes == 0 ? std::string("no bound") : fmt::format("{} bytes", default_bytes), listed);
  }

  Counters counters() const override {
    Counters c;
    c.requests = requests_, c.errors = errors_, c.bytes_out = bytes_out_, c.bytes_in = bytes_in_;
    c.cache_hits = cache_hits_, c.auth_failures = auth_failures_;
    c.refused_connections = refused_, c.evicted_unauthenticated = preauth_.evicted();
    c.budget_refusals = budget_.refusals(), c.budget_peak_bytes = budget_.peak(), c.budget_limit_bytes = budget_.limit();
    c.objects_under_old_keys = store_->objects_under_old_keys();
    c.quota_refusals = store_->quota_refusals();
    c.use_marks_raised = store_->marks_raised();
    c.removes_remembered = store_->removes_remembered();
    c.fenced_gets = store_->fenced_gets();
    c.fenced = store_->fenced() ? 1 : 0;
    c.transport_peer_entries = listener_->peer_entries();
    c.transport_strays = listener_->strays();
    std::lock_guard lock(keys_mu_);
    c.objects_reencrypted = reencryptor_ ? reencryptor_->reencrypted() : reencrypted_at_stop_;
    return c;
  }
  std::vector<NamespaceUsage> namespace_usage() const override {
    std::vector<std::string> served;
    for (const auto& [ns, secret] : cfg_.secrets) served.push_back(ns);
    for (const auto& [ns, names] : cfg_.tls_clients) served.push_back(ns);
    return store_->namespace_usage(served);
  }

 private:
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
  CancelToken stop_;
  std::atomic<bool> stopped_{false};
  std::thread acceptor_;
  std::mutex mu_;
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
    CancelToken cancel;     // this connection's waits: cancelled at stop
    CancelToken handshake;  // its login's waits: cancelled at stop or eviction
  };
  std::list<Worker> workers_;
  uint32_t authenticated_ = 0;                      // guarded by mu_
  std::map<std::string, uint32_t> per_namespace_;  // connections held per namespace (guarded by mu_)
  std::atomic<uint64_t> requests_{0}, errors_{0}, bytes_out_{0}, bytes_in_{0}, cache_hits_{0}, auth_failures_{0},
      refused_{0};

  void accept_loop() {
    while (!stop_.cancelled()) {
      refused_log_.flush(), login_log_.flush(), conn_log_.flush();
      auto c = listener_->accept(deadline_in(200ms), stop_);
      if (!c.ok()) {
        if (c.status().code() != StatusCode::timed_out && c.status().code() != StatusCode::cancelled)
          refused_log_.note(fmt::format("accept: {}", c.status().to_string()));
        continue;
      }
      std::shared_ptr<Connection> conn = std::move(c).value();
      // Two tokens: the handshake's, which losing the pre-auth place cancels, and the
      // connection's, which only stop() cancels (a login that completed is never
      // undone by a later eviction).
      CancelToken handshake, cancel;
      auto ticket = preauth_.admit(host_of(conn->peer_address()), handshake);
      if (!ticket.ok()) {
        ++refused_;
        refused_log_.note(fmt::format("{}: {}", conn->describe(), ticket.status().message()));
        continue;  // dropping the connection closes it
      }
      std::lock_guard lock(mu_);
      // Join the threads of connections that ended, so a long-running node does not
      // accumulate them.
      for (auto it = workers_.begin(); it != workers_.end();) {
        if (it->done->load()) {
          it->thread.join();
          it = workers_.erase(it);
        } else {
          ++it;
        }
      }
      auto done = std::make_shared<std::atomic<bool>>(false);
      auto t = std::make_shared<PreAuthPool::Ticket>(std::move(ticket).value());
      workers_.push_back({std::thread([this, done, conn, handshake, cancel, t] {
                            serve(*conn, handshake, cancel, *t);
                            done->store(true);
                          }),
                          done, cancel, handshake});
    }
  }

  Status reply(Connection& c, const Response& r, Deadline deadline, const CancelToken& cancel) {
    return c.send(encode(r), {}, deadline, cancel);
  }

  // Challenge-response: the client proves it knows the namespace's secret without
  // sending it. A failure says nothing about which namespaces exist. Its own errors are
  // not logged here: serve() notes them in the rate-limited login log.
  // `ticket` (the pre-auth place) is given back before the answer goes out, so the
  // place of a login that succeeded is never taken from it.
  // A logged-in connection: its namespace, and where its request ids start.
  struct Login {
    std::string ns;
    uint64_t first_id = 0;
  };

  Result<Login> authenticate(Connection& c, const CancelToken& cancel, PreAuthPool::Ticket& ticket) {
    const Deadline deadline = deadline_in(cfg_.auth_timeout);
    KVS_ASSIGN_OR_RETURN(auto nonce, make_nonce());
    Response hello;
    hello.op = Op::hello;
    hello.nonce = nonce;
    hello.features = kFeatureUsage | kFeatureVersions | kFeatureRemoveUpTo | kFeatureIdWindow | kFeatureRemoveBatch |
                     kFeatureServedOnly | kFeatureMembersCheck;
    KVS_RETURN_IF_ERROR(reply(c, hello, deadline, cancel));
    std::vector<std::byte> header;
    KVS_ASSIGN_OR_RETURN(size_t body, c.recv_header(header, deadline, cancel));
    if (body != 0) return detail::unlogged_status(StatusCode::corrupt_data, "authentication message with a body");
    KVS_ASSIGN_OR_RETURN(Request req, decode_request(header));
    Response r;
    r.op = Op::auth;
    r.id = req.id;
    const auto it = cfg_.secrets.find(req.name_space);
    const auto names = cfg_.tls_clients.find(req.name_space);
    const bool known = it != cfg_.secrets.end() || names != cfg_.tls_clients.end();
    // Compute a MAC even for unknown namespaces so timing does not reveal which exist.
    const auto want = auth_mac(it == cfg_.secrets.end() ? std::string(32, '\0') : it->second, nonce, req.name_space);
    const bool secret_ok = it == cfg_.secrets.end() || mac_equal(want, req.mac);
    const bool cert_ok = names == cfg_.tls_clients.end() || certificate_names_one_of(c, names->second);
    if (req.op != Op::auth || !known || !secret_ok || !cert_ok) {
      ++auth_failures_;
      r.code = StatusCode::permission_denied;
      r.message = "authentication failed";
      (void)reply(c, r, deadline, cancel);
      return detail::unlogged_status(StatusCode::permission_denied, "authentication failed from {}", c.describe());
    }
    {
      std::lock_guard lock(mu_);
      uint32_t& held = per_namespace_[req.name_space];
      std::string refusal;
      if (authenticated_ >= cfg_.max_connections)
        refusal = fmt::format("the node holds {} connections, the limit", authenticated_);
      else if (held >= cfg_.max_connections_per_namespace)
        refusal = fmt::format("namespace holds {} connections, the limit", held);
      if (!refusal.empty()) {
        ++refused_;
        r.code = StatusCode::resource_exhausted;
        r.message = refusal;
        (void)reply(c, r, deadline, cancel);
        return detail::unlogged_status(StatusCode::resource_exhausted, "refusing {} for '{}': {}", c.describe(),
                                       req.name_space, refusal);
      }
      ++held, ++authenticated_;
    }
    ticket.release();
    if (Status s = reply(c, r, deadline, cancel); !s.ok()) {
      release_namespace(req.name_space);
      return s;
    }
    return Login{req.name_space, first_request_id(nonce)};
  }

  // Mutual TLS maps certificates to namespaces: it needs TLS on tcp asking for client
  // certificates, and (for now) a secret wherever the node copies chunks to others.
  static Status check_tls_clients(const ServerConfig& cfg) {
    if (cfg.tls_clients.empty()) return {};
    for (const auto& [ns, names] : cfg.tls_clients) {
      KVS_RETURN_IF_ERROR(validate_id(ns, kMaxNamespaceBytes, "namespace"));
      if (names.empty())
        return make_status(StatusCode::invalid_argument, "tls_clients of namespace '{}' lists no certificate name",
                           ns);
      if (!cfg.membership.etcd.endpoints.empty() && !cfg.secrets.count(ns))
        return make_status(StatusCode::invalid_argument,
                           "namespace '{}' has no secret: a node of an etcd cluster logs into other nodes with its "
                           "namespaces' secrets to rebalance them",
                           ns);
    }
    const auto& tls = cfg.backend.tcp.tls;
    if (cfg.backend.name != "tcp" || !tls.enabled || tls.ca_file.empty())
      return make_status(StatusCode::invalid_argument,
                         "tls_clients needs the tcp backend with TLS on and tcp.tls.ca_file (the authorities that "
                         "sign client certificates)");
    return {};
  }

  // Whether the peer's verified certificate carries one of `allowed`.
  static bool certificate_names_one_of(const Connection& c, const std::vector<std::string>& allowed) {
    for (const auto& n : c.peer_certificate_names())
      if (std::find(allowed.begin(), allowed.end(), n) != allowed.end()) return true;
    return false;
  }

  void release_namespace(const std::string& ns) {
    std::lock_guard lock(mu_);
    if (auto it = per_namespace_.find(ns); it != per_namespace_.end() && it->second > 0) --it->second;
    if (authenticated_ > 0) --authenticated_;
  }

  void serve(Connection& c, const CancelToken& handshake, const CancelToken& cancel, PreAuthPool::Ticket& ticket) {
    auto login = authenticate(c, handshake, ticket);
    ticket.release();
    if (!login.ok()) {
      if (login.status().code() != StatusCode::cancelled || !stop_.cancelled())
        login_log_.note(login.status().to_string());
      return;
    }
    const std::string& ns = login->ns;
    struct Release {  // the namespace's connection slot, held while this connection lives
      ServerImpl* self;
      std::string ns;
      ~Release() { self->release_namespace(ns); }
    } release{this, login->ns};
    std::vector<std::byte> header;
    while (!cancel.cancelled()) {
      auto body_len = c.recv_header(header, deadline_in(cfg_.idle_timeout), cancel);
      if (!body_len.ok()) {
        if (body_len.status().code() != StatusCode::cancelled && body_len.status().code() != StatusCode::unavailable)
          conn_log_.note(fmt::format("{}: {}", c.describe(), body_len.status().to_string()));
        return;
      }
      ++requests_;
      auto req = decode_request(header);
      const bool has_body = req.ok() && (req->op == Op::put || req->op == Op::touch ||
                                         (req->op == Op::remove && (req->flags & kRemoveBatch)));
      const bool bad_body = req.ok() && (has_body ? *body_len != segment_bytes(req->total, 0) : *body_len != 0);
      // An id outside the connection's window is another connection's request (a
      // dead connection's message let in by the transport): not done here.
      const bool foreign = req.ok() && !request_id_in_window(req->id, login->first_id);
      if (!req.ok() || bad_body || foreign || req->op == Op::auth || req->op == Op::data) {
        // A malformed request ends the connection: its framing can no longer be trusted.
        ++errors_;
        Response r;
        r.code = req.ok() ? StatusCode::corrupt_data : req.status().code();
        r.message = !req.ok()  ? req.status().message()
                    : foreign ? fmt::format("request id {} is none of this connection's", req->id)
                              : "request out of place or with a body of the wrong size";
        if (req.ok()) r.op = req->op, r.id = req->id;
        (void)reply(c, r, deadline_in(cfg_.idle_timeout), cancel);
        conn_log_.note(fmt::format("closing {}: {}", c.describe(), r.message));
        return;
      }
      Status st;
      try {
        st = handle(c, ns, *req, cancel);
      } catch (const std::bad_alloc&) {
        // Every buffer of a request comes from the budget; this is the system itself
        // running short. The connection goes, the node stays.
        st = make_status(StatusCode::resource_exhausted, "out of memory serving a request");
      }
      if (!st.ok()) {
        conn_log_.note(fmt::format("{}: {}", c.describe(), st.to_string()));
        return;
      }
    }
  }

  // Serves one request. Returns an error only when the connection must end.
  Status handle(Connection& c, const std::string& ns, const Request& req, const CancelToken& cancel) {
    Response r;
    r.op = req.op;
    r.id = req.id;
    r.members_newer = members_newer(req);
    std::vector<std::byte> small;
    auto fail = [&](const Status& s) {
      ++errors_;
      r.code = s.code();
      r.message = s.message();
    };
    switch (req.op) {
      case Op::put: {
        Status outcome;
        KVS_RETURN_IF_ERROR(receive_put(c, ObjectKey{ns, req.context, req.chunk, req.level}, req, cancel, outcome));
        if (!outcome.ok()) fail(outcome);
        break;
      }
      case Op::get:
        return send_get(c, ObjectKey{ns, req.context, req.chunk, req.level}, req, r, cancel);
      case Op::stat: {
        auto s = store_->stat(ns, req.context, /*hide_fenced=*/true);
        if (s.ok()) small = encode_stats(*s, req.flags & kStatVersions);
        else fail(s.status());
        break;
      }
      case Op::remove:
        if (req.flags & kRemoveBatch) {
          Status outcome;
          KVS_RETURN_IF_ERROR(receive_small_body(c, req, cancel, outcome, [&](std::span<const std::byte> body) {
            auto removes = decode_removes(body);
            return removes.ok() ? store_->remove_many(ns, *removes) : removes.status();
          }));
          if (!outcome.ok()) fail(outcome);
        } else if (Status s = store_->remove(ns, req.context,
                                      (req.flags & kRemoveUpTo) ? req.version : std::numeric_limits<uint64_t>::max());
            !s.ok())
          fail(s);
        break;
      case Op::list:
        small = encode_names(store_->list(ns, /*hide_fenced=*/true));
        break;
      case Op::touch: {
        Status outcome;
        KVS_RETURN_IF_ERROR(receive_small_body(c, req, cancel, outcome, [&](std::span<const std::byte> body) {
          auto touches = decode_touches(body);
          return touches.ok() ? store_->touch(ns, *touches, req.version).status() : touches.status();
        }));
        if (!outcome.ok()) fail(outcome);
        break;
      }
      case Op::usage:
        small = encode_usage(store_->usage(ns, req.context, req.after, req.chunk));
        break;
      default:
        fail(make_status(StatusCode::invalid_argument, "unexpected request"));
    }
    if (r.code != StatusCode::ok) small.clear();
    r.checksum = body_checksum(small);
    const auto deadline = deadline_in(cfg_.idle_timeout);
    if (small.empty()) return reply(c, r, deadline, cancel);
    KVS_ASSIGN_OR_RETURN(auto mr, backend_->register_memory(small.data(), small.size(), transport::MemoryType::host));
    KVS_RETURN_IF_ERROR(c.send(encode(r), mr.span(0, small.size()), deadline, cancel));
    bytes_out_ += small.size();
    return {};
  }

  // Whether this node's member set is newer than the one `req` names (a client whose
  // etcd watch is behind: docs/protocol.md, "Member sets"). A node alone, or not yet
  // following its cluster, knows none. A request that names a newer set than this
  // node's has its set read again (this node's watch may be the one behind).
  bool members_newer(const Request& req) {
    if (!(req.flags & kMembersRevision)) return false;
    std::lock_guard lock(writes_mu_);
    if (!write_watch_) return false;
    const int64_t mine = write_watch_->members_revision();
    if (req.members_revision > mine) write_watch_->heard_of_newer_members(req.members_revision);
    return mine > req.members_revision;
  }

  // Receives every segment of a put, streaming them into the store. The whole body is
  // always read off the wire, so a refused put (budget, disk, ids) leaves the
  // connection in step and is answered with its reason (`outcome`). Returns an error
  // only when the connection must end.
  Status receive_put(Connection& c, const ObjectKey& key, const Request& req, const CancelToken& cancel,
                     Status& outcome) {
    Status& st = outcome;
    // Two segments where the put has more than one and a spare is to be had: one is
    // written to the store while the next lands in the other, its receive posted
    // ahead (recv_segmented), so the client need not wait for the write to send it.
    SegmentPool::Segment segs[2];
    std::optional<ChunkStore::PendingPut> pending;
    if (auto s = segments_->acquire(); s.ok()) segs[0] = std::move(s).value();
    else st = s.status();
    if (st.ok() && segment_count(req.total) > 1) segs[1] = segments_->acquire_spare();
    const uint64_t nsegs = segs[1].valid() ? 2 : 1;
    if (st.ok()) {
      if (auto p = store_->begin_put(key, req.total, req.version, req.parts); p.ok())
        pending.emplace(std::move(p).value());
      else st = p.status();
    }
    KVS_RETURN_IF_ERROR(recv_segmented(
        c, true, req.id, req.total, segment_bytes(req.total, 0),
        [&](uint64_t i, uint64_t len) { return st.ok() ? segs[i % nsegs].span(len) : std::span<std::byte>(); },
        [&](std::span<std::byte> got) {
          if (st.ok()) st = pending->append(got);
        },
        cfg_.idle_timeout, cancel, nsegs - 1));
    bytes_in_ += req.total;
    if (st.ok()) st = store_->commit(std::move(*pending), req.checksum);
    if (st.ok()) {
      std::lock_guard lock(writes_mu_);
      if (write_watch_) write_watch_->on_write(key);
    }
    return {};
  }

  // Receives the one-segment body of a touch or a batch of removes (bounded by
  // decode_request) and hands it, its checksum verified, to `apply` (which decodes and
  // does it); the reason it was refused (budget, checksum, a malformed list) goes to
  // `outcome`. As a put's, the body is always read off the wire, so the connection
  // stays in step. Returns an error only when the connection must end.
  template <typename Apply>
  Status receive_small_body(Connection& c, const Request& req, const CancelToken& cancel, Status& outcome,
                            Apply apply) {
    SegmentPool::Segment seg;
    if (auto s = segments_->acquire(); s.ok()) seg = std::move(s).value();
    else outcome = s.status();
    std::span<std::byte> body;
    KVS_RETURN_IF_ERROR(recv_segmented(
        c, true, req.id, req.total, segment_bytes(req.total, 0),
        [&](uint64_t, uint64_t len) { return outcome.ok() ? (body = seg.span(len)) : std::span<std::byte>(); },
        [](std::span<std::byte>) {}, cfg_.idle_timeout, cancel));
    bytes_in_ += req.total;
    if (outcome.ok() && body_checksum(body) != req.checksum)
      outcome = make_status(StatusCode::corrupt_data, "request body failed its checksum");
    if (outcome.ok()) outcome = apply(std::span<const std::byte>(body));
    return {};
  }

  // Sends a get's reply: the object, or the range of it the request asks for, from
  // memory, or streamed from its open file through two segments (one is read while
  // the other is on the wire). The reply's checksum is over exactly the bytes sent.
  Status send_get(Connection& c, const ObjectKey& key, const Request& req, Response& r, const CancelToken& cancel) {
    const auto deadline = deadline_in(cfg_.idle_timeout);
    // An answer without a body (the request's framing is intact: the connection stays).
    auto refuse = [&](const Status& s) {
      ++errors_;
      r.code = s.code(), r.message = s.message();
      r.checksum = 0, r.total = 0;
      return reply(c, r, deadline, cancel);
    };
    auto found = store_->get(key);
    if (!found.ok()) return refuse(found.status());
    cache_hits_ += found->cache_hit;
    uint64_t begin = 0, length = found->size;  // the whole object unless a range is asked for
    if (req.range_length != 0) {
      if (req.range_offset > found->size || req.range_length > found->size - req.range_offset)
        return refuse(make_status(StatusCode::out_of_range, "range [{}, {}) ends past the end of object {} ({} bytes)",
                                  req.range_offset, req.range_offset + req.range_length, key.name(), found->size));
      begin = req.range_offset, length = req.range_length;
    }
    const bool whole = begin == 0 && length == found->size;
    r.total = length;
    if (found->bytes) {
      // Verified when it was read from disk; a range's sum is taken here.
      const Blob& blob = *found->bytes;
      const auto& data = blob.data;
      const auto body = std::span<const std::byte>(data).subspan(begin, length);
      r.checksum = whole ? found->checksum : body_checksum(body);
      if (!data.empty()) {
        std::lock_guard lock(blob.region_mu);
        if (!blob.region.valid()) {
          KVS_ASSIGN_OR_RETURN(blob.region, backend_->register_memory(const_cast<std::byte*>(data.data()), data.size(),
                                                                      transport::MemoryType::host));
        }
      }
      KVS_RETURN_IF_ERROR(send_segmented(
          c, encode(r), body, [&](uint32_t) { return data_response_header(r.id); }, deadline, cancel));
      bytes_out_ += length;
      return {};
    }
    std::array<SegmentPool::Segment, 2> bufs;
    for (auto& b : bufs)
      if (auto s = segments_->acquire(); s.ok()) b = std::move(s).value();
    if (!bufs[0].valid())
      return refuse(make_status(StatusCode::resource_exhausted, "the node's memory budget is full"));
    if (whole) {
      // The stored sum: a damaged payload fails the client's check (and is moved aside below).
      r.checksum = found->checksum;
    } else {
      // Part of an object too large to read whole: the whole object is verified first,
      // the range hashed as it passes, so the reply never vouches for damaged bytes.
      // (The range is read again to be sent; the file is immutable, and should the
      // disk return other bytes the second time the client's check fails.) A sealed
      // object's blocks authenticate themselves as they are opened, so only the range
      // is read: its sum is taken over the blocks it covers.
      const bool sealed = found->file.sealed();
      const uint64_t scan_from = sealed ? begin : 0, scan_to = sealed ? begin + length : found->size;
      XXH3_state_t all, range;
      XXH3_64bits_reset(&all), XXH3_64bits_reset(&range);
      for (uint64_t at = scan_from; at < scan_to; at += kSegmentBytes) {
        const uint64_t len = std::min<uint64_t>(kSegmentBytes, scan_to - at);
        const auto span = bufs[0].span(len);
        if (Status s = found->file.read(at, span); !s.ok()) {
          if (s.code() == StatusCode::corrupt_data) store_->report_corrupt(key, found->file);
          return refuse(s);
        }
        if (!sealed) XXH3_64bits_update(&all, span.data(), span.size());
        const uint64_t from = std::max(at, begin), to = std::min(at + len, begin + length);
        if (from < to) XXH3_64bits_update(&range, span.data() + (from - at), size_t(to - from));
      }
      if (!sealed && XXH3_64bits_digest(&all) != found->checksum) {
        store_->report_corrupt(key, found->file);
        return refuse(make_status(StatusCode::corrupt_data, "object {} failed its checksum on disk", key.name()));
      }
      r.checksum = XXH3_64bits_digest(&range);
    }
    const size_t nbufs = bufs[1].valid() ? 2 : 1;
    const uint64_t n = segment_count(length);
    std::vector<uint64_t> seqs(n);
    // A clear object is hashed as it streams, to find damage the client will report. A
    // sealed one needs no second check: every block it sends passed its tag.
    const bool hashed = !found->file.sealed();
    XXH3_state_t hash;
    XXH3_64bits_reset(&hash);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t len = segment_bytes(length, i);
      if (i >= nbufs) KVS_RETURN_IF_ERROR(c.wait_sends(seqs[i - nbufs], deadline, cancel));  // its buffer is free
      const auto span = bufs[i % nbufs].span(len);
      // A read error after the header has promised the body cannot be put in a reply:
      // the connection ends and the client sees its request fail. A sealed block that
      // fails its tag is never sent; the object is moved aside.
      if (Status s = found->file.read(begin + i * kSegmentBytes, span); !s.ok()) {
        if (s.code() == StatusCode::corrupt_data) store_->report_corrupt(key, found->file);
        return s;
      }
      if (hashed) XXH3_64bits_update(&hash, span.data(), span.size());
      KVS_ASSIGN_OR_RETURN(seqs[i], c.post_send(i == 0 ? encode(r) : data_response_header(r.id), span));
    }
    KVS_RETURN_IF_ERROR(c.wait_sends(seqs[n - 1], deadline, cancel));
    bytes_out_ += length;
    // The client checks the same sum and reports corrupt_data; the node moves the
    // damaged object aside.
    if (hashed && XXH3_64bits_digest(&hash) != r.checksum) store_->report_corrupt(key, found->file);
    return {};
  }
};

}  // namespace

Result<std::unique_ptr<Server>> Server::start(const ServerConfig& config) { return ServerImpl::create(config); }

}  // namespace kvstream::storage
