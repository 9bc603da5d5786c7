// The Redis storage client (include/kvstream/redis_storage.hpp): a queue of calls
// served by one thread per hiredis connection, and a reaper that completes calls that
// pass their deadline or are cancelled while a command is still on the wire.
#include "kvstream/redis_storage.hpp"

#if KVSTREAM_HAVE_REDIS

#include <sys/time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <thread>

#include <hiredis/hiredis.h>

#include <xxhash.h>

#include "core/log.hpp"
#include "transport/backend_impl.hpp"
#include "storage/protocol.hpp"

namespace kvstream::redis {

using namespace std::chrono_literals;
using storage::ChunkStat;
using storage::GetCallback;
using transport::CancelToken;
using transport::Clock;
using transport::Deadline;
using transport::MemoryRegion;

namespace {

constexpr size_t kChecksumBytes = 8;

// A value's checksum is seeded with its key, so a value copied or renamed to another
// key (another chunk or level) fails it, as the node's object headers do.
uint64_t bound_checksum(const std::string& key, std::span<const std::byte> payload) {
  return XXH3_64bits_withSeed(payload.data(), payload.size(), XXH3_64bits(key.data(), key.size()));
}

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

timeval timeval_until(Deadline d) {
  auto left = std::chrono::duration_cast<std::chrono::microseconds>(d - Clock::now());
  if (left < 1ms) left = 1ms;  // 0 would mean "no timeout" to the kernel
  timeval tv{};
  tv.tv_sec = time_t(left.count() / 1000000);
  tv.tv_usec = suseconds_t(left.count() % 1000000);
  return tv;
}

// One hiredis connection, owned by one worker thread.
class Conn {
 public:
  explicit Conn(const RedisConfig& cfg) : cfg_(cfg) {}
  ~Conn() { close(); }

  // Runs commands pipelined (each an argv), returning their replies in order; the
  // connection is reopened first when needed, and closed on any transport error.
  Result<std::vector<Reply>> run(const std::vector<std::vector<std::string_view>>& cmds, Deadline deadline) {
    if (Clock::now() >= deadline) return make_status(StatusCode::timed_out, "redis call past its deadline");
    KVS_RETURN_IF_ERROR(ensure(deadline));
    redisSetTimeout(ctx_, timeval_until(deadline));
    for (const auto& argv : cmds) {
      std::vector<const char*> ptrs;
      std::vector<size_t> lens;
      for (auto a : argv) ptrs.push_back(a.data()), lens.push_back(a.size());
      if (redisAppendCommandArgv(ctx_, int(ptrs.size()), ptrs.data(), lens.data()) != REDIS_OK)
        return broken(deadline, "append");
    }
    std::vector<Reply> out;
    for (size_t i = 0; i < cmds.size(); ++i) {
      void* r = nullptr;
      if (redisGetReply(ctx_, &r) != REDIS_OK || r == nullptr) return broken(deadline, "reply");
      out.emplace_back(static_cast<redisReply*>(r));
    }
    return out;
  }

  // Connects, authenticates, selects the database.
  Status ensure(Deadline deadline) {
    if (ctx_) return {};
    const Deadline until = std::min(deadline, Clock::now() + cfg_.connect_timeout);
    const timeval tv = timeval_until(until);
    if (cfg_.address.rfind("unix:", 0) == 0) {
      ctx_ = redisConnectUnixWithTimeout(cfg_.address.c_str() + 5, tv);
    } else {
      std::string host;
      uint16_t port = 0;
      KVS_RETURN_IF_ERROR(transport::parse_host_port(cfg_.address, host, port));
      ctx_ = redisConnectWithTimeout(host.c_str(), port, tv);
    }
    if (ctx_ == nullptr) return make_status(StatusCode::resource_exhausted, "redis: cannot allocate a context");
    if (ctx_->err) {
      Status s = make_status(Clock::now() >= until ? StatusCode::timed_out : StatusCode::unavailable,
                             "redis {}: connect: {}", cfg_.address, ctx_->errstr);
      close();
      return s;
    }
    std::vector<std::vector<std::string_view>> hello;
    if (!cfg_.password.empty()) hello.push_back({"AUTH", cfg_.password});
    const std::string db = std::to_string(cfg_.database);
    if (cfg_.database != 0) hello.push_back({"SELECT", db});
    hello.push_back({"PING"});
    redisSetTimeout(ctx_, timeval_until(until));
    for (const auto& argv : hello) {
      std::vector<const char*> ptrs;
      std::vector<size_t> lens;
      for (auto a : argv) ptrs.push_back(a.data()), lens.push_back(a.size());
      void* raw = redisCommandArgv(ctx_, int(ptrs.size()), ptrs.data(), lens.data());
      if (raw == nullptr) return broken(until, "connect");
      Reply r(static_cast<redisReply*>(raw));
      if (r->type == REDIS_REPLY_ERROR) {
        const std::string msg(r->str, r->len);
        close();
        const bool auth = argv[0] == "AUTH" || msg.find("NOAUTH") != std::string::npos ||
                          msg.find("WRONGPASS") != std::string::npos;
        return make_status(auth ? StatusCode::permission_denied : StatusCode::unavailable, "redis {}: {}: {}",
                           cfg_.address, argv[0], auth ? "authentication refused" : msg);
      }
    }
    return {};
  }

  void close() {
    if (ctx_) redisFree(ctx_);
    ctx_ = nullptr;
  }

 private:
  const RedisConfig& cfg_;
  redisContext* ctx_ = nullptr;

  Status broken(Deadline deadline, std::string_view what) {
    const bool late = Clock::now() >= deadline || (ctx_ && ctx_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK));
    Status s = make_status(late ? StatusCode::timed_out : StatusCode::unavailable, "redis {}: {}: {}", cfg_.address,
                           what, ctx_ && ctx_->errstr[0] ? ctx_->errstr : "connection lost");
    close();  // its framing can no longer be trusted
    return s;
  }
};

// One call. Completed exactly once: by its worker, or by the reaper (deadline,
// cancel, shutdown), whichever claims it first; only the claimer touches the
// caller's memory or calls back.
struct Job {
  Deadline deadline;
  CancelToken cancel;
  std::atomic<bool> claimed{false};
  std::function<void(Conn&, Job&)> run;  // on a worker; claims before completing
  std::function<void(Status)> fail;      // completes with an error (the caller claimed)
  bool claim() {
    bool expected = false;
    return claimed.compare_exchange_strong(expected, true);
  }
};

Status reply_error(const redisReply* r, std::string_view what) {
  if (r->type == REDIS_REPLY_ERROR)
    return make_status(StatusCode::unavailable, "redis refused {}: {}", what, std::string_view(r->str, r->len));
  return {};
}

struct HostRegion final : MemoryRegion::Impl {};

class RedisClient final : public storage::Client {
 public:
  ~RedisClient() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    reaper_cv_.notify_all();
    for (auto& t : workers_) t.join();
    if (reaper_.joinable()) reaper_.join();
    // Whatever is left completes now.
    for (auto& j : active_)
      if (j->claim()) j->fail(make_status(StatusCode::cancelled, "redis client closed"));
  }

  static Result<std::unique_ptr<storage::Client>> create(const RedisConfig& cfg, Deadline deadline,
                                                         const CancelToken& cancel) {
    KVS_RETURN_IF_ERROR(storage::validate_id(cfg.name_space, storage::kMaxNamespaceBytes, "namespace"));
    if (cfg.connections == 0 || cfg.connections > 64)
      return make_status(StatusCode::invalid_argument, "{} redis connections (1..64)", cfg.connections);
    if (cfg.address.rfind("unix:", 0) != 0) {
      std::string host;
      uint16_t port = 0;
      KVS_RETURN_IF_ERROR(transport::parse_host_port(cfg.address, host, port));
    } else if (cfg.address.size() <= 5) {
      return make_status(StatusCode::invalid_argument, "redis address 'unix:' names no socket");
    }
    auto c = std::unique_ptr<RedisClient>(new RedisClient(cfg));
    for (uint32_t i = 0; i < cfg.connections; ++i) c->workers_.emplace_back([p = c.get()] { p->work(); });
    c->reaper_ = std::thread([p = c.get()] { p->reap(); });
    // One round trip proves the server is there (and takes our password).
    KVS_ASSIGN_OR_RETURN(auto r, c->call<bool>(deadline, cancel, [](Conn& conn, Deadline d) -> Result<bool> {
      KVS_ASSIGN_OR_RETURN(auto replies, conn.run({{"PING"}}, d));
      KVS_RETURN_IF_ERROR(reply_error(replies[0].get(), "PING"));
      return true;
    }));
    (void)r;
    KVS_LOG_INFO("redis storage client on {} (namespace '{}', {} connections)", cfg.address, cfg.name_space,
                 cfg.connections);
    return std::unique_ptr<storage::Client>(std::move(c));
  }

  Result<MemoryRegion> register_memory(void* data, size_t size) override {
    if (data == nullptr || size == 0)
      return make_status(StatusCode::invalid_argument, "register_memory: empty range (data {}, size {})", data, size);
    auto r = std::make_shared<HostRegion>();
    r->data = static_cast<std::byte*>(data), r->size = size, r->type = transport::MemoryType::host;
    return MemoryRegion(std::move(r));
  }

  Status put(const std::string& context, uint32_t chunk, uint32_t level, std::span<const std::byte> bytes,
             Deadline deadline, const CancelToken& cancel) override {
    KVS_RETURN_IF_ERROR(storage::validate_id(context, storage::kMaxContextBytes, "context id"));
    if (level >= storage::kMaxLevels || bytes.size() > storage::kMaxChunkBytes)
      return make_status(StatusCode::out_of_range, "level {} / {} bytes beyond the store's bounds", level,
                         bytes.size());
    // The value is copied here, so the call may end (cancel) while it is on the wire.
    auto value = std::make_shared<std::string>(kChecksumBytes + bytes.size(), '\0');
    const uint64_t sum = bound_checksum(chunk_key(context, chunk, level), bytes);
    for (size_t i = 0; i < kChecksumBytes; ++i) (*value)[i] = char(uint8_t(sum >> (8 * i)));
    if (!bytes.empty()) std::memcpy(value->data() + kChecksumBytes, bytes.data(), bytes.size());
    auto r = call<bool>(deadline, cancel,
                        [value, key = chunk_key(context, chunk, level), sizes = sizes_key(context),
                         field = fmt::format("{}:{}", chunk, level), size = std::to_string(bytes.size()),
                         contexts = contexts_key(), context](Conn& conn, Deadline d) -> Result<bool> {
                          KVS_ASSIGN_OR_RETURN(auto rs, conn.run({{"MULTI"},
                                                                  {"SET", key, *value},
                                                                  {"HSET", sizes, field, size},
                                                                  {"SADD", contexts, context},
                                                                  {"EXEC"}},
                                                                 d));
                          for (auto& x : rs) KVS_RETURN_IF_ERROR(reply_error(x.get(), "put"));
                          if (rs[4]->type != REDIS_REPLY_ARRAY || rs[4]->elements != 3)
                            return make_status(StatusCode::unavailable, "redis put transaction was aborted");
                          for (size_t i = 0; i < 3; ++i) KVS_RETURN_IF_ERROR(reply_error(rs[4]->element[i], "put"));
                          return true;
                        });
    return r.status();
  }

  void get_async(const std::string& context, uint32_t chunk, uint32_t level, MemoryRegion dest, size_t offset,
                 size_t capacity, Deadline deadline, const CancelToken& cancel, GetCallback done) override {
    if (Status s = storage::validate_id(context, storage::kMaxContextBytes, "context id"); !s.ok()) return done(s);
    if (level >= storage::kMaxLevels) return done(make_status(StatusCode::out_of_range, "level {}", level));
    if (dest.span(offset, capacity).size() != capacity || (capacity > 0 && !dest.valid()))
      return done(make_status(StatusCode::invalid_argument, "destination [{}, {}) is outside its registered region",
                              offset, offset + capacity));
    auto job = std::make_shared<Job>();
    job->deadline = deadline, job->cancel = cancel;
    auto shared_done = std::make_shared<GetCallback>(std::move(done));
    job->fail = [shared_done](Status s) { (*shared_done)(std::move(s)); };
    job->run = [shared_done, key = chunk_key(context, chunk, level), dest = std::move(dest), offset,
                capacity](Conn& conn, Job& j) mutable {
      auto rs = conn.run({{"GET", key}}, j.deadline);
      Result<size_t> out = size_t(0);
      if (!rs.ok()) {
        out = rs.status();
      } else if (const redisReply* r = (*rs)[0].get(); r->type == REDIS_REPLY_NIL) {
        out = make_status(StatusCode::not_found, "no object {}", key);
      } else if (r->type != REDIS_REPLY_STRING) {
        Status e = reply_error(r, "get");
        out = e.ok() ? make_status(StatusCode::corrupt_data, "{} is not a chunk (reply type {})", key, r->type) : e;
      } else if (size_t(r->len) < kChecksumBytes) {
        out = make_status(StatusCode::corrupt_data, "{} is {} bytes, shorter than its checksum", key, r->len);
      } else {
        const auto* p = reinterpret_cast<const std::byte*>(r->str);
        const std::span<const std::byte> payload(p + kChecksumBytes, size_t(r->len) - kChecksumBytes);
        uint64_t sum = 0;
        for (size_t i = 0; i < kChecksumBytes; ++i) sum |= uint64_t(uint8_t(r->str[i])) << (8 * i);
        if (payload.size() > capacity)
          out = make_status(StatusCode::out_of_range, "chunk of {} bytes, buffer of {}", payload.size(), capacity);
        else if (bound_checksum(key, payload) != sum)
          out = make_status(StatusCode::corrupt_data, "{} failed its checksum", key);
        else if (j.claim()) {
          if (!payload.empty()) std::memcpy(dest.span(offset, payload.size()).data(), payload.data(), payload.size());
          dest = {};
          (*shared_done)(payload.size());
          return;
        } else {
          return;  // completed already (deadline, cancel): the buffer is no longer ours
        }
      }
      dest = {};
      if (j.claim()) (*shared_done)(std::move(out));
    };
    enqueue(std::move(job));
  }

  Result<std::vector<ChunkStat>> stat(const std::string& context, Deadline deadline,
                                      const CancelToken& cancel) override {
    KVS_RETURN_IF_ERROR(storage::validate_id(context, storage::kMaxContextBytes, "context id"));
    return call<std::vector<ChunkStat>>(
        deadline, cancel, [sizes = sizes_key(context), context](Conn& conn, Deadline d) -> Result<std::vector<ChunkStat>> {
          KVS_ASSIGN_OR_RETURN(auto rs, conn.run({{"HGETALL", sizes}}, d));
          const redisReply* r = rs[0].get();
          KVS_RETURN_IF_ERROR(reply_error(r, "stat"));
          if (r->type != REDIS_REPLY_ARRAY || r->elements % 2)
            return make_status(StatusCode::corrupt_data, "{} is not a size table", sizes);
          if (r->elements == 0) return make_status(StatusCode::not_found, "no context '{}'", context);
          std::map<uint32_t, std::vector<uint64_t>> m;
          for (size_t i = 0; i < r->elements; i += 2) {
            const redisReply* f = r->element[i];
            const redisReply* v = r->element[i + 1];
            uint32_t chunk = 0, level = 0;
            uint64_t bytes = 0;
            const std::string_view fs(f->str ? f->str : "", f->str ? f->len : 0),
                vs(v->str ? v->str : "", v->str ? v->len : 0);
            const size_t colon = fs.find(':');
            if (colon == std::string_view::npos || !parse_uint(fs.substr(0, colon), chunk) ||
                !parse_uint(fs.substr(colon + 1), level) || !parse_uint(vs, bytes) || level >= storage::kMaxLevels ||
                bytes > storage::kMaxChunkBytes)
              return make_status(StatusCode::corrupt_data, "{} has a bad entry '{}' = '{}'", sizes, fs, vs);
            auto& sz = m[chunk];
            if (sz.size() <= level) sz.resize(level + 1, 0);
            sz[level] = bytes;
          }
          std::vector<ChunkStat> out;
          for (auto& [chunk, sz] : m) out.push_back({chunk, std::move(sz)});
          return out;
        });
  }

  Status remove(const std::string& context, Deadline deadline, const CancelToken& cancel) override {
    KVS_RETURN_IF_ERROR(storage::validate_id(context, storage::kMaxContextBytes, "context id"));
    auto r = call<bool>(deadline, cancel,
                        [this, sizes = sizes_key(context), context](Conn& conn, Deadline d) -> Result<bool> {
                          KVS_ASSIGN_OR_RETURN(auto rs, conn.run({{"HKEYS", sizes}, {"SISMEMBER", contexts_key(), context}}, d));
                          KVS_RETURN_IF_ERROR(reply_error(rs[0].get(), "remove"));
                          if (rs[0]->elements == 0 && (rs[1]->type != REDIS_REPLY_INTEGER || rs[1]->integer == 0))
                            return make_status(StatusCode::not_found, "no context '{}'", context);
                          std::vector<std::string> keys;
                          for (size_t i = 0; i < rs[0]->elements; ++i)
                            keys.push_back(fmt::format("kvs:{}:{}:{}", cfg_.name_space, context,
                                                       std::string_view(rs[0]->element[i]->str, rs[0]->element[i]->len)));
                          std::vector<std::vector<std::string_view>> cmds{{"MULTI"}};
                          for (const auto& k : keys) cmds.push_back({"DEL", k});
                          const std::string ck = contexts_key();
                          cmds.push_back({"DEL", sizes});
                          cmds.push_back({"SREM", ck, context});
                          cmds.push_back({"EXEC"});
                          KVS_ASSIGN_OR_RETURN(auto done, conn.run(cmds, d));
                          for (auto& x : done) KVS_RETURN_IF_ERROR(reply_error(x.get(), "remove"));
                          if (done.back()->type != REDIS_REPLY_ARRAY)
                            return make_status(StatusCode::unavailable, "redis remove transaction was aborted");
                          return true;
                        });
    return r.status();
  }

  Result<std::vector<std::string>> list(Deadline deadline, const CancelToken& cancel) override {
    return call<std::vector<std::string>>(
        deadline, cancel, [key = contexts_key()](Conn& conn, Deadline d) -> Result<std::vector<std::string>> {
          KVS_ASSIGN_OR_RETURN(auto rs, conn.run({{"SMEMBERS", key}}, d));
          KVS_RETURN_IF_ERROR(reply_error(rs[0].get(), "list"));
          std::vector<std::string> out;
          for (size_t i = 0; i < rs[0]->elements; ++i) out.emplace_back(rs[0]->element[i]->str, rs[0]->element[i]->len);
          std::sort(out.begin(), out.end());
          return out;
        });
  }

 private:
  explicit RedisClient(RedisConfig cfg) : cfg_(std::move(cfg)) {}

  RedisConfig cfg_;
  std::mutex mu_;
  std::condition_variable cv_;         // workers wait on it for calls
  std::condition_variable reaper_cv_;  // the reaper waits on it (so a call never wakes it instead of a worker)
  bool stopping_ = false;
  std::deque<std::shared_ptr<Job>> queue_;
  std::list<std::shared_ptr<Job>> active_;  // queued or running: what the reaper watches
  std::vector<std::thread> workers_;
  std::thread reaper_;

  std::string chunk_key(const std::string& ctx, uint32_t chunk, uint32_t level) const {
    return fmt::format("kvs:{}:{}:{}:{}", cfg_.name_space, ctx, chunk, level);
  }
  std::string sizes_key(const std::string& ctx) const { return fmt::format("kvs:{}:{}:sizes", cfg_.name_space, ctx); }
  std::string contexts_key() const { return fmt::format("kvs:{}:contexts", cfg_.name_space); }

  template <typename T>
  static bool parse_uint(std::string_view s, T& v) {
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return ec == std::errc() && end == s.data() + s.size() && !s.empty();
  }

  void enqueue(std::shared_ptr<Job> job) {
    if (job->cancel.cancelled()) {
      if (job->claim()) job->fail(make_status(StatusCode::cancelled, "request cancelled"));
      return;
    }
    if (Clock::now() >= job->deadline) {
      if (job->claim()) job->fail(make_status(StatusCode::timed_out, "request past its deadline"));
      return;
    }
    {
      std::lock_guard lock(mu_);
      if (!stopping_) {
        active_.push_back(job);
        queue_.push_back(std::move(job));
        cv_.notify_one();
        return;
      }
    }
    if (job->claim()) job->fail(make_status(StatusCode::cancelled, "redis client closed"));
  }

  // A blocking call: runs `fn` on a worker; returns by the deadline or on cancel.
  template <typename T, typename F>
  Result<T> call(Deadline deadline, const CancelToken& cancel, F fn) {
    auto promise = std::make_shared<std::promise<Result<T>>>();
    auto future = promise->get_future();
    auto job = std::make_shared<Job>();
    job->deadline = deadline, job->cancel = cancel;
    job->fail = [promise](Status s) { promise->set_value(std::move(s)); };
    job->run = [promise, fn = std::move(fn)](Conn& conn, Job& j) mutable {
      Result<T> r = fn(conn, j.deadline);
      if (j.claim()) promise->set_value(std::move(r));
    };
    enqueue(std::move(job));
    return future.get();
  }

  void work() {
    Conn conn(cfg_);
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      auto job = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      if (!job->claimed.load()) job->run(conn, *job);
      lock.lock();
      active_.remove(job);
    }
  }

  // Completes calls that passed their deadline or were cancelled, every 10 ms.
  void reap() {
    std::unique_lock lock(mu_);
    while (!stopping_) {
      reaper_cv_.wait_for(lock, 10ms, [&] { return stopping_; });
      const auto now = Clock::now();
      std::vector<std::pair<std::shared_ptr<Job>, Status>> due;
      for (auto it = active_.begin(); it != active_.end();) {
        auto& j = *it;
        Status why;
        if (j->cancel.cancelled()) why = make_status(StatusCode::cancelled, "request cancelled");
        else if (now >= j->deadline) why = make_status(StatusCode::timed_out, "redis request passed its deadline");
        if (!why.ok() && j->claim()) due.emplace_back(j, why);
        // Claimed jobs still queued are dropped here; running ones by their worker.
        if (j->claimed.load() && std::find(queue_.begin(), queue_.end(), j) != queue_.end()) {
          queue_.erase(std::find(queue_.begin(), queue_.end(), j));
          it = active_.erase(it);
        } else {
          ++it;
        }
      }
      lock.unlock();
      for (auto& [j, why] : due) j->fail(why);
      lock.lock();
    }
  }
};

}  // namespace

bool available() noexcept { return true; }

Result<std::unique_ptr<storage::Client>> connect(const RedisConfig& config, Deadline deadline,
                                                 const CancelToken& cancel) {
  return RedisClient::create(config, deadline, cancel);
}

}  // namespace kvstream::redis

#else  // built without hiredis

namespace kvstream::redis {

bool available() noexcept { return false; }

Result<std::unique_ptr<storage::Client>> connect(const RedisConfig&, transport::Deadline,
                                                 const transport::CancelToken&) {
  return make_status(StatusCode::unsupported,
                     "kvstream was built without the Redis backend (install libhiredis-dev and reconfigure with "
                     "KVSTREAM_WITH_REDIS=AUTO or ON)");
}

}  // namespace kvstream::redis

#endif
