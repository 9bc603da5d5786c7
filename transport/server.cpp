// The storage node: accepts connections on any backend, authenticates each against
// its namespace secret, then serves requests in order, one thread per connection.
#include <atomic>
#include <map>
#include <thread>

#include "core/log.hpp"
#include "transport/chunk_store.hpp"
#include "transport/protocol.hpp"

namespace kvstream::storage {

using namespace std::chrono_literals;
using transport::CancelToken;
using transport::Connection;
using transport::deadline_in;

namespace {

class ServerImpl final : public Server {
 public:
  ~ServerImpl() override { stop(); }

  static Result<std::unique_ptr<Server>> create(const ServerConfig& cfg) {
    auto s = std::make_unique<ServerImpl>();
    s->cfg_ = cfg;
    if (cfg.secrets.empty()) return make_status(StatusCode::invalid_argument, "server needs at least one namespace");
    for (const auto& [ns, secret] : cfg.secrets) {
      KVS_RETURN_IF_ERROR(validate_id(ns, kMaxNamespaceBytes, "namespace"));
      if (secret.size() < 16)
        return make_status(StatusCode::invalid_argument, "secret of namespace '{}' is shorter than 16 bytes", ns);
    }
    KVS_ASSIGN_OR_RETURN(s->store_, ChunkStore::open(cfg.directory, cfg.cache_bytes));
    KVS_ASSIGN_OR_RETURN(s->backend_, transport::create_backend(cfg.backend));
    KVS_ASSIGN_OR_RETURN(s->listener_, s->backend_->listen(cfg.address));
    s->address_ = s->listener_->address();
    s->acceptor_ = std::thread([p = s.get()] { p->accept_loop(); });
    KVS_LOG_INFO("storage node on {} ({}), {} namespaces, store '{}'", s->address_,
                 s->backend_->capabilities().backend, cfg.secrets.size(), cfg.directory);
    return std::unique_ptr<Server>(std::move(s));
  }

  std::string address() const override { return address_; }

  void stop() override {
    if (stopped_.exchange(true)) return;
    stop_.cancel();
    if (acceptor_.joinable()) acceptor_.join();
    std::vector<Worker> workers;
    {
      std::lock_guard lock(mu_);
      workers.swap(workers_);
    }
    for (auto& w : workers) w.thread.join();
  }

  Counters counters() const override {
    Counters c;
    c.requests = requests_, c.errors = errors_, c.bytes_out = bytes_out_, c.bytes_in = bytes_in_;
    c.cache_hits = cache_hits_, c.auth_failures = auth_failures_;
    return c;
  }

 private:
  ServerConfig cfg_;
  std::unique_ptr<ChunkStore> store_;
  std::unique_ptr<transport::Backend> backend_;
  std::unique_ptr<transport::Listener> listener_;
  std::string address_;
  CancelToken stop_;
  std::atomic<bool> stopped_{false};
  std::thread acceptor_;
  std::mutex mu_;
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Worker> workers_;
  std::atomic<uint32_t> active_{0};
  std::map<std::string, uint32_t> per_namespace_;  // connections held per namespace (guarded by mu_)
  std::atomic<uint64_t> requests_{0}, errors_{0}, bytes_out_{0}, bytes_in_{0}, cache_hits_{0}, auth_failures_{0};

  void accept_loop() {
    while (!stop_.cancelled()) {
      auto c = listener_->accept(deadline_in(200ms), stop_);
      if (!c.ok()) {
        if (c.status().code() != StatusCode::timed_out && c.status().code() != StatusCode::cancelled)
          KVS_LOG_WARN("accept: {}", c.status().to_string());
        continue;
      }
      if (active_.load() >= cfg_.max_connections) {
        KVS_LOG_WARN("refusing {}: {} connections is the limit", (*c)->describe(), cfg_.max_connections);
        continue;  // dropping the connection closes it
      }
      ++active_;
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
      workers_.push_back({std::thread([this, done, conn = std::shared_ptr<Connection>(std::move(c).value())] {
                            serve(*conn);
                            --active_;
                            done->store(true);
                          }),
                          done});
    }
  }

  Status reply(Connection& c, const Response& r, std::span<const std::byte> body) {
    return c.send(encode(r), body, deadline_in(cfg_.idle_timeout), stop_);
  }

  // Challenge-response: the client proves it knows the namespace's secret without
  // sending it. A failure says nothing about which namespaces exist.
  Result<std::string> authenticate(Connection& c) {
    KVS_ASSIGN_OR_RETURN(auto nonce, make_nonce());
    Response hello;
    hello.op = Op::hello;
    hello.nonce = nonce;
    KVS_RETURN_IF_ERROR(reply(c, hello, {}));
    std::vector<std::byte> header;
    KVS_ASSIGN_OR_RETURN(size_t body, c.recv_header(header, deadline_in(10s), stop_));
    if (body != 0) return make_status(StatusCode::corrupt_data, "authentication message with a body");
    KVS_ASSIGN_OR_RETURN(Request req, decode_request(header));
    Response r;
    r.op = Op::auth;
    r.id = req.id;
    const auto it = cfg_.secrets.find(req.name_space);
    // Compute a MAC even for unknown namespaces so timing does not reveal which exist.
    const auto want = auth_mac(it == cfg_.secrets.end() ? std::string(32, '\0') : it->second, nonce, req.name_space);
    if (req.op != Op::auth || it == cfg_.secrets.end() || !mac_equal(want, req.mac)) {
      ++auth_failures_;
      r.code = StatusCode::permission_denied;
      r.message = "authentication failed";
      (void)reply(c, r, {});
      return make_status(StatusCode::permission_denied, "authentication failed from {}", c.describe());
    }
    {
      std::lock_guard lock(mu_);
      uint32_t& held = per_namespace_[req.name_space];
      if (held >= cfg_.max_connections_per_namespace) {
        r.code = StatusCode::resource_exhausted;
        r.message = fmt::format("namespace holds {} connections, the limit", held);
        (void)reply(c, r, {});
        return make_status(StatusCode::resource_exhausted, "refusing {}: namespace '{}' holds {} connections",
                           c.describe(), req.name_space, held);
      }
      ++held;
    }
    if (Status s = reply(c, r, {}); !s.ok()) {
      release_namespace(req.name_space);
      return s;
    }
    return req.name_space;
  }

  void release_namespace(const std::string& ns) {
    std::lock_guard lock(mu_);
    if (auto it = per_namespace_.find(ns); it != per_namespace_.end() && it->second > 0) --it->second;
  }

  void serve(Connection& c) {
    auto ns = authenticate(c);
    if (!ns.ok()) {
      KVS_LOG_WARN("{}", ns.status().to_string());
      return;
    }
    struct Release {  // the namespace's connection slot, held while this connection lives
      ServerImpl* self;
      std::string ns;
      ~Release() { self->release_namespace(ns); }
    } release{this, *ns};
    std::vector<std::byte> header, in_body;
    while (!stop_.cancelled()) {
      auto body_len = c.recv_header(header, deadline_in(cfg_.idle_timeout), stop_);
      if (!body_len.ok()) {
        if (body_len.status().code() != StatusCode::cancelled && body_len.status().code() != StatusCode::unavailable)
          KVS_LOG_WARN("connection {}: {}", c.describe(), body_len.status().to_string());
        return;
      }
      ++requests_;
      auto req = decode_request(header);
      if (!req.ok() || *body_len > kMaxChunkBytes || (req->op != Op::put && *body_len != 0)) {
        // A malformed request ends the connection: its framing can no longer be trusted.
        ++errors_;
        Response r;
        r.code = req.ok() ? StatusCode::out_of_range : req.status().code();
        r.message = req.ok() ? "request body too large" : req.status().message();
        if (req.ok()) r.op = req->op, r.id = req->id;
        (void)reply(c, r, {});
        KVS_LOG_WARN("closing {}: {}", c.describe(), r.message);
        return;
      }
      Status st = handle(c, *ns, *req, *body_len, in_body);
      if (!st.ok()) {
        KVS_LOG_WARN("connection {}: {}", c.describe(), st.to_string());
        return;
      }
    }
  }

  Status handle(Connection& c, const std::string& ns, const Request& req, size_t body_len,
                std::vector<std::byte>& in_body) {
    Response r;
    r.op = req.op;
    r.id = req.id;
    Bytes out;
    std::vector<std::byte> small;
    auto fail = [&](const Status& s) {
      ++errors_;
      r.code = s.code();
      r.message = s.message();
    };
    switch (req.op) {
      case Op::put: {
        in_body.resize(body_len);
        KVS_ASSIGN_OR_RETURN(auto mr, backend_->register_memory(in_body.data(), std::max<size_t>(1, body_len),
                                                                transport::MemoryType::host));
        KVS_RETURN_IF_ERROR(c.recv_body(mr.span(0, body_len), deadline_in(cfg_.idle_timeout), stop_));
        bytes_in_ += body_len;
        if (Status s = store_->put(ns, req.context, req.chunk, req.level, in_body); !s.ok()) fail(s);
        break;
      }
      case Op::get: {
        bool hit = false;
        auto b = store_->get(ns, req.context, req.chunk, req.level, &hit);
        if (!b.ok()) {
          fail(b.status());
          break;
        }
        cache_hits_ += hit;
        out = *b;
        break;
      }
      case Op::stat: {
        auto s = store_->stat(ns, req.context);
        if (s.ok()) small = encode_stats(*s);
        else fail(s.status());
        break;
      }
      case Op::remove:
        if (Status s = store_->remove(ns, req.context); !s.ok()) fail(s);
        break;
      case Op::list:
        small = encode_names(store_->list(ns));
        break;
      default:
        fail(make_status(StatusCode::invalid_argument, "unexpected request"));
    }
    std::span<const std::byte> body = out ? std::span<const std::byte>(*out) : std::span<const std::byte>(small);
    if (r.code != StatusCode::ok) body = {};
    r.checksum = body_checksum(body);
    if (!body.empty()) {
      // Registration is cached per buffer; cache entries keep their address.
      KVS_ASSIGN_OR_RETURN(auto mr, backend_->register_memory(const_cast<std::byte*>(body.data()), body.size(),
                                                              transport::MemoryType::host));
      (void)mr;  // keeps the registration alive across the send
      KVS_RETURN_IF_ERROR(reply(c, r, body));
    } else {
      KVS_RETURN_IF_ERROR(reply(c, r, {}));
    }
    bytes_out_ += body.size();
    return {};
  }
};

}  // namespace

Result<std::unique_ptr<Server>> Server::start(const ServerConfig& config) { return ServerImpl::create(config); }

}  // namespace kvstream::storage
