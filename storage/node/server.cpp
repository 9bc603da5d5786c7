// The storage node's life (server_impl.hpp): its start, its stop, the acceptor that
// hands each connection a thread of its own, and what it reports.
#include <chrono>

#include "core/log.hpp"
#include "storage/cluster/rebalancer.hpp"
#include "storage/node/server_impl.hpp"

namespace kvstream::storage {

using namespace std::chrono_literals;
using transport::CancelToken;
using transport::Connection;
using transport::deadline_in;
using transport::Deadline;

namespace {
constexpr uint64_t kDefaultInflightBytes = uint64_t(256) << 20;
}  // namespace

ServerImpl::ServerImpl(const ServerConfig& cfg)
    : cfg_(cfg),
      budget_(cfg.memory_budget_bytes ? cfg.memory_budget_bytes : cfg.cache_bytes + kDefaultInflightBytes),
      preauth_(cfg.max_unauthenticated, cfg.max_unauthenticated_per_source),
      refused_log_("storage node refused a connection", cfg.log_interval),
      login_log_("storage node login failed", cfg.log_interval),
      conn_log_("storage node closed a connection", cfg.log_interval) {}

ServerImpl::~ServerImpl() { stop(); }

Result<std::unique_ptr<Server>> ServerImpl::create(const ServerConfig& cfg) {
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

void ServerImpl::stop() {
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

Status ServerImpl::reload_keys() {
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

void ServerImpl::set_namespace_quotas(uint64_t default_bytes, std::map<std::string, uint64_t> per_namespace) {
  const size_t listed = per_namespace.size();
  store_->set_quotas({default_bytes, std::move(per_namespace)});
  KVS_LOG_INFO("namespace quotas set: {} for each namespace, {} namespaces with their own",
               default_bytes == 0 ? std::string("no bound") : fmt::format("{} bytes", default_bytes), listed);
}

Server::Counters ServerImpl::counters() const {
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

std::vector<Server::NamespaceUsage> ServerImpl::namespace_usage() const {
  std::vector<std::string> served;
  for (const auto& [ns, secret] : cfg_.secrets) served.push_back(ns);
  for (const auto& [ns, names] : cfg_.tls_clients) served.push_back(ns);
  return store_->namespace_usage(served);
}

void ServerImpl::accept_loop() {
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

Status ServerImpl::reply(Connection& c, const Response& r, Deadline deadline, const CancelToken& cancel) {
  return c.send(encode(r), {}, deadline, cancel);
}

Result<std::unique_ptr<Server>> Server::start(const ServerConfig& config) { return ServerImpl::create(config); }

}  // namespace kvstream::storage
