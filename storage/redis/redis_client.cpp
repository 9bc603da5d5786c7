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
#include "transport/common/address.hpp"
#include "transport/common/registration.hpp"
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
// A range read verifies the blocks it touches: the payload's block sums are stored
// beside it (redis_storage.hpp), one u64 per block of this many bytes.
constexpr uint64_t kBlockBytes = uint64_t(64) << 10;

// A value's checksum is seeded with its key, so a value copied or renamed to another
// key (another chunk or level) fails it, as the node's object headers do.
uint64_t bound_checksum(const std::string& key, std::span<const std::byte> payload) {
  return XXH3_64bits_withSeed(payload.data(), payload.size(), XXH3_64bits(key.data(), key.size()));
}
// Block i's sum is seeded with the key and i, so a block moved within a value, or a
// table copied to another key, fails it.
uint64_t block_checksum(uint64_t key_seed, uint64_t i, std::span<const std::byte> block) {
  return XXH3_64bits_withSeed(block.data(), block.size(), key_seed + i);
}
uint64_t load_le64(const char* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8; ++i) v |= uint64_t(uint8_t(p[i])) << (8 * i);
  return v;
}
void store_le64(char* p, uint64_t v) {
  for (size_t i = 0; i < 8; ++i) p[i] = char(uint8_t(v >> (8 * i)));
}
std::string_view reply_str(const redisReply* r) {
  return r && r->str ? std::string_view(r->str, r->len) : std::string_view();
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

  // Values travel through hiredis' buffers in host memory: a get is copied into the
  // destination, so only host destinations are possible.
  const transport::Capabilities* capabilities() const override {
    static const transport::Capabilities caps{.backend = "redis",
                                              .provider = "hiredis over tcp",
                                              .host_memory = true,
                                              .cuda_memory = false,
                                              .one_sided_read = false,
                                              .notifications = false,
                                              .max_message_bytes = storage::kMaxChunkBytes};
    return &caps;
  }

  Result<MemoryRegion> register_memory(void* data, size_t size, transport::MemoryType type) override {
    if (type != transport::MemoryType::host)
      return make_status(StatusCode::unsupported,
                         "redis: values are copied through host memory, so a {} destination cannot be registered",
                         transport::memory_type_name(type));
    return register_memory(data, size);
  }

  Result<MemoryRegion> register_memory(void* data, size_t size) override {
    if (data == nullptr || size == 0)
      return make_status(StatusCode::invalid_argument, "register_memory: empty range (data {}, size {})", data, size);
    auto r = std::make_shared<HostRegion>();
    r->data = static_cast<std::byte*>(data), r->size = size, r->type = transport::MemoryType::host;
    return transport::RegionAccess::wrap(std::move(r));
  }

  Status put(const std::string& context, uint32_t chunk, uint32_t level, std::span<const std::byte> bytes,
             Deadline deadline, const CancelToken& cancel) override {
    return put_parts(context, chunk, level, bytes, {}, 0, deadline, cancel);
  }

  // The value, its block sums, its size and its parts (or their removal) in one
  // MULTI/EXEC, so a reader sees all of one write or none of it. Redis keeps no
  // versions: `version` is ignored, writes land in arrival order.
  Status put_parts(const std::string& context, uint32_t chunk, uint32_t level, std::span<const std::byte> bytes,
                   std::span<const storage::ObjectPart> parts, uint64_t version, Deadline deadline,
                   const CancelToken& cancel) override {
    (void)version;
    KVS_RETURN_IF_ERROR(storage::validate_id(context, storage::kMaxContextBytes, "context id"));
    if (level >= storage::kMaxLevels || bytes.size() > storage::kMaxChunkBytes)
      return make_status(StatusCode::out_of_range, "level {} / {} bytes beyond the store's bounds", level,
                         bytes.size());
    KVS_RETURN_IF_ERROR(storage::validate_parts(parts, bytes.size()));
    const std::string key = chunk_key(context, chunk, level);
    // Copied here, so the call may end (cancel) while they are on the wire.
    auto value = std::make_shared<std::string>(kChecksumBytes + bytes.size(), '\0');
    store_le64(value->data(), bound_checksum(key, bytes));
    if (!bytes.empty()) std::memcpy(value->data() + kChecksumBytes, bytes.data(), bytes.size());
    const uint64_t blocks = (bytes.size() + kBlockBytes - 1) / kBlockBytes, seed = XXH3_64bits(key.data(), key.size());
    auto sums = std::make_shared<std::string>(blocks * 8, '\0');
    for (uint64_t i = 0; i < blocks; ++i)
      store_le64(sums->data() + i * 8,
                 block_checksum(seed, i,
                                bytes.subspan(i * kBlockBytes, std::min(kBlockBytes, bytes.size() - i * kBlockBytes))));
    const auto table = storage::encode_parts(parts);
    auto parts_value = std::make_shared<std::string>(reinterpret_cast<const char*>(table.data()), table.size());
    auto r = call<bool>(deadline, cancel,
                        [value, sums, parts_value, key, blocks_key = blocks_key(key), sizes = sizes_key(context),
                         parts_hash = parts_key(context), field = fmt::format("{}:{}", chunk, level),
                         size = std::to_string(bytes.size()), contexts = contexts_key(),
                         context](Conn& conn, Deadline d) -> Result<bool> {
                          std::vector<std::string_view> parts_cmd =
                              parts_value->empty()
                                  ? std::vector<std::string_view>{"HDEL", parts_hash, field}
                                  : std::vector<std::string_view>{"HSET", parts_hash, field, *parts_value};
                          KVS_ASSIGN_OR_RETURN(auto rs, conn.run({{"MULTI"},
                                                                  {"SET", key, *value},
                                                                  {"SET", blocks_key, *sums},
                                                                  {"HSET", sizes, field, size},
                                                                  parts_cmd,
                                                                  {"SADD", contexts, context},
                                                                  {"EXEC"}},
                                                                 d));
                          for (auto& x : rs) KVS_RETURN_IF_ERROR(reply_error(x.get(), "put"));
                          if (rs[6]->type != REDIS_REPLY_ARRAY || rs[6]->elements != 5)
                            return make_status(StatusCode::unavailable, "redis put transaction was aborted");
                          for (size_t i = 0; i < 5; ++i) KVS_RETURN_IF_ERROR(reply_error(rs[6]->element[i], "put"));
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

  // One MULTI/EXEC reads the value's length, the blocks that hold the range and their
  // sums; each block is verified before the range is copied out (one copy, as for
  // get). A value stored without block sums (by an older client) is read whole and
  // verified instead.
  void get_range_async(const std::string& context, uint32_t chunk, uint32_t level, uint64_t offset, uint64_t length,
                       MemoryRegion dest, size_t dest_offset, Deadline deadline, const CancelToken& cancel,
                       GetCallback done) override {
    if (Status s = storage::validate_id(context, storage::kMaxContextBytes, "context id"); !s.ok()) return done(s);
    if (level >= storage::kMaxLevels) return done(make_status(StatusCode::out_of_range, "level {}", level));
    if (length == 0) return done(make_status(StatusCode::invalid_argument, "a range of 0 bytes"));
    if (offset > storage::kMaxChunkBytes || length > storage::kMaxChunkBytes - offset)
      return done(make_status(StatusCode::out_of_range, "range [{}, +{}) past the largest object ({} bytes)", offset,
                              length, storage::kMaxChunkBytes));
    if (!dest.valid() || dest.span(dest_offset, length).size() != length)
      return done(make_status(StatusCode::invalid_argument, "destination [{}, {}) is outside its registered region",
                              dest_offset, dest_offset + length));
    auto job = std::make_shared<Job>();
    job->deadline = deadline, job->cancel = cancel;
    auto shared_done = std::make_shared<GetCallback>(std::move(done));
    job->fail = [shared_done](Status s) { (*shared_done)(std::move(s)); };
    const std::string key = chunk_key(context, chunk, level);
    job->run = [shared_done, key, blocks_key = blocks_key(key), dest = std::move(dest), offset, length, dest_offset](
                   Conn& conn, Job& j) mutable {
      Result<RangeRead> got = read_range(conn, j.deadline, key, blocks_key, offset, length);
      if (got.ok() && j.claim()) {
        std::memcpy(dest.span(dest_offset, length).data(), got->bytes.data(), length);
        dest = {};
        (*shared_done)(size_t(length));
        return;
      }
      dest = {};  // else completed already (deadline, cancel): the buffer is no longer ours
      if (!got.ok() && j.claim()) (*shared_done)(got.status());
    };
    enqueue(std::move(job));
  }

  Result<std::vector<ChunkStat>> stat(const std::string& context, Deadline deadline,
                                      const CancelToken& cancel) override {
    KVS_RETURN_IF_ERROR(storage::validate_id(context, storage::kMaxContextBytes, "context id"));
    return call<std::vector<ChunkStat>>(
        deadline, cancel,
        [sizes = sizes_key(context), parts_hash = parts_key(context), context](
            Conn& conn, Deadline d) -> Result<std::vector<ChunkStat>> {
          // Sizes and parts in one transaction: both of the same writes.
          KVS_ASSIGN_OR_RETURN(auto rs,
                               conn.run({{"MULTI"}, {"HGETALL", sizes}, {"HGETALL", parts_hash}, {"EXEC"}}, d));
          for (auto& x : rs) KVS_RETURN_IF_ERROR(reply_error(x.get(), "stat"));
          if (rs[3]->type != REDIS_REPLY_ARRAY || rs[3]->elements != 2)
            return make_status(StatusCode::unavailable, "redis stat transaction was aborted");
          const redisReply* r = rs[3]->element[0];
          const redisReply* p = rs[3]->element[1];
          KVS_RETURN_IF_ERROR(reply_error(r, "stat"));
          KVS_RETURN_IF_ERROR(reply_error(p, "stat"));
          if (r->type != REDIS_REPLY_ARRAY || r->elements % 2)
            return make_status(StatusCode::corrupt_data, "{} is not a size table", sizes);
          if (p->type != REDIS_REPLY_ARRAY || p->elements % 2)
            return make_status(StatusCode::corrupt_data, "{} is not a parts table", parts_hash);
          if (r->elements == 0) return make_status(StatusCode::not_found, "no context '{}'", context);
          std::map<uint32_t, ChunkStat> m;
          for (size_t i = 0; i < r->elements; i += 2) {
            uint32_t chunk = 0, level = 0;
            uint64_t bytes = 0;
            const std::string_view fs = reply_str(r->element[i]), vs = reply_str(r->element[i + 1]);
            if (!parse_field(fs, chunk, level) || !parse_uint(vs, bytes) || bytes > storage::kMaxChunkBytes)
              return make_status(StatusCode::corrupt_data, "{} has a bad entry '{}' = '{}'", sizes, fs, vs);
            auto& sz = m[chunk].level_bytes;
            m[chunk].chunk = chunk;
            if (sz.size() <= level) sz.resize(level + 1, 0);
            sz[level] = bytes;
          }
          for (size_t i = 0; i < p->elements; i += 2) {
            uint32_t chunk = 0, level = 0;
            const std::string_view fs = reply_str(p->element[i]), vs = reply_str(p->element[i + 1]);
            std::map<uint32_t, ChunkStat>::iterator it;
            if (!parse_field(fs, chunk, level) || (it = m.find(chunk)) == m.end() ||
                it->second.level_bytes.size() <= level)
              return make_status(StatusCode::corrupt_data, "{} has parts of an object not stored: '{}'", parts_hash,
                                 fs);
            auto parts = storage::decode_parts(std::as_bytes(std::span(vs.data(), vs.size())));
            Status valid = parts.ok() ? storage::validate_parts(*parts, it->second.level_bytes[level]) : parts.status();
            if (!valid.ok())
              return make_status(StatusCode::corrupt_data, "{}: the parts of '{}': {}", parts_hash, fs,
                                 valid.message());
            auto& lp = it->second.level_parts;
            if (lp.size() <= level) lp.resize(level + 1);
            lp[level] = std::move(parts).value();
          }
          std::vector<ChunkStat> out;
          for (auto& [chunk, st] : m) {
            storage::trim_level_parts(st.level_parts);
            out.push_back(std::move(st));
          }
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
                          for (size_t i = 0; i < rs[0]->elements; ++i) {
                            keys.push_back(fmt::format("kvs:{}:{}:{}", cfg_.name_space, context,
                                                       std::string_view(rs[0]->element[i]->str, rs[0]->element[i]->len)));
                            keys.push_back(blocks_key(keys.back()));
                          }
                          std::vector<std::vector<std::string_view>> cmds{{"MULTI"}};
                          for (const auto& k : keys) cmds.push_back({"DEL", k});
                          const std::string ck = contexts_key(), pk = parts_key(context);
                          cmds.push_back({"DEL", sizes});
                          cmds.push_back({"DEL", pk});
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
  std::string parts_key(const std::string& ctx) const { return fmt::format("kvs:{}:{}:parts", cfg_.name_space, ctx); }
  static std::string blocks_key(const std::string& chunk_key) { return chunk_key + ":blocks"; }

  // "chunk:level", as the size and parts tables name an object.
  static bool parse_field(std::string_view f, uint32_t& chunk, uint32_t& level) {
    const size_t colon = f.find(':');
    return colon != std::string_view::npos && parse_uint(f.substr(0, colon), chunk) &&
           parse_uint(f.substr(colon + 1), level) && level < storage::kMaxLevels;
  }

  // Verified bytes of a payload, inside the reply that holds them.
  struct RangeRead {
    Reply owner;
    std::span<const std::byte> bytes;
  };

  // Bytes [offset, offset + length) of the payload under `key`, verified. Errors:
  // not_found, out_of_range, corrupt_data, those of the connection.
  static Result<RangeRead> read_range(Conn& conn, Deadline d, const std::string& key, const std::string& blocks_key,
                                      uint64_t offset, uint64_t length) {
    const uint64_t b0 = offset / kBlockBytes, b1 = (offset + length + kBlockBytes - 1) / kBlockBytes;
    const std::string from = std::to_string(kChecksumBytes + b0 * kBlockBytes),
                      to = std::to_string(kChecksumBytes + b1 * kBlockBytes - 1), sums_from = std::to_string(b0 * 8),
                      sums_to = std::to_string(b1 * 8 - 1);
    KVS_ASSIGN_OR_RETURN(auto rs, conn.run({{"MULTI"},
                                            {"STRLEN", key},
                                            {"GETRANGE", key, from, to},
                                            {"GETRANGE", blocks_key, sums_from, sums_to},
                                            {"STRLEN", blocks_key},
                                            {"EXEC"}},
                                           d));
    for (auto& x : rs) KVS_RETURN_IF_ERROR(reply_error(x.get(), "get range"));
    const redisReply* e = rs[5].get();
    if (e->type != REDIS_REPLY_ARRAY || e->elements != 4)
      return make_status(StatusCode::unavailable, "redis range transaction was aborted");
    for (size_t i = 0; i < 4; ++i) {
      Status s = reply_error(e->element[i], "get range");
      if (!s.ok()) return make_status(StatusCode::corrupt_data, "{} is not a chunk: {}", key, s.message());
    }
    if (e->element[0]->type != REDIS_REPLY_INTEGER || e->element[3]->type != REDIS_REPLY_INTEGER ||
        e->element[1]->type != REDIS_REPLY_STRING || e->element[2]->type != REDIS_REPLY_STRING)
      return make_status(StatusCode::corrupt_data, "{} is not a chunk", key);
    const long long stored = e->element[0]->integer;
    if (stored == 0) return make_status(StatusCode::not_found, "no object {}", key);
    if (stored < (long long)kChecksumBytes)
      return make_status(StatusCode::corrupt_data, "{} is {} bytes, shorter than its checksum", key, stored);
    const uint64_t size = uint64_t(stored) - kChecksumBytes;
    if (offset > size || length > size - offset)
      return make_status(StatusCode::out_of_range, "range [{}, {}) ends past the end of {} ({} bytes)", offset,
                         offset + length, key, size);
    const uint64_t blocks = (size + kBlockBytes - 1) / kBlockBytes;
    if (e->element[3]->integer == 0) {
      // No block sums: the whole value, under its own checksum.
      KVS_ASSIGN_OR_RETURN(auto whole, conn.run({{"GET", key}}, d));
      const redisReply* w = whole[0].get();
      KVS_RETURN_IF_ERROR(reply_error(w, "get"));
      if (w->type == REDIS_REPLY_NIL) return make_status(StatusCode::not_found, "no object {}", key);
      if (w->type != REDIS_REPLY_STRING || size_t(w->len) < kChecksumBytes)
        return make_status(StatusCode::corrupt_data, "{} is not a chunk", key);
      const auto* p = reinterpret_cast<const std::byte*>(w->str);
      const std::span<const std::byte> payload(p + kChecksumBytes, size_t(w->len) - kChecksumBytes);
      if (bound_checksum(key, payload) != load_le64(w->str))
        return make_status(StatusCode::corrupt_data, "{} failed its checksum", key);
      if (offset > payload.size() || length > payload.size() - offset)  // replaced since
        return make_status(StatusCode::out_of_range, "range [{}, {}) ends past the end of {} ({} bytes)", offset,
                           offset + length, key, payload.size());
      return RangeRead{std::move(whole[0]), payload.subspan(offset, length)};
    }
    if (uint64_t(e->element[3]->integer) != blocks * 8)
      return make_status(StatusCode::corrupt_data, "{}: {} bytes of block sums for {} blocks", key,
                         e->element[3]->integer, blocks);
    const redisReply* data = e->element[1];
    const redisReply* sums = e->element[2];
    const uint64_t first = b0 * kBlockBytes, data_bytes = std::min(b1 * kBlockBytes, size) - first;
    if (uint64_t(data->len) != data_bytes || uint64_t(sums->len) != (b1 - b0) * 8)
      return make_status(StatusCode::corrupt_data, "{}: a range read returned {} bytes and {} sums", key, data->len,
                         sums->len);
    const auto* p = reinterpret_cast<const std::byte*>(data->str);
    const uint64_t seed = XXH3_64bits(key.data(), key.size());
    for (uint64_t i = b0; i < b1; ++i) {
      const uint64_t at = (i - b0) * kBlockBytes, n = std::min(kBlockBytes, data_bytes - at);
      if (block_checksum(seed, i, std::span(p + at, n)) != load_le64(sums->str + (i - b0) * 8))
        return make_status(StatusCode::corrupt_data, "{} failed its checksum (block {})", key, i);
    }
    return RangeRead{std::move(rs[5]), std::span<const std::byte>(p + (offset - first), length)};
  }
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
