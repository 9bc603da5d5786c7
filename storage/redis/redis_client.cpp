// The Redis storage client (include/kvstream/redis_storage.hpp): a queue of calls
// served by one thread per hiredis connection, and a reaper that completes calls that
// pass their deadline or are cancelled while a command is still on the wire.
#include "kvstream/redis_storage.hpp"

#if KVSTREAM_HAVE_REDIS

#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "core/log.hpp"
#include "storage/protocol.hpp"
#include "storage/redis/redis_calls.hpp"
#include "storage/redis/redis_cluster_client.hpp"
#include "storage/redis/redis_conn.hpp"
#include "storage/redis/redis_job_queue.hpp"
#include "storage/redis/redis_marks.hpp"
#include "storage/redis/redis_value.hpp"
#include "transport/common/address.hpp"
#include "transport/common/registration.hpp"

namespace kvstream::redis {

using namespace detail;
using storage::ChunkStat;
using storage::GetCallback;
using transport::CancelToken;
using transport::Clock;
using transport::Deadline;
using transport::MemoryRegion;

namespace {

using Queue = JobQueue<Conn>;
using QueueJob = Queue::JobT;

class RedisClient final : public RedisClientBase {
 public:
  static Result<std::unique_ptr<storage::Client>> create(const RedisConfig& cfg, Deadline deadline,
                                                         const CancelToken& cancel) {
    KVS_RETURN_IF_ERROR(check_common(cfg));
    if (cfg.address.rfind("unix:", 0) != 0) {
      std::string host;
      uint16_t port = 0;
      KVS_RETURN_IF_ERROR(transport::parse_host_port(cfg.address, host, port));
    } else if (cfg.address.size() <= 5) {
      return make_status(StatusCode::invalid_argument, "redis address 'unix:' names no socket");
    }
    KVS_ASSIGN_OR_RETURN(ClientSecurity sec, make_security(cfg));
    auto c = std::unique_ptr<RedisClient>(new RedisClient(cfg, std::move(sec)));
    // One round trip proves the server is there (and takes our password), and that it
    // is not a cluster node (whose keys this layout would scatter across slots).
    KVS_ASSIGN_OR_RETURN(auto r, c->queue_->call<bool>(deadline, cancel, [](Conn& conn, QueueJob& j) -> Result<bool> {
      KVS_ASSIGN_OR_RETURN(auto replies, conn.run({{"PING"}, {"INFO", "cluster"}}, j.deadline));
      KVS_RETURN_IF_ERROR(reply_error(replies[0].get(), "PING"));
      if (reply_str(replies[1].get()).find("cluster_enabled:1") != std::string_view::npos)
        return make_status(StatusCode::invalid_argument,
                           "redis {} is a Redis Cluster node: set RedisConfig::cluster (the cluster key layout)",
                           conn.address());
      return true;
    }));
    (void)r;
    KVS_LOG_INFO("redis storage client on {} (namespace '{}', {} connections{})", cfg.address, cfg.name_space,
                 cfg.connections, c->sec_.describe());
    return std::unique_ptr<storage::Client>(std::move(c));
  }

  // The value, its block sums, its size and its parts (or their removal) in one
  // MULTI/EXEC, so a reader sees all of one write or none of it. Redis keeps no
  // versions: `version` is ignored, writes land in arrival order.
  Status put_parts(const std::string& context, uint32_t chunk, uint32_t level, std::span<const std::byte> bytes,
                   std::span<const storage::ObjectPart> parts, uint64_t version, Deadline deadline,
                   const CancelToken& cancel) override {
    (void)version;
    KVS_RETURN_IF_ERROR(validate_put(context, level, bytes, parts));
    const std::string key = chunk_key(context, chunk, level);
    // Copied (or sealed) here, so the call may end (cancel) while they are on the wire.
    KVS_ASSIGN_OR_RETURN(const EncodedValue v, encode_value(key, bytes, sec_.sealer.get()));
    const auto table = storage::encode_parts(parts);
    auto r = queue_->call<bool>(
        deadline, cancel,
        [v, parts_value = std::string(reinterpret_cast<const char*>(table.data()), table.size()), key,
         blocks_key = blocks_key(key), sizes = sizes_key(context), parts_hash = parts_key(context),
         field = object_field(chunk, level), size = std::to_string(bytes.size()), contexts = contexts_key(),
         context](Conn& conn, QueueJob& j) -> Result<bool> {
          Command parts_cmd = parts_value.empty() ? Command{"HDEL", parts_hash, field}
                                                  : Command{"HSET", parts_hash, field, parts_value};
          KVS_ASSIGN_OR_RETURN(auto rs, conn.run({{"MULTI"},
                                                  {"SET", key, *v.value},
                                                  sums_command(v, blocks_key),
                                                  {"HSET", sizes, field, size},
                                                  parts_cmd,
                                                  {"SADD", contexts, context},
                                                  {"EXEC"}},
                                                 j.deadline));
          KVS_RETURN_IF_ERROR(check_exec(rs, 5, "put"));
          return true;
        });
    return r.status();
  }

  void get_async(const std::string& context, uint32_t chunk, uint32_t level, MemoryRegion dest, size_t offset,
                 size_t capacity, Deadline deadline, const CancelToken& cancel, GetCallback done) override {
    if (Status s = validate_get(context, level, dest, offset, capacity); !s.ok()) return done(s);
    queue_get(*queue_, chunk_key(context, chunk, level), std::move(dest), offset, capacity, deadline, cancel,
              std::move(done), on_conn, sec_.sealer.get());
  }

  // A range read (redis_value.hpp's read_range): at most two blocks' worth more than
  // the range crosses the wire, and each block is verified.
  void get_range_async(const std::string& context, uint32_t chunk, uint32_t level, uint64_t offset, uint64_t length,
                       MemoryRegion dest, size_t dest_offset, Deadline deadline, const CancelToken& cancel,
                       GetCallback done) override {
    if (Status s = validate_get_range(context, level, offset, length, dest, dest_offset); !s.ok()) return done(s);
    queue_get_range(*queue_, chunk_key(context, chunk, level), offset, length, std::move(dest), dest_offset, deadline,
                    cancel, std::move(done), on_conn, sec_.sealer.get());
  }

  Result<std::vector<ChunkStat>> stat(const std::string& context, Deadline deadline,
                                      const CancelToken& cancel) override {
    KVS_RETURN_IF_ERROR(storage::validate_id(context, storage::kMaxContextBytes, "context id"));
    return queue_->call<std::vector<ChunkStat>>(
        deadline, cancel,
        [sizes = sizes_key(context), parts_hash = parts_key(context), context](
            Conn& conn, QueueJob& j) -> Result<std::vector<ChunkStat>> {
          // Sizes and parts in one transaction: both of the same writes.
          KVS_ASSIGN_OR_RETURN(auto rs, conn.run({{"MULTI"}, {"HGETALL", sizes}, {"HGETALL", parts_hash}, {"EXEC"}},
                                                 j.deadline));
          KVS_RETURN_IF_ERROR(check_exec(rs, 2, "stat"));
          std::map<uint32_t, ChunkStat> m;
          KVS_RETURN_IF_ERROR(merge_stat_tables(rs[3]->element[0], sizes, rs[3]->element[1], parts_hash, m));
          if (m.empty()) return make_status(StatusCode::not_found, "no context '{}'", context);
          return finish_stats(std::move(m));
        });
  }

  Status remove(const std::string& context, Deadline deadline, const CancelToken& cancel) override {
    KVS_RETURN_IF_ERROR(storage::validate_id(context, storage::kMaxContextBytes, "context id"));
    auto r = queue_->call<bool>(deadline, cancel, [this, sizes = sizes_key(context), context](
                                                      Conn& conn, QueueJob& j) -> Result<bool> {
      KVS_ASSIGN_OR_RETURN(auto rs, conn.run({{"HKEYS", sizes}, {"SISMEMBER", contexts_key(), context}}, j.deadline));
      KVS_RETURN_IF_ERROR(reply_error(rs[0].get(), "remove"));
      if (rs[0]->elements == 0 && (rs[1]->type != REDIS_REPLY_INTEGER || rs[1]->integer == 0))
        return make_status(StatusCode::not_found, "no context '{}'", context);
      std::vector<std::string> keys;
      for (size_t i = 0; i < rs[0]->elements; ++i) {
        keys.push_back(fmt::format("kvs:{}:{}:{}", cfg_.name_space, context, reply_str(rs[0]->element[i])));
        keys.push_back(blocks_key(keys.back()));
      }
      std::vector<Command> cmds{{"MULTI"}};
      for (const auto& k : keys) cmds.push_back({"DEL", k});
      const std::string ck = contexts_key(), pk = parts_key(context), mk = marks_key();
      cmds.push_back({"DEL", sizes});
      cmds.push_back({"DEL", pk});
      cmds.push_back({"SREM", ck, context});
      cmds.push_back({"HDEL", mk, context});
      cmds.push_back({"EXEC"});
      KVS_ASSIGN_OR_RETURN(auto done, conn.run(cmds, j.deadline));
      KVS_RETURN_IF_ERROR(check_exec(done, cmds.size() - 2, "remove"));
      return true;
    });
    return r.status();
  }

  Result<std::vector<std::string>> list(Deadline deadline, const CancelToken& cancel) override {
    return queue_->call<std::vector<std::string>>(
        deadline, cancel, [key = contexts_key()](Conn& conn, QueueJob& j) -> Result<std::vector<std::string>> {
          KVS_ASSIGN_OR_RETURN(auto rs, conn.run({{"SMEMBERS", key}}, j.deadline));
          return string_set(rs[0].get(), "list");
        });
  }

  // The marks live in one hash per namespace (redis_marks.hpp).
  Status touch(std::span<const storage::ContextTouch> contexts, uint64_t stamp, Deadline deadline,
               const CancelToken& cancel) override {
    KVS_ASSIGN_OR_RETURN(auto argv, touch_command(marks_key(), contexts_key(), contexts, stamp));
    if (argv.empty()) return {};
    auto r = queue_->call<bool>(
        deadline, cancel, [argv = std::move(argv)](Conn& conn, QueueJob& j) -> Result<bool> {
          KVS_ASSIGN_OR_RETURN(auto rs, conn.run({Command(argv.begin(), argv.end())}, j.deadline));
          KVS_RETURN_IF_ERROR(reply_error(rs[0].get(), "touch"));
          return true;
        });
    return r.status();
  }

  // The contexts and marks in one round trip, then every listed context's size table,
  // pipelined. Redis keeps no write versions (`written` 0).
  Result<std::vector<storage::ContextUsage>> usage(const std::string& prefix, Deadline deadline,
                                                   const CancelToken& cancel) override {
    if (!prefix.empty()) KVS_RETURN_IF_ERROR(storage::validate_id(prefix, storage::kMaxContextBytes, "usage prefix"));
    return queue_->call<std::vector<storage::ContextUsage>>(
        deadline, cancel,
        [this, prefix](Conn& conn, QueueJob& j) -> Result<std::vector<storage::ContextUsage>> {
          const std::string ck = contexts_key(), mk = marks_key();
          KVS_ASSIGN_OR_RETURN(auto rs, conn.run({{"SMEMBERS", ck}, {"HGETALL", mk}}, j.deadline));
          KVS_ASSIGN_OR_RETURN(auto out, listed_with_marks(rs[0].get(), rs[1].get(), prefix));
          KVS_RETURN_IF_ERROR(fill_sizes(conn, j, out));
          return in_name_order(std::move(out));
        });
  }

 private:
  RedisClient(RedisConfig cfg, ClientSecurity sec) : RedisClientBase(false), cfg_(std::move(cfg)), sec_(std::move(sec)) {
    ConnSettings cs{cfg_.address, cfg_.password, cfg_.database, cfg_.connect_timeout, false};
    cs.tls = sec_.tls;
    queue_ = std::make_unique<Queue>(cfg_.connections, [cs] { return std::make_unique<Conn>(cs); });
  }

  const RedisConfig cfg_;
  const ClientSecurity sec_;
  std::unique_ptr<Queue> queue_;  // last: its threads stop before the rest goes

  // One server: every key is on the worker's connection.
  static Runner on_conn(Conn& conn, QueueJob& j, const std::string&) {
    return [&conn, &j](const std::vector<Command>& c) { return conn.run(c, j.deadline); };
  }

  std::string chunk_key(const std::string& ctx, uint32_t chunk, uint32_t level) const {
    return fmt::format("kvs:{}:{}:{}:{}", cfg_.name_space, ctx, chunk, level);
  }
  std::string sizes_key(const std::string& ctx) const { return fmt::format("kvs:{}:{}:sizes", cfg_.name_space, ctx); }
  std::string parts_key(const std::string& ctx) const { return fmt::format("kvs:{}:{}:parts", cfg_.name_space, ctx); }
  std::string contexts_key() const { return fmt::format("kvs:{}:contexts", cfg_.name_space); }
  std::string marks_key() const { return fmt::format("kvs:{}:marks", cfg_.name_space); }


  // Sums each context's size table (fields "<chunk>:<level>") into its bytes and chunks,
  // 512 tables a pipelined round trip.
  Status fill_sizes(Conn& conn, QueueJob& j, std::map<std::string, storage::ContextUsage>& out) const {
    std::vector<std::string> keys;
    std::vector<storage::ContextUsage*> targets;
    for (auto& [name, u] : out) keys.push_back(sizes_key(name)), targets.push_back(&u);
    for (size_t first = 0; first < keys.size(); first += 512) {
      std::vector<Command> cmds;
      const size_t end = std::min(keys.size(), first + 512);
      for (size_t i = first; i < end; ++i) cmds.push_back({"HGETALL", keys[i]});
      KVS_ASSIGN_OR_RETURN(auto rs, conn.run(cmds, j.deadline));
      for (size_t i = first; i < end; ++i) {
        std::set<uint32_t> chunks;
        KVS_RETURN_IF_ERROR(add_sizes(rs[i - first].get(), keys[i], *targets[i], chunks));
        targets[i]->chunks.assign(chunks.begin(), chunks.end());
      }
    }
    return {};
  }
};

}  // namespace

bool available() noexcept { return true; }

Result<std::unique_ptr<storage::Client>> connect(const RedisConfig& config, Deadline deadline,
                                                 const CancelToken& cancel) {
  if (config.cluster) return connect_cluster(config, deadline, cancel);
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
