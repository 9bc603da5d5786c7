// Storage client: requests are pipelined over one or more connections
// (client_channel.hpp). Connections the node closed (its idle timeout, a restart) are
// made again by the client's own thread while the requests that found none alive
// wait (client_redial.hpp); requests lost with their connection that may go twice
// are sent again.
#include <algorithm>
#include <atomic>
#include <future>
#include <mutex>
#include <optional>

#include "core/log.hpp"
#include "storage/backend_client.hpp"
#include "storage/client_channel.hpp"
#include "storage/client_redial.hpp"
#include "storage/members_link.hpp"
#include "storage/node_features.hpp"
#include "storage/protocol.hpp"

namespace kvstream::storage {

using namespace std::chrono_literals;
using transport::CancelToken;
using transport::Clock;
using transport::Connection;
using transport::Deadline;
using transport::deadline_in;
using transport::MemoryRegion;

namespace {

using client_detail::Channel;
using client_detail::Done;
using client_detail::Pending;
using client_detail::Redial;

class ClientImpl final : public BackendClient {
 public:
  explicit ClientImpl(std::shared_ptr<transport::Backend> backend) : BackendClient(std::move(backend)) {}

  /// Over `backend`, or over one of its own made from cfg.backend when that is null.
  /// `members`: the replicated client's member set, named in each request (may be null).
  static Result<std::unique_ptr<Client>> create(const ClientConfig& cfg, std::shared_ptr<transport::Backend> backend,
                                                std::shared_ptr<MembersLink> members, Deadline deadline,
                                                const CancelToken& cancel) {
    KVS_RETURN_IF_ERROR(validate_id(cfg.name_space, kMaxNamespaceBytes, "namespace"));
    if (cfg.connections == 0 || cfg.connections > 64)
      return make_status(StatusCode::invalid_argument, "{} connections (1..64)", cfg.connections);
    if (!backend) {
      KVS_ASSIGN_OR_RETURN(backend, transport::create_backend(cfg.backend));
    }
    auto c = std::make_unique<ClientImpl>(std::move(backend));
    c->cfg_ = cfg;
    c->members_ = std::move(members);
    for (uint32_t i = 0; i < cfg.connections; ++i) {
      KVS_ASSIGN_OR_RETURN(auto ch, c->open_channel(deadline, cancel));
      c->channels_.push_back(std::move(ch));
    }
    return std::unique_ptr<Client>(std::move(c));
  }
  /// node_features.hpp
  [[nodiscard]] uint64_t features() const { return features_.load(std::memory_order_relaxed); }

  // The waiting requests go first (failed, the reconnection stopped), then the
  // channels, under the lock, so that a request a lost connection hands back
  // meanwhile (replay, on that channel's receiver) finds no channel and a closed
  // Redial, and fails rather than waiting for a client being destroyed.
  ~ClientImpl() override {
    redial_.close();
    std::vector<std::shared_ptr<Channel>> channels, retired;
    {
      std::lock_guard lock(channels_mu_);
      channels.swap(channels_), retired.swap(retired_);
    }
  }

  // The parts travel in the put's header (kMaxRequestHeaderBytes); the node keeps them
  // in the object file's header, renamed into place with the bytes.
  Status put_parts(const std::string& context, uint32_t chunk, uint32_t level, std::span<const std::byte> bytes,
                   std::span<const ObjectPart> parts, uint64_t version, Deadline deadline,
                   const CancelToken& cancel) override {
    KVS_RETURN_IF_ERROR(validate_id(context, kMaxContextBytes, "context id"));
    if (level >= kMaxLevels || bytes.size() > kMaxChunkBytes)
      return make_status(StatusCode::out_of_range, "level {} / {} bytes beyond the protocol's bounds", level,
                         bytes.size());
    KVS_RETURN_IF_ERROR(validate_parts(parts, bytes.size()));
    if (version == 0) version = next_write_version();
    MemoryRegion mr;
    if (!bytes.empty()) {
      KVS_ASSIGN_OR_RETURN(mr, register_memory(const_cast<std::byte*>(bytes.data()), bytes.size()));
    }
    Request req;
    req.op = Op::put, req.context = context, req.chunk = chunk, req.level = level;
    req.total = bytes.size(), req.checksum = body_checksum(bytes), req.version = version;
    req.parts.assign(parts.begin(), parts.end());
    KVS_ASSIGN_OR_RETURN(auto r, call(req, bytes, deadline, cancel));
    (void)r;
    return {};
  }

  void get_async(const std::string& context, uint32_t chunk, uint32_t level, MemoryRegion dest, size_t offset,
                 size_t capacity, Deadline deadline, const CancelToken& cancel, GetCallback done) override {
    if (Status s = validate_id(context, kMaxContextBytes, "context id"); !s.ok()) return done(s);
    if (level >= kMaxLevels) return done(make_status(StatusCode::out_of_range, "level {}", level));
    if (dest.span(offset, capacity).size() != capacity || (capacity > 0 && !dest.valid()))
      return done(make_status(StatusCode::invalid_argument, "destination [{}, {}) is outside its registered region",
                              offset, offset + capacity));
    Request req;
    req.op = Op::get, req.context = context, req.chunk = chunk, req.level = level;
    Pending p;
    p.op = Op::get, p.dest = std::move(dest), p.offset = offset, p.capacity = capacity;
    p.deadline = deadline, p.cancel = cancel;
    p.done = [done = std::move(done)](Result<size_t> r, std::vector<std::byte>&&) { done(std::move(r)); };
    submit(std::move(req), {}, std::move(p));
  }

  void get_range_async(const std::string& context, uint32_t chunk, uint32_t level, uint64_t offset, uint64_t length,
                       MemoryRegion dest, size_t dest_offset, Deadline deadline, const CancelToken& cancel,
                       GetCallback done) override {
    if (Status s = validate_id(context, kMaxContextBytes, "context id"); !s.ok()) return done(s);
    if (level >= kMaxLevels) return done(make_status(StatusCode::out_of_range, "level {}", level));
    if (length == 0) return done(make_status(StatusCode::invalid_argument, "a range of 0 bytes"));
    // Past the largest object the protocol carries: past the end of any object.
    if (offset > kMaxChunkBytes || length > kMaxChunkBytes - offset)
      return done(make_status(StatusCode::out_of_range, "range [{}, +{}) past the largest object ({} bytes)", offset,
                              length, kMaxChunkBytes));
    if (!dest.valid() || dest.span(dest_offset, length).size() != length)
      return done(make_status(StatusCode::invalid_argument, "destination [{}, {}) is outside its registered region",
                              dest_offset, dest_offset + length));
    Request req;
    req.op = Op::get, req.context = context, req.chunk = chunk, req.level = level;
    req.range_offset = offset, req.range_length = length;
    Pending p;
    p.op = Op::get, p.dest = std::move(dest), p.offset = dest_offset, p.capacity = size_t(length), p.range = true;
    p.deadline = deadline, p.cancel = cancel;
    p.done = [done = std::move(done)](Result<size_t> r, std::vector<std::byte>&&) { done(std::move(r)); };
    submit(std::move(req), {}, std::move(p));
  }

  Result<std::vector<ChunkStat>> stat(const std::string& context, Deadline deadline,
                                      const CancelToken& cancel) override {
    KVS_RETURN_IF_ERROR(validate_id(context, kMaxContextBytes, "context id"));
    Request req;
    req.op = Op::stat, req.context = context;
    // Asked of every node that declares them (8 bytes a level): what a rebalance checks
    // before it drops a copy. A node from before them ignores the flag and would send
    // a body without them, so it is not asked.
    const bool versions = features_.load(std::memory_order_relaxed) & kFeatureVersions;
    if (versions) req.flags = kStatVersions;
    KVS_ASSIGN_OR_RETURN(auto body, call(req, {}, deadline, cancel));
    return decode_stats(body, versions);
  }

  Status remove(const std::string& context, Deadline deadline, const CancelToken& cancel) override {
    // As of now: a write after this call (a newer version) stays, and the remove may
    // be sent again after a lost connection. A node from before that removes all.
    const bool versioned = features_.load(std::memory_order_relaxed) & kFeatureRemoveUpTo;
    return remove_at(context, versioned ? next_write_version() : 0, deadline, cancel);
  }

  Status remove_up_to(const std::string& context, uint64_t version, Deadline deadline,
                      const CancelToken& cancel) override {
    if (version == 0) return make_status(StatusCode::invalid_argument, "remove_up_to: version 0 names no write");
    if (!(features_.load(std::memory_order_relaxed) & kFeatureRemoveUpTo))
      return make_status(StatusCode::unsupported, "node {} is from before versioned removes", cfg_.address);
    return remove_at(context, version, deadline, cancel);
  }

  // Batches of at most one segment's worth of removes, each its own request.
  Status remove_many(std::span<const ContextRemove> removes, Deadline deadline, const CancelToken& cancel) override {
    if (!(features_.load(std::memory_order_relaxed) & kFeatureRemoveBatch))
      return Client::remove_many(removes, deadline, cancel);
    for (const ContextRemove& r : removes) {
      KVS_RETURN_IF_ERROR(validate_id(r.context, kMaxContextBytes, "context id"));
      if (r.version == 0) return make_status(StatusCode::invalid_argument, "remove_many: version 0 names no write");
    }
    Request req;
    req.op = Op::remove, req.flags = kRemoveBatch;
    return send_batches(removes, remove_wire_bytes, kMaxRemoveBatchBytes, encode_removes, req, deadline, cancel);
  }

  Result<std::vector<std::string>> list(Deadline deadline, const CancelToken& cancel) override {
    Request req;
    req.op = Op::list;
    KVS_ASSIGN_OR_RETURN(auto body, call(req, {}, deadline, cancel));
    return decode_names(body);
  }

  // Batches of at most one segment's worth of entries, each its own request.
  Status touch(std::span<const ContextTouch> contexts, uint64_t stamp, Deadline deadline,
               const CancelToken& cancel) override {
    for (const ContextTouch& t : contexts) KVS_RETURN_IF_ERROR(validate_id(t.context, kMaxContextBytes, "context id"));
    KVS_RETURN_IF_ERROR(need_usage_feature());
    if (stamp == 0) stamp = next_write_version();
    Request req;
    req.op = Op::touch, req.version = stamp;
    return send_batches(contexts, touch_wire_bytes, kMaxTouchBodyBytes, encode_touches, req, deadline, cancel);
  }

  Result<std::vector<ContextUsage>> usage(const std::string& prefix, Deadline deadline,
                                          const CancelToken& cancel) override {
    if (!prefix.empty()) KVS_RETURN_IF_ERROR(validate_id(prefix, kMaxContextBytes, "usage prefix"));
    KVS_RETURN_IF_ERROR(need_usage_feature());
    std::vector<ContextUsage> out;
    for (;;) {
      Request req;
      req.op = Op::usage, req.context = prefix, req.chunk = kUsagePage;
      if (!out.empty()) req.after = out.back().context;
      KVS_ASSIGN_OR_RETURN(auto body, call(req, {}, deadline, cancel));
      KVS_ASSIGN_OR_RETURN(auto page, decode_usage(body));
      // Each page starts after the last one's end; a node answering otherwise would
      // have this loop go round for ever.
      if (!page.empty() && !out.empty() && !(out.back().context < page.front().context))
        return make_status(StatusCode::corrupt_data, "usage page did not start after '{}'", out.back().context);
      for (const auto& u : page)
        if (!u.context.starts_with(prefix))
          return make_status(StatusCode::corrupt_data, "usage listed '{}' for the prefix '{}'", u.context, prefix);
      // A node ends a page short of the entries asked for only once its body reaches
      // kMaxUsageBodyBytes: a shorter page under that is the last, and saves the round
      // trip that would fetch an empty one.
      const bool last = page.empty() || (page.size() < kUsagePage && body.size() < kMaxUsageBodyBytes);
      std::move(page.begin(), page.end(), std::back_inserter(out));
      if (last) return out;
    }
  }

 private:
  static constexpr uint32_t kUsagePage = 4096;

  // Sends `items` in requests like `head`, each with a body of as many as fit in
  // `max_body` bytes (a u32 count, then `wire` bytes each, as `encode` writes them).
  template <typename T, typename Encode>
  Status send_batches(std::span<const T> items, size_t (*wire)(const T&), uint64_t max_body, Encode encode,
                      const Request& head, Deadline deadline, const CancelToken& cancel) {
    size_t first = 0;
    while (first < items.size()) {
      size_t bytes = 4, end = first;
      while (end < items.size() && bytes + wire(items[end]) <= max_body) bytes += wire(items[end++]);
      auto body = encode(items.subspan(first, end - first));
      KVS_ASSIGN_OR_RETURN(auto mr, register_memory(body.data(), body.size()));
      (void)mr;
      Request req = head;
      req.total = body.size(), req.checksum = body_checksum(body);
      KVS_ASSIGN_OR_RETURN(auto reply, call(req, body, deadline, cancel));
      (void)reply;
      first = end;
    }
    return {};
  }

  // A remove of the writes up to `version` (0: all, for a node from before versions).
  Status remove_at(const std::string& context, uint64_t version, Deadline deadline, const CancelToken& cancel) {
    KVS_RETURN_IF_ERROR(validate_id(context, kMaxContextBytes, "context id"));
    Request req;
    req.op = Op::remove, req.context = context;
    if (version != 0) req.flags = kRemoveUpTo, req.version = version;
    KVS_ASSIGN_OR_RETURN(auto body, call(req, {}, deadline, cancel));
    (void)body;
    return {};
  }
  ClientConfig cfg_;
  std::shared_ptr<MembersLink> members_;  // members_link.hpp; null outside a replicated client
  std::mutex channels_mu_;  // channels_, retired_
  std::vector<std::shared_ptr<Channel>> channels_;
  std::vector<std::shared_ptr<Channel>> retired_;  // lost, until their receivers return
  // A reconnection (on Redial's thread, one at a time) has at most kReconnectBound
  // to connect and log in (a node that still listens but no longer serves would
  // otherwise hold the requests to their deadlines); after a failed one, requests
  // answer its error for a pause that doubles from kReconnectPause up to
  // kReconnectPauseMax. Only the reconnection touches last_reconnect_*,
  // reconnect_pause_.
  static constexpr auto kReconnectBound = std::chrono::milliseconds(1000);
  static constexpr auto kReconnectPause = std::chrono::milliseconds(100);
  static constexpr auto kReconnectPauseMax = std::chrono::milliseconds(5000);
  Clock::time_point last_reconnect_at_{};
  Clock::duration reconnect_pause_ = kReconnectPause;
  Status last_reconnect_;
  std::atomic<uint64_t> rr_{0};
  std::atomic<uint64_t> features_{0};  // what the node's hello declared (kFeature*)
  Redial redial_{[this](Deadline d, const CancelToken& c) { return reconnect(d, c); },
                 [this](Request req, std::span<const std::byte> body, Pending p) {
                   submit(std::move(req), body, std::move(p));
                 }};

  Status need_usage_feature() const {
    if (features_.load(std::memory_order_relaxed) & kFeatureUsage) return {};
    return Status(StatusCode::unsupported, "the storage node keeps no use marks (a node from before 2026-12-06)");
  }

  // Logs in; returns the node's hello (its features, its nonce).
  static Result<Response> authenticate(Connection& c, const ClientConfig& cfg, Deadline deadline,
                                       const CancelToken& cancel) {
    std::vector<std::byte> header;
    KVS_ASSIGN_OR_RETURN(size_t len, c.recv_header(header, deadline, cancel));
    KVS_RETURN_IF_ERROR(c.recv_body({}, deadline, cancel));
    KVS_ASSIGN_OR_RETURN(Response hello, decode_response(header));
    if (hello.op != Op::hello || len != 0) return make_status(StatusCode::corrupt_data, "server did not say hello");
    Request auth;
    auth.op = Op::auth;
    auth.name_space = cfg.name_space;
    auth.mac = auth_mac(cfg.secret, hello.nonce, cfg.name_space);
    KVS_RETURN_IF_ERROR(c.send(encode(auth), {}, deadline, cancel));
    KVS_ASSIGN_OR_RETURN(len, c.recv_header(header, deadline, cancel));
    KVS_RETURN_IF_ERROR(c.recv_body({}, deadline, cancel));
    KVS_ASSIGN_OR_RETURN(Response r, decode_response(header));
    // A node at its connection limit for the namespace says so; any other refusal is
    // reported as permission_denied with no detail (nothing about what exists).
    if (r.code == StatusCode::resource_exhausted)
      return make_status(StatusCode::resource_exhausted, "storage node {} refused a connection for '{}': {}",
                         cfg.address, cfg.name_space, r.message);
    if (r.code != StatusCode::ok)
      return make_status(StatusCode::permission_denied, "storage node {} refused namespace '{}'", cfg.address,
                         cfg.name_space);
    return hello;
  }

  // A connection, logged in; the node's features go to features_.
  Result<std::shared_ptr<Channel>> open_channel(Deadline deadline, const CancelToken& cancel) {
    KVS_ASSIGN_OR_RETURN(auto conn, backend_->connect(cfg_.address, deadline, cancel));
    KVS_ASSIGN_OR_RETURN(Response hello, authenticate(*conn, cfg_, deadline, cancel));
    features_.store(hello.features, std::memory_order_relaxed);
    // A node that keeps each connection to its window of ids gets ids from it.
    const uint64_t first_id = (hello.features & kFeatureIdWindow) ? first_request_id(hello.nonce) : 0;
    return std::make_shared<Channel>(
        std::move(conn), backend_.get(),
        [this](Request req, Pending p, const Status& why) { replay(std::move(req), std::move(p), why); }, first_id,
        members_);
  }

  // A live channel, round robin; null when none is alive. Errors: cancelled
  // (~ClientImpl).
  Result<std::shared_ptr<Channel>> live_channel() {
    const size_t start = size_t(rr_.fetch_add(1));
    std::lock_guard lock(channels_mu_);
    const size_t n = channels_.size();
    if (n == 0) return make_status(StatusCode::cancelled, "storage client closed");
    for (size_t i = 0; i < n; ++i)
      if (channels_[(start + i) % n]->alive()) return channels_[(start + i) % n];
    return std::shared_ptr<Channel>();
  }

  // With no live channel (the node closed them: its idle timeout, a restart),
  // connects and logs in again within `deadline` and kReconnectBound; Redial's
  // attempt, one at a time.
  Status reconnect(Deadline deadline, const CancelToken& cancel) {
    size_t lost = 0;  // all of them
    {
      std::lock_guard lock(channels_mu_);
      for (const auto& ch : channels_)
        if (ch->alive()) return {};
      lost = channels_.size();
      if (lost == 0) return make_status(StatusCode::cancelled, "storage client closed");
    }
    // A node that is down is not dialled again for every request: after a failed
    // try, its error stands for the pause.
    if (!last_reconnect_.ok() && Clock::now() - last_reconnect_at_ < reconnect_pause_) return last_reconnect_;
    const Deadline bound = std::min(deadline, Clock::now() + kReconnectBound);
    // Every lost connection is made again (the client's parallelism comes back), as
    // long as they succeed; the first failure ends the round.
    std::vector<std::shared_ptr<Channel>> fresh;
    for (size_t i = 0; i < lost; ++i) {
      auto ch = open_channel(bound, cancel);
      if (!ch.ok()) {
        if (fresh.empty()) {
          if (!last_reconnect_.ok()) reconnect_pause_ = std::min<Clock::duration>(reconnect_pause_ * 2, kReconnectPauseMax);
          last_reconnect_at_ = Clock::now();
          last_reconnect_ = ch.status().with_context(fmt::format("storage node {}: connecting again", cfg_.address));
          return last_reconnect_;
        }
        break;
      }
      fresh.push_back(std::move(ch).value());
    }
    last_reconnect_ = {};
    reconnect_pause_ = kReconnectPause;
    KVS_LOG_INFO("storage client: connected again to {} for '{}' ({} of {} connections)", cfg_.address,
                 cfg_.name_space, fresh.size(), lost);
    std::vector<std::shared_ptr<Channel>> reaped;  // destroyed outside the lock
    {
      std::lock_guard lock(channels_mu_);
      if (channels_.size() < fresh.size()) return make_status(StatusCode::cancelled, "storage client closed");
      for (size_t i = 0; i < fresh.size(); ++i) {
        retired_.push_back(std::move(channels_[i]));
        channels_[i] = fresh[i];
      }
      // A lost channel goes once its receiver has returned and no call holds it.
      for (auto it = retired_.begin(); it != retired_.end();)
        if ((*it)->finished() && it->use_count() == 1) reaped.push_back(std::move(*it)), it = retired_.erase(it);
        else ++it;
    }
    return {};
  }

  // What a put sent again writes: the object and the write's version.
  struct WriteId {
    std::string context;
    uint32_t chunk = 0, level = 0;
    uint64_t version = 0;
  };

  // A request whose connection was lost (`why`), sent again (Pending::replay); on the
  // lost channel's receiver thread or the sender's. If that fails too, the caller
  // learns both: the loss first (its code), then what the second try met; an answer
  // of the node (not found, no space, busy), its deadline or a cancel stay what they
  // are.
  void replay(Request req, Pending p, const Status& why) {
    KVS_LOG_DEBUG("storage client: a request (op {}) on '{}' sent again on a fresh connection to {}", int(req.op),
                  req.context, cfg_.address);
    std::optional<WriteId> write;
    if (req.op == Op::put) write = WriteId{req.context, req.chunk, req.level, req.version};
    // A remove whose first try was done finds nothing the second time: done.
    const bool removes = req.op == Op::remove;
    const auto body = p.replay_body;
    p.done = [this, done = std::move(p.done), why, deadline = p.deadline, cancel = p.cancel, write = std::move(write),
              removes](Result<size_t> r, std::vector<std::byte>&& b) mutable {
      const StatusCode code = r.ok() ? StatusCode::ok : r.status().code();
      if (removes && code == StatusCode::not_found) return done(size_t(0), {});
      if (write && code == StatusCode::already_exists)
        return confirm_write(*write, r.status(), deadline, cancel, std::move(done));
      // (A reconnection's own bound, short of the call's deadline, is not the call's
      // timeout: that one is combined with the loss like any other failure.)
      const bool past_deadline = code == StatusCode::timed_out && Clock::now() >= deadline;
      if (code == StatusCode::ok || past_deadline || code == StatusCode::cancelled || code == StatusCode::not_found ||
          code == StatusCode::out_of_range || code == StatusCode::already_exists || code == StatusCode::no_space ||
          code == StatusCode::resource_exhausted)
        return done(std::move(r), std::move(b));
      done(Status(why.code(), fmt::format("{}; sent again: {}", why.message(), r.status().message())), {});
    };
    submit(std::move(req), body, std::move(p));
  }

  // A put sent again that the node refused as not newer than the write it holds, or
  // than a remove it remembers (`refused`): either its first try was done (the answer
  // was lost with the connection), or another client's newer write got there first.
  // The version the node holds tells which: the put succeeded where it is the put's
  // own, and where the node holds none (a remove covered its version: the first try
  // was done and then removed, or is ordered before that remove). A node that does
  // not say its versions leaves the refusal standing.
  void confirm_write(const WriteId& w, Status refused, Deadline deadline, const CancelToken& cancel, Done done) {
    if (!(features_.load(std::memory_order_relaxed) & kFeatureVersions)) return done(std::move(refused), {});
    Request req;
    req.op = Op::stat, req.context = w.context, req.flags = kStatVersions;
    Pending p;
    p.op = Op::stat, p.deadline = deadline, p.cancel = cancel;
    p.done = [w, refused = std::move(refused), done = std::move(done)](Result<size_t> r, std::vector<std::byte>&& b) {
      if (!r.ok()) return done(r.status().code() == StatusCode::not_found ? Result<size_t>(size_t(0)) : refused, {});
      auto stats = decode_stats(b, true);
      if (!stats.ok()) return done(refused, {});
      for (const ChunkStat& cs : *stats)
        if (cs.chunk == w.chunk && w.level < cs.level_versions.size() && cs.level_versions[w.level] != 0)
          return done(cs.level_versions[w.level] == w.version ? Result<size_t>(size_t(0)) : refused, {});
      done(size_t(0), {});  // none held: a remove covered it
    };
    submit(std::move(req), {}, std::move(p));
  }

  // Sends `req` on a live channel, or has it wait while Redial connects again;
  // `p.done` runs exactly once.
  void submit(Request req, std::span<const std::byte> body, Pending p) {
    name_members(req);
    auto ch = live_channel();
    if (!ch.ok()) return p.done(ch.status(), {});
    if (*ch) return (*ch)->submit(std::move(req), body, std::move(p));
    redial_.wait(std::move(req), body, std::move(p));
  }

  // The member set the request is sent under, to a node that checks it (as of this
  // send: a request sent again names the set as it is then, and a node that came back
  // without the feature is sent none).
  void name_members(Request& req) const {
    req.flags &= ~kMembersRevision, req.members_revision = 0;
    if (!members_ || !(features_.load(std::memory_order_relaxed) & kFeatureMembersCheck)) return;
    if (const int64_t revision = members_->revision(); revision > 0)
      req.flags |= kMembersRevision, req.members_revision = revision;
  }

  // A blocking request whose small response body comes back as bytes.
  Result<std::vector<std::byte>> call(Request req, std::span<const std::byte> body, Deadline deadline,
                                      const CancelToken& cancel) {
    auto promise = std::make_shared<std::promise<Result<std::vector<std::byte>>>>();
    auto future = promise->get_future();
    Pending p;
    p.op = req.op, p.deadline = deadline, p.cancel = cancel;
    p.done = [promise](Result<size_t> r, std::vector<std::byte>&& b) {
      if (r.ok()) promise->set_value(std::move(b));
      else promise->set_value(r.status());
    };
    submit(std::move(req), body, std::move(p));
    return future.get();
  }
};

}  // namespace

uint64_t node_features(const Client& client) {
  const auto* node = dynamic_cast<const ClientImpl*>(&client);
  return node ? node->features() : 0;
}

Result<std::unique_ptr<Client>> Client::connect(const ClientConfig& config, Deadline deadline,
                                                const CancelToken& cancel) {
  return ClientImpl::create(config, nullptr, nullptr, deadline, cancel);
}

Result<std::unique_ptr<Client>> Client::connect(const ClientConfig& config, std::shared_ptr<transport::Backend> backend,
                                                Deadline deadline, const CancelToken& cancel) {
  if (!backend) return make_status(StatusCode::invalid_argument, "storage client: no backend to connect over");
  return ClientImpl::create(config, std::move(backend), nullptr, deadline, cancel);
}

Result<std::unique_ptr<Client>> connect_following_members(const ClientConfig& config,
                                                          std::shared_ptr<transport::Backend> backend,
                                                          std::shared_ptr<MembersLink> link, Deadline deadline,
                                                          const CancelToken& cancel) {
  if (!backend) return make_status(StatusCode::invalid_argument, "storage client: no backend to connect over");
  return ClientImpl::create(config, std::move(backend), std::move(link), deadline, cancel);
}

Status Client::remove_up_to(const std::string&, uint64_t, Deadline, const CancelToken&) {
  return Status(StatusCode::unsupported, "this storage client keeps no write versions");
}

Status Client::remove_many(std::span<const ContextRemove> removes, Deadline deadline, const CancelToken& cancel) {
  for (const ContextRemove& r : removes)
    if (Status s = remove_up_to(r.context, r.version, deadline, cancel); !s.ok() && s.code() != StatusCode::not_found)
      return s;
  return {};
}

Status Client::touch(std::span<const ContextTouch>, uint64_t, Deadline, const CancelToken&) {
  return Status(StatusCode::unsupported, "this storage client keeps no use marks");
}

Result<std::vector<ContextUsage>> Client::usage(const std::string&, Deadline, const CancelToken&) {
  return Status(StatusCode::unsupported, "this storage client keeps no use marks");
}

Result<MemoryRegion> Client::register_memory(void* data, size_t size, transport::MemoryType type) {
  if (type == transport::MemoryType::host) return register_memory(data, size);
  return make_status(StatusCode::unsupported,
                     "this storage client registers host memory only, not {} memory (it reports no transport "
                     "capabilities that would allow it)",
                     transport::memory_type_name(type));
}

Status Client::put_parts(const std::string& context, uint32_t chunk, uint32_t level, std::span<const std::byte> bytes,
                         std::span<const ObjectPart> parts, uint64_t version, Deadline deadline,
                         const CancelToken& cancel) {
  KVS_RETURN_IF_ERROR(validate_parts(parts, bytes.size()));
  if (!parts.empty()) return make_status(StatusCode::unsupported, "this storage client does not keep parts tables");
  return put_versioned(context, chunk, level, bytes, version == 0 ? next_write_version() : version, deadline, cancel);
}

void Client::get_range_async(const std::string&, uint32_t, uint32_t, uint64_t, uint64_t, MemoryRegion, size_t, Deadline,
                             const CancelToken&, GetCallback done) {
  done(make_status(StatusCode::unsupported, "this storage client does not read ranges of objects"));
}

Result<size_t> Client::get_range(const std::string& context, uint32_t chunk, uint32_t level, uint64_t offset,
                                 uint64_t length, MemoryRegion dest, size_t dest_offset, Deadline deadline,
                                 const CancelToken& cancel) {
  auto promise = std::make_shared<std::promise<Result<size_t>>>();
  auto f = promise->get_future();
  get_range_async(context, chunk, level, offset, length, std::move(dest), dest_offset, deadline, cancel,
                  [promise](Result<size_t> r) { promise->set_value(std::move(r)); });
  return f.get();
}

Result<size_t> Client::get(const std::string& context, uint32_t chunk, uint32_t level, MemoryRegion dest,
                           size_t offset, size_t capacity, Deadline deadline, const CancelToken& cancel) {
  return get_future(context, chunk, level, std::move(dest), offset, capacity, deadline, cancel).get();
}

std::future<Result<size_t>> Client::get_future(const std::string& context, uint32_t chunk, uint32_t level,
                                               MemoryRegion dest, size_t offset, size_t capacity, Deadline deadline,
                                               const CancelToken& cancel) {
  auto promise = std::make_shared<std::promise<Result<size_t>>>();
  auto f = promise->get_future();
  get_async(context, chunk, level, std::move(dest), offset, capacity, deadline, cancel,
            [promise](Result<size_t> r) { promise->set_value(std::move(r)); });
  return f;
}

}  // namespace kvstream::storage
