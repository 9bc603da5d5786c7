// Storage client: requests are pipelined over one or more connections; a receiver
// thread per connection matches responses to requests by id and lands each chunk
// straight in the caller's registered buffer, verifying its checksum first. A
// connection the node closed (its idle timeout, a restart) is made again by the next
// call that finds none alive.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "core/log.hpp"
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

// One outstanding request.
struct Pending {
  Op op = Op::get;
  MemoryRegion dest;  // where the body lands (get), or empty
  size_t offset = 0, capacity = 0;
  bool range = false;  // a range get: the body must be exactly `capacity` bytes
  Deadline deadline;
  CancelToken cancel;
  std::function<void(Result<size_t>, std::vector<std::byte>&&)> done;
  bool abandoned = false;  // completed early (deadline/cancel): its late body is discarded
  // A read (get, range get, stat, list, usage) is sent again once, on a fresh
  // connection, when its connection is lost under it: reading twice changes nothing,
  // and a runtime's fetch then survives the node closing an idle connection, or
  // restarting, as it was sent. Puts, removes and touches are not: the node may have
  // done them already.
  std::optional<Request> replay;
  bool replayed = false;
};

// Where a channel hands the requests it can send again (Pending::replay) when its
// connection is lost (why: the loss).
using Replay = std::function<void(Request, Pending, const Status& why)>;

class Channel {
 public:
  Channel(std::unique_ptr<Connection> c, transport::Backend* backend, Replay replay)
      : conn_(std::move(c)), backend_(backend), replay_(std::move(replay)) {
    receiver_ = std::thread([this] {
      receive_loop();
      finished_.store(true, std::memory_order_release);
    });
  }
  ~Channel() {
    stop_.cancel();
    if (receiver_.joinable()) receiver_.join();
    fail_all(make_status(StatusCode::cancelled, "client closed"));
  }

  // Sends a request; `p.done` runs exactly once.
  void submit(Request req, std::span<const std::byte> body, Pending p) {
    auto done = p.done;
    // A request that is already over never reaches the wire (and cannot break it).
    if (p.cancel.cancelled()) return done(make_status(StatusCode::cancelled, "request cancelled"), {});
    if (Clock::now() >= p.deadline) return done(make_status(StatusCode::timed_out, "request past its deadline"), {});
    uint64_t id = 0;
    std::vector<std::byte> header;
    {
      std::lock_guard lock(mu_);
      if (!broken_.ok()) {
        done(broken_, {});
        return;
      }
      id = req.id = next_id_++;
      header = encode(req);
      // A read keeps its request for a resend (moved: the header is encoded already).
      const bool reads = req.op == Op::get || req.op == Op::stat || req.op == Op::list || req.op == Op::usage;
      if (reads && body.empty() && !p.replayed) p.replay = std::move(req);
      pending_.emplace(id, std::move(p));
    }
    Status st;
    {
      std::lock_guard lock(send_mu_);
      st = send_segmented(*conn_, header, body, [id](uint32_t i) { return data_request_header(id, i); },
                          pending_deadline(id), stop_);
    }
    if (!st.ok()) {
      mark_broken(st);
      complete(id, st, {});
    }
  }

  [[nodiscard]] bool alive() {
    std::lock_guard lock(mu_);
    return broken_.ok();
  }
  /// Its receiver thread has returned (the connection broke, or it was stopped).
  [[nodiscard]] bool finished() const { return finished_.load(std::memory_order_acquire); }

 private:
  std::unique_ptr<Connection> conn_;
  transport::Backend* backend_;
  Replay replay_;
  CancelToken stop_;
  std::thread receiver_;
  std::mutex send_mu_, mu_;
  std::map<uint64_t, Pending> pending_;
  uint64_t next_id_ = 1;
  Status broken_;
  std::atomic<bool> finished_{false};

  Deadline pending_deadline(uint64_t id) {
    std::lock_guard lock(mu_);
    auto it = pending_.find(id);
    return it == pending_.end() ? Clock::now() : it->second.deadline;
  }

  void mark_broken(const Status& s) {
    std::lock_guard lock(mu_);
    if (broken_.ok()) broken_ = s;
  }

  // Completes request `id` (if still waiting) outside the lock.
  void complete(uint64_t id, Result<size_t> r, std::vector<std::byte>&& body) {
    std::function<void(Result<size_t>, std::vector<std::byte>&&)> done;
    {
      std::lock_guard lock(mu_);
      auto it = pending_.find(id);
      if (it == pending_.end()) return;
      if (!it->second.abandoned) done = std::move(it->second.done);
      pending_.erase(it);
    }
    if (done) done(std::move(r), std::move(body));
  }

  // Fails every request still waiting with `s`; how many there were. `resend`: the
  // connection was lost, and the reads not sent again yet go to replay_ instead,
  // which sends them on a fresh connection.
  size_t fail_all(const Status& s, bool resend = false) {
    std::map<uint64_t, Pending> all;
    {
      std::lock_guard lock(mu_);
      all.swap(pending_);
    }
    size_t failed = 0;
    for (auto& [id, p] : all) {
      if (p.abandoned || !p.done) continue;
      if (resend && p.replay && !p.cancel.cancelled() && Clock::now() < p.deadline) {
        Request again = std::move(*p.replay);
        p.replay.reset(), p.replayed = true;
        replay_(std::move(again), std::move(p), s);
      } else {
        ++failed;
        p.done(s, {});
      }
    }
    return failed;
  }

  // Requests past their deadline or cancelled complete now; the slot stays so their
  // response, if it ever comes, is recognised and its body discarded.
  void expire() {
    std::vector<std::pair<std::function<void(Result<size_t>, std::vector<std::byte>&&)>, Status>> due;
    {
      std::lock_guard lock(mu_);
      const auto now = Clock::now();
      for (auto& [id, p] : pending_) {
        if (p.abandoned) continue;
        if (p.cancel.cancelled())
          due.emplace_back(std::move(p.done), make_status(StatusCode::cancelled, "request {} cancelled", id));
        else if (now >= p.deadline)
          due.emplace_back(std::move(p.done), make_status(StatusCode::timed_out, "request {} passed its deadline", id));
        else
          continue;
        p.abandoned = true;
        p.dest = {};
      }
    }
    for (auto& [done, st] : due) done(st, {});
  }

  void receive_loop() {
    std::vector<std::byte> header;
    while (!stop_.cancelled()) {
      expire();
      // Short waits so deadlines and cancels are seen promptly.
      auto len = conn_->recv_header(header, deadline_in(20ms), stop_);
      if (!len.ok()) {
        if (len.status().code() == StatusCode::timed_out) continue;
        if (len.status().code() == StatusCode::cancelled) return;
        mark_broken(len.status());
        // The transport logs a node that closed between two messages at debug only
        // (transport/common/peer_closed.hpp); here it cost requests, which is worth
        // a warning.
        if (const size_t n = fail_all(len.status().with_context("storage connection lost"), true); n > 0)
          KVS_LOG_WARN("storage client: {} lost with {} requests waiting: {}", conn_->describe(), n,
                       len.status().to_string());
        return;
      }
      auto resp = decode_response(header);
      if (!resp.ok()) {
        mark_broken(resp.status());
        fail_all(resp.status().with_context("malformed response"));
        return;
      }
      Status st = land(*resp, *len);
      if (!st.ok()) {
        mark_broken(st);
        // Lost mid-body: the reads go again (a body that arrived garbled, or a
        // malformed message, fails them: the node answered).
        const bool lost = st.code() == StatusCode::unavailable;
        fail_all(lost ? st.with_context("storage connection lost") : st, lost);
        return;
      }
    }
  }

  // Receives the body of `r` into its request's destination and completes it.
  Status land(const Response& r, size_t len) {
    MemoryRegion dest;
    size_t offset = 0, capacity = 0;
    bool known = false, abandoned = false, range = false;
    Op op = Op::get;
    {
      std::lock_guard lock(mu_);
      auto it = pending_.find(r.id);
      if (it != pending_.end()) {
        known = true;
        abandoned = it->second.abandoned;
        dest = it->second.dest;
        offset = it->second.offset, capacity = it->second.capacity;
        op = it->second.op, range = it->second.range;
      }
    }
    if (!known) return make_status(StatusCode::corrupt_data, "response to unknown request {}", r.id);
    const auto body_deadline = deadline_in(30s);
    if (op == Op::get && r.code == StatusCode::ok) return land_get(r, len, abandoned, dest, offset, capacity, range);
    if (abandoned || r.code != StatusCode::ok) {
      KVS_RETURN_IF_ERROR(conn_->recv_body({}, body_deadline, stop_));  // discard
      complete(r.id, r.code == StatusCode::ok ? Status{} : make_status(r.code, "{}", r.message), {});
      return {};
    }
    // Small bodies (stat, list) go through a buffer of our own.
    if (len > (size_t(64) << 20)) return make_status(StatusCode::corrupt_data, "response body of {} bytes", len);
    std::vector<std::byte> body(len);
    if (len) {
      KVS_ASSIGN_OR_RETURN(auto mr, backend_->register_memory(body.data(), len, transport::MemoryType::host));
      KVS_RETURN_IF_ERROR(conn_->recv_body(mr.span(0, len), body_deadline, stop_));
    } else {
      KVS_RETURN_IF_ERROR(conn_->recv_body({}, body_deadline, stop_));
    }
    if (body_checksum(body) != r.checksum) {
      complete(r.id, make_status(StatusCode::corrupt_data, "response failed its checksum in transit"), {});
      return {};
    }
    complete(r.id, len, std::move(body));
    return {};
  }

  // A get's body: its first segment came with the response, the others follow as
  // `data` messages; each lands at its place in the destination (or is discarded when
  // the request is over or the buffer too small, or a range's body is not the range's
  // size), and the whole is checked once.
  Status land_get(const Response& r, size_t first_len, bool abandoned, const MemoryRegion& dest, size_t offset,
                  size_t capacity, bool range) {
    const uint64_t total = r.total;
    const bool fits = range ? total == capacity : total <= capacity;
    const bool keep = !abandoned && fits;
    KVS_RETURN_IF_ERROR(recv_segmented(
        *conn_, false, r.id, total, first_len,
        [&](uint64_t i, uint64_t len) {
          return keep ? dest.span(offset + i * kSegmentBytes, len) : std::span<std::byte>();
        },
        [](std::span<std::byte>) {}, 30s, stop_));
    if (abandoned) {
      complete(r.id, Status{}, {});
      return {};
    }
    if (!keep) {
      complete(r.id,
               range ? make_status(StatusCode::corrupt_data, "the node answered a range of {} bytes with {}", capacity,
                                   total)
                     : make_status(StatusCode::out_of_range, "chunk of {} bytes, buffer of {}", total, capacity),
               {});
      return {};
    }
    if (body_checksum(dest.span(offset, total)) != r.checksum) {
      complete(r.id, make_status(StatusCode::corrupt_data, "chunk failed its checksum in transit"), {});
      return {};
    }
    complete(r.id, size_t(total), {});
    return {};
  }
};

class ClientImpl final : public Client {
 public:
  /// Over `backend`, or over one of its own made from cfg.backend when that is null.
  static Result<std::unique_ptr<Client>> create(const ClientConfig& cfg, std::shared_ptr<transport::Backend> backend,
                                                Deadline deadline, const CancelToken& cancel) {
    KVS_RETURN_IF_ERROR(validate_id(cfg.name_space, kMaxNamespaceBytes, "namespace"));
    if (cfg.connections == 0 || cfg.connections > 64)
      return make_status(StatusCode::invalid_argument, "{} connections (1..64)", cfg.connections);
    auto c = std::make_unique<ClientImpl>();
    if (!backend) {
      KVS_ASSIGN_OR_RETURN(backend, transport::create_backend(cfg.backend));
    }
    c->backend_ = std::move(backend);
    c->cfg_ = cfg;
    for (uint32_t i = 0; i < cfg.connections; ++i) {
      KVS_ASSIGN_OR_RETURN(auto ch, c->open_channel(deadline, cancel));
      c->channels_.push_back(std::move(ch));
    }
    return std::unique_ptr<Client>(std::move(c));
  }
  // The channels go first, under the lock, so that a read a lost connection hands
  // back meanwhile (replay, on that channel's receiver) finds no channel and fails
  // rather than connecting again into a client being destroyed.
  ~ClientImpl() override {
    std::vector<std::shared_ptr<Channel>> channels, retired;
    {
      std::lock_guard lock(channels_mu_);
      channels.swap(channels_), retired.swap(retired_);
    }
  }

  const transport::Capabilities* capabilities() const override { return &backend_->capabilities(); }

  Result<MemoryRegion> register_memory(void* data, size_t size) override {
    return register_memory(data, size, transport::MemoryType::host);
  }
  Result<MemoryRegion> register_memory(void* data, size_t size, transport::MemoryType type) override {
    return backend_->register_memory(data, size, type);
  }

  Status put(const std::string& context, uint32_t chunk, uint32_t level, std::span<const std::byte> bytes,
             Deadline deadline, const CancelToken& cancel) override {
    return put_parts(context, chunk, level, bytes, {}, 0, deadline, cancel);
  }

  Status put_versioned(const std::string& context, uint32_t chunk, uint32_t level, std::span<const std::byte> bytes,
                       uint64_t version, Deadline deadline, const CancelToken& cancel) override {
    return put_parts(context, chunk, level, bytes, {}, version, deadline, cancel);
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
    KVS_RETURN_IF_ERROR(validate_id(context, kMaxContextBytes, "context id"));
    Request req;
    req.op = Op::remove, req.context = context;
    KVS_ASSIGN_OR_RETURN(auto body, call(req, {}, deadline, cancel));
    (void)body;
    return {};
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
    size_t first = 0;
    while (first < contexts.size()) {
      size_t bytes = 4, end = first;
      while (end < contexts.size() && bytes + touch_wire_bytes(contexts[end]) <= kMaxTouchBodyBytes)
        bytes += touch_wire_bytes(contexts[end++]);
      auto body = encode_touches(contexts.subspan(first, end - first));
      KVS_ASSIGN_OR_RETURN(auto mr, register_memory(body.data(), body.size()));
      (void)mr;
      Request req;
      req.op = Op::touch, req.total = body.size(), req.checksum = body_checksum(body), req.version = stamp;
      KVS_ASSIGN_OR_RETURN(auto reply, call(req, body, deadline, cancel));
      (void)reply;
      first = end;
    }
    return {};
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
  std::shared_ptr<transport::Backend> backend_;  // outlives the channels (declared first)
  ClientConfig cfg_;
  std::mutex channels_mu_;  // channels_, retired_
  std::vector<std::shared_ptr<Channel>> channels_;
  std::vector<std::shared_ptr<Channel>> retired_;  // lost, until their receivers return
  std::mutex reconnect_mu_;  // reconnecting_
  std::condition_variable reconnect_cv_;
  bool reconnecting_ = false;  // a call is reconnecting: it alone touches last_reconnect_*, reconnect_pause_
  // A reconnection has at most kReconnectBound to connect and log in (a node that
  // still listens but no longer serves would otherwise hold each call to its
  // deadline); after a failed one, calls answer its error for a pause that doubles
  // from kReconnectPause up to kReconnectPauseMax.
  static constexpr auto kReconnectBound = std::chrono::milliseconds(1000);
  static constexpr auto kReconnectPause = std::chrono::milliseconds(100);
  static constexpr auto kReconnectPauseMax = std::chrono::milliseconds(5000);
  Clock::time_point last_reconnect_at_{};
  Clock::duration reconnect_pause_ = kReconnectPause;
  Status last_reconnect_;
  std::atomic<uint64_t> rr_{0};
  std::atomic<uint64_t> features_{0};  // what the node's hello declared (kFeature*)

  Status need_usage_feature() const {
    if (features_.load(std::memory_order_relaxed) & kFeatureUsage) return {};
    return Status(StatusCode::unsupported, "the storage node keeps no use marks (a node from before 2026-12-06)");
  }

  // Logs in; returns the features the node's hello declares.
  static Result<uint64_t> authenticate(Connection& c, const ClientConfig& cfg, Deadline deadline,
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
    return hello.features;
  }

  // A connection, logged in; the node's features go to features_.
  Result<std::shared_ptr<Channel>> open_channel(Deadline deadline, const CancelToken& cancel) {
    KVS_ASSIGN_OR_RETURN(auto conn, backend_->connect(cfg_.address, deadline, cancel));
    KVS_ASSIGN_OR_RETURN(uint64_t features, authenticate(*conn, cfg_, deadline, cancel));
    features_.store(features, std::memory_order_relaxed);
    return std::make_shared<Channel>(std::move(conn), backend_.get(),
                                     [this](Request req, Pending p, const Status& why) {
                                       replay(std::move(req), std::move(p), why);
                                     });
  }

  // Picks a live channel, round robin. With none alive (the node closed them: its idle
  // timeout, a restart), connects and logs in again in the caller's call, within its
  // deadline; the requests that were on the lost connections failed with it.
  Result<std::shared_ptr<Channel>> pick(Deadline deadline, const CancelToken& cancel) {
    const size_t start = size_t(rr_.fetch_add(1));
    {
      std::lock_guard lock(channels_mu_);
      const size_t n = channels_.size();
      if (n == 0) return make_status(StatusCode::cancelled, "storage client closed");  // ~ClientImpl
      for (size_t i = 0; i < n; ++i)
        if (channels_[(start + i) % n]->alive()) return channels_[(start + i) % n];
    }
    // One reconnection at a time; a call waits for another's only until its own deadline.
    // (A flag under a plain mutex, not a timed_mutex: ThreadSanitizer does not see
    // pthread_mutex_clocklock, which timed_mutex uses, and reports its unlock.)
    {
      std::unique_lock lk(reconnect_mu_);
      if (!reconnect_cv_.wait_until(lk, deadline, [&] { return !reconnecting_; }))
        return make_status(StatusCode::timed_out, "storage node {}: past the deadline while connecting again",
                           cfg_.address);
      reconnecting_ = true;
    }
    struct Done {
      ClientImpl* c;
      ~Done() {
        {
          std::lock_guard lk(c->reconnect_mu_);
          c->reconnecting_ = false;
        }
        c->reconnect_cv_.notify_all();
      }
    } done_reconnecting{this};
    size_t lost = 0;  // all of them: only the reconnecting call replaces channels
    {
      std::lock_guard lock(channels_mu_);
      for (const auto& ch : channels_)  // another call may have reconnected meanwhile
        if (ch->alive()) return ch;
      lost = channels_.size();
      if (lost == 0) return make_status(StatusCode::cancelled, "storage client closed");
    }
    // A node that is down is not dialled again by every call: after a failed try, its
    // error stands for the pause.
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
    return fresh.front();
  }

  // A read whose connection was lost (`why`), sent again (Pending::replay); on the
  // lost channel's receiver thread. If that fails too, the caller learns both: the
  // loss first (its code), then what the second try met; its deadline or a cancel
  // stay what they are.
  void replay(Request req, Pending p, const Status& why) {
    KVS_LOG_DEBUG("storage client: a read of '{}' sent again on a fresh connection to {}", req.context, cfg_.address);
    p.done = [done = std::move(p.done), why, deadline = p.deadline](Result<size_t> r, std::vector<std::byte>&& body) {
      const StatusCode code = r.ok() ? StatusCode::ok : r.status().code();
      // (A reconnection's own bound, short of the call's deadline, is not the call's
      // timeout: that one is combined with the loss like any other failure.)
      const bool past_deadline = code == StatusCode::timed_out && Clock::now() >= deadline;
      if (code == StatusCode::ok || past_deadline || code == StatusCode::cancelled || code == StatusCode::not_found ||
          code == StatusCode::out_of_range)
        return done(std::move(r), std::move(body));
      done(Status(why.code(), fmt::format("{}; sent again: {}", why.message(), r.status().message())), {});
    };
    submit(std::move(req), {}, std::move(p));
  }

  // Sends `req` on a live channel; `p.done` runs exactly once.
  void submit(Request req, std::span<const std::byte> body, Pending p) {
    auto ch = pick(p.deadline, p.cancel);
    if (!ch.ok()) return p.done(ch.status(), {});
    (*ch)->submit(std::move(req), body, std::move(p));
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

Result<std::unique_ptr<Client>> Client::connect(const ClientConfig& config, Deadline deadline,
                                                const CancelToken& cancel) {
  return ClientImpl::create(config, nullptr, deadline, cancel);
}

Result<std::unique_ptr<Client>> Client::connect(const ClientConfig& config, std::shared_ptr<transport::Backend> backend,
                                                Deadline deadline, const CancelToken& cancel) {
  if (!backend) return make_status(StatusCode::invalid_argument, "storage client: no backend to connect over");
  return ClientImpl::create(config, std::move(backend), deadline, cancel);
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
