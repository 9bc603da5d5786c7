// The Redis Cluster storage client: the single-server client's calls and value format
// (redis_value.hpp), routed by hash slot (redis_cluster_route.hpp). Each worker thread
// keeps one connection per node it talks to; the slot map is shared and refreshed when
// a reply says it is stale (MOVED, a node that cannot be reached, a write that reached
// a replica).
#include "storage/redis/redis_cluster_client.hpp"

#include <algorithm>
#include <charconv>
#include <map>
#include <optional>
#include <set>

#include "core/log.hpp"
#include "storage/protocol.hpp"
#include "storage/redis/redis_cluster_route.hpp"
#include "storage/redis/redis_marks.hpp"
#include "storage/redis/redis_value.hpp"
#include "transport/common/address.hpp"

namespace kvstream::redis::detail {

using namespace std::chrono_literals;
using storage::ChunkStat;
using storage::GetCallback;
using transport::CancelToken;
using transport::Clock;
using transport::Deadline;
using transport::MemoryRegion;

namespace {

class ClusterClient final : public RedisClientBase {
 public:
  static Result<std::unique_ptr<storage::Client>> create(const RedisConfig& cfg, Deadline deadline,
                                                         const CancelToken& cancel) {
    KVS_RETURN_IF_ERROR(check_common(cfg));
    if (cfg.database != 0)
      return make_status(StatusCode::invalid_argument, "redis cluster has one database; database {} was asked for",
                         cfg.database);
    for (const auto& a : [&] {
           auto all = cfg.seeds;
           all.push_back(cfg.address);
           return all;
         }()) {
      std::string host;
      uint16_t port = 0;
      KVS_RETURN_IF_ERROR(transport::parse_host_port(a, host, port));
    }
    KVS_ASSIGN_OR_RETURN(ClientSecurity sec, make_security(cfg));
    auto c = std::unique_ptr<ClusterClient>(new ClusterClient(cfg, std::move(sec)));
    // The topology, once: proves a node is there, takes our password, and is a cluster.
    KVS_ASSIGN_OR_RETURN(auto r,
                         c->queue_->call<bool>(deadline, cancel, [](ClusterWorker& w, QueueJob& j) -> Result<bool> {
                           KVS_RETURN_IF_ERROR(refresh(w, j.deadline, 0));
                           return true;
                         }));
    (void)r;
    KVS_LOG_INFO("redis cluster storage client via {} (namespace '{}', {} slots covered, {} nodes, {} connections "
                 "per node, puts wait for {} replicas{})",
                 cfg.address, cfg.name_space, c->state_->map.covered(), c->state_->map.addresses().size(),
                 cfg.connections, cfg.put_replicas, c->state_->sec.describe());
    return std::unique_ptr<storage::Client>(std::move(c));
  }

  // The context's entry in the namespace's list and the chunk's in the context's set
  // first, then the chunk's keys in one transaction (one slot): a reader sees all of
  // one write or none of it, and a chunk a put acknowledged is always listed. Each
  // step waits for put_replicas replicas. `version` is ignored (arrival order).
  Status put_parts(const std::string& context, uint32_t chunk, uint32_t level, std::span<const std::byte> bytes,
                   std::span<const storage::ObjectPart> parts, uint64_t version, Deadline deadline,
                   const CancelToken& cancel) override {
    (void)version;
    KVS_RETURN_IF_ERROR(validate_put(context, level, bytes, parts));
    const std::string key = value_key(context, chunk, level);
    KVS_ASSIGN_OR_RETURN(const EncodedValue v, encode_value(key, bytes, state_->sec.sealer.get()));
    const auto table = storage::encode_parts(parts);
    auto r = queue_->call<bool>(
        deadline, cancel,
        [this, v, parts_value = std::string(reinterpret_cast<const char*>(table.data()), table.size()), key, context,
         chunk, level, size = std::to_string(bytes.size())](ClusterWorker& w, QueueJob& j) -> Result<bool> {
          const std::string contexts = contexts_key(), chunks = chunks_key(context), chunk_no = std::to_string(chunk);
          KVS_RETURN_IF_ERROR(write(w, j, contexts, {{"SADD", contexts, context}}));
          KVS_RETURN_IF_ERROR(write(w, j, chunks, {{"SADD", chunks, chunk_no}}));
          const std::string blocks = blocks_key(key), sizes = sizes_key(context, chunk),
                            parts_hash = parts_key(context, chunk), field = object_field(chunk, level);
          Command parts_cmd = parts_value.empty() ? Command{"HDEL", parts_hash, field}
                                                  : Command{"HSET", parts_hash, field, parts_value};
          std::vector<Command> tx{{"MULTI"},
                                  {"SET", key, *v.value},
                                  sums_command(v, blocks),
                                  {"HSET", sizes, field, size},
                                  parts_cmd,
                                  {"EXEC"}};
          KVS_RETURN_IF_ERROR(write(w, j, key, std::move(tx), 4));
          return true;
        });
    return r.status();
  }

  void get_async(const std::string& context, uint32_t chunk, uint32_t level, MemoryRegion dest, size_t offset,
                 size_t capacity, Deadline deadline, const CancelToken& cancel, GetCallback done) override {
    if (Status s = validate_get(context, level, dest, offset, capacity); !s.ok()) return done(s);
    queue_get(*queue_, value_key(context, chunk, level), std::move(dest), offset, capacity, deadline, cancel,
              std::move(done), on_slot, state_->sec.sealer.get());
  }

  void get_range_async(const std::string& context, uint32_t chunk, uint32_t level, uint64_t offset, uint64_t length,
                       MemoryRegion dest, size_t dest_offset, Deadline deadline, const CancelToken& cancel,
                       GetCallback done) override {
    if (Status s = validate_get_range(context, level, offset, length, dest, dest_offset); !s.ok()) return done(s);
    queue_get_range(*queue_, value_key(context, chunk, level), offset, length, std::move(dest), dest_offset, deadline,
                    cancel, std::move(done), on_slot, state_->sec.sealer.get());
  }

  // The context's chunk set, then each chunk's size and parts tables (one
  // transaction each, so both are of the same writes), the chunks of one node in one
  // pipeline.
  Result<std::vector<ChunkStat>> stat(const std::string& context, Deadline deadline,
                                      const CancelToken& cancel) override {
    KVS_RETURN_IF_ERROR(storage::validate_id(context, storage::kMaxContextBytes, "context id"));
    return queue_->call<std::vector<ChunkStat>>(
        deadline, cancel, [this, context](ClusterWorker& w, QueueJob& j) -> Result<std::vector<ChunkStat>> {
          KVS_ASSIGN_OR_RETURN(auto chunks, chunk_numbers(w, j, context, Access::read));
          std::vector<std::string> keys;  // sizes and parts per chunk; the groups' commands view them
          keys.reserve(2 * chunks.size());
          for (uint32_t chunk : chunks) keys.push_back(sizes_key(context, chunk)), keys.push_back(parts_key(context, chunk));
          std::vector<SlotGroup> groups;
          for (size_t i = 0; i < chunks.size(); ++i)
            groups.push_back({key_slot(keys[2 * i]),
                              {{"MULTI"}, {"HGETALL", keys[2 * i]}, {"HGETALL", keys[2 * i + 1]}, {"EXEC"}}});
          KVS_ASSIGN_OR_RETURN(auto replies, run_slot_groups(w, j, groups));
          std::map<uint32_t, ChunkStat> m;
          for (size_t i = 0; i < chunks.size(); ++i) {
            auto& rs = replies[i];
            KVS_RETURN_IF_ERROR(check_exec(rs, 2, "stat"));
            KVS_RETURN_IF_ERROR(
                merge_stat_tables(rs[3]->element[0], keys[2 * i], rs[3]->element[1], keys[2 * i + 1], m));
          }
          if (m.empty()) return make_status(StatusCode::not_found, "no context '{}'", context);
          return finish_stats(std::move(m));
        });
  }

  Status remove(const std::string& context, Deadline deadline, const CancelToken& cancel) override {
    KVS_RETURN_IF_ERROR(storage::validate_id(context, storage::kMaxContextBytes, "context id"));
    auto r = queue_->call<bool>(deadline, cancel, [this, context](ClusterWorker& w, QueueJob& j) -> Result<bool> {
      const std::string contexts = contexts_key(), chunks_set = chunks_key(context);
      KVS_ASSIGN_OR_RETURN(auto chunks, chunk_numbers(w, j, context, Access::write));
      KVS_ASSIGN_OR_RETURN(auto listed, run_slot(w, j, key_slot(contexts), {{"SISMEMBER", contexts, context}},
                                                 Access::write));
      KVS_RETURN_IF_ERROR(reply_error(listed[0].get(), "remove"));
      if (chunks.empty() && (listed[0]->type != REDIS_REPLY_INTEGER || listed[0]->integer == 0))
        return make_status(StatusCode::not_found, "no context '{}'", context);
      for (uint32_t chunk : chunks) {
        const std::string sizes = sizes_key(context, chunk), parts = parts_key(context, chunk);
        KVS_ASSIGN_OR_RETURN(auto fields, run_slot(w, j, key_slot(sizes), {{"HKEYS", sizes}}, Access::write));
        KVS_ASSIGN_OR_RETURN(auto names, string_set(fields[0].get(), "remove"));
        std::vector<std::string> keys;
        for (const auto& f : names) {
          const size_t colon = f.find(':');
          keys.push_back(fmt::format("kvs:{}:{}", chunk_tag(context, chunk), f.substr(colon + 1)));
          keys.push_back(blocks_key(keys.back()));
        }
        std::vector<Command> tx{{"MULTI"}};
        for (const auto& k : keys) tx.push_back({"DEL", k});
        tx.push_back({"DEL", sizes});
        tx.push_back({"DEL", parts});
        tx.push_back({"EXEC"});
        KVS_ASSIGN_OR_RETURN(auto done, run_slot(w, j, key_slot(sizes), tx, Access::write));
        KVS_RETURN_IF_ERROR(check_exec(done, tx.size() - 2, "remove"));
      }
      KVS_ASSIGN_OR_RETURN(auto d1, run_slot(w, j, key_slot(chunks_set), {{"DEL", chunks_set}}, Access::write));
      KVS_RETURN_IF_ERROR(reply_error(d1[0].get(), "remove"));
      const std::string marks = marks_key();  // the contexts' slot
      KVS_ASSIGN_OR_RETURN(auto d2, run_slot(w, j, key_slot(contexts),
                                             {{"SREM", contexts, context}, {"HDEL", marks, context}}, Access::write));
      KVS_RETURN_IF_ERROR(reply_error(d2[0].get(), "remove"));
      KVS_RETURN_IF_ERROR(reply_error(d2[1].get(), "remove"));
      return true;
    });
    return r.status();
  }

  Result<std::vector<std::string>> list(Deadline deadline, const CancelToken& cancel) override {
    return queue_->call<std::vector<std::string>>(
        deadline, cancel, [this](ClusterWorker& w, QueueJob& j) -> Result<std::vector<std::string>> {
          const std::string key = contexts_key();
          KVS_ASSIGN_OR_RETURN(auto rs, run_slot(w, j, key_slot(key), {{"SMEMBERS", key}}, Access::read));
          return string_set(rs[0].get(), "list");
        });
  }

  // The marks hash shares the contexts set's slot, so the script (redis_marks.hpp)
  // reads both on one node. A hint, not data: no WAIT for replicas.
  Status touch(std::span<const storage::ContextTouch> contexts, uint64_t stamp, Deadline deadline,
               const CancelToken& cancel) override {
    const std::string marks = marks_key();
    KVS_ASSIGN_OR_RETURN(auto argv, touch_command(marks, contexts_key(), contexts, stamp));
    if (argv.empty()) return {};
    auto r = queue_->call<bool>(
        deadline, cancel, [slot = key_slot(marks), argv = std::move(argv)](ClusterWorker& w, QueueJob& j) -> Result<bool> {
          KVS_ASSIGN_OR_RETURN(auto rs, run_slot(w, j, slot, {Command(argv.begin(), argv.end())}, Access::write));
          KVS_RETURN_IF_ERROR(reply_error(rs[0].get(), "touch"));
          return true;
        });
    return r.status();
  }

  // The contexts and marks from their slot, then every context's chunk set, then every
  // chunk's size table, each step one pipeline per node (run_slot_groups). Redis keeps
  // no write versions.
  Result<std::vector<storage::ContextUsage>> usage(const std::string& prefix, Deadline deadline,
                                                   const CancelToken& cancel) override {
    if (!prefix.empty()) KVS_RETURN_IF_ERROR(storage::validate_id(prefix, storage::kMaxContextBytes, "usage prefix"));
    return queue_->call<std::vector<storage::ContextUsage>>(
        deadline, cancel, [this, prefix](ClusterWorker& w, QueueJob& j) -> Result<std::vector<storage::ContextUsage>> {
          const std::string ctxs = contexts_key(), marks = marks_key();
          KVS_ASSIGN_OR_RETURN(auto rs,
                               run_slot(w, j, key_slot(ctxs), {{"SMEMBERS", ctxs}, {"HGETALL", marks}}, Access::read));
          KVS_ASSIGN_OR_RETURN(auto out, listed_with_marks(rs[0].get(), rs[1].get(), prefix));
          std::vector<std::string> sets;
          sets.reserve(out.size());
          std::vector<SlotGroup> groups;
          for (const auto& [name, u] : out) {
            sets.push_back(chunks_key(name));
            groups.push_back({key_slot(sets.back()), {{"SMEMBERS", sets.back()}}});
          }
          KVS_ASSIGN_OR_RETURN(auto set_replies, run_slot_groups(w, j, groups));
          std::vector<std::pair<storage::ContextUsage*, std::string>> tables;  // a context, one chunk's sizes key
          size_t i = 0;
          for (auto& [name, u] : out) {
            KVS_ASSIGN_OR_RETURN(auto chunks, parse_chunk_numbers(set_replies[i][0].get(), sets[i]));
            ++i;
            for (uint32_t chunk : chunks) tables.emplace_back(&u, sizes_key(name, chunk));
          }
          groups.clear();
          for (const auto& [u, key] : tables) groups.push_back({key_slot(key), {{"HGETALL", key}}});
          KVS_ASSIGN_OR_RETURN(auto size_replies, run_slot_groups(w, j, groups));
          std::map<const storage::ContextUsage*, std::set<uint32_t>> present;
          for (size_t t = 0; t < tables.size(); ++t)
            KVS_RETURN_IF_ERROR(add_sizes(size_replies[t][0].get(), tables[t].second, *tables[t].first,
                                          present[tables[t].first]));
          for (auto& [name, u] : out) {
            const auto& p = present[&u];
            u.chunks.assign(p.begin(), p.end());
          }
          return in_name_order(std::move(out));
        });
  }

 private:
  ClusterClient(const RedisConfig& cfg, ClientSecurity sec)
      : RedisClientBase(true), state_(std::make_unique<ClusterState>()) {
    state_->cfg = cfg;
    state_->sec = std::move(sec);
    queue_ = std::make_unique<Queue>(cfg.connections, [s = state_.get()] { return std::make_unique<ClusterWorker>(*s); });
  }

  std::unique_ptr<ClusterState> state_;
  std::unique_ptr<Queue> queue_;  // last: its threads stop before the state goes

  // Reads of `key` where its slot lives (replicas when the primary fails them).
  static Runner on_slot(ClusterWorker& w, QueueJob& j, const std::string& key) {
    return [&w, &j, slot = key_slot(key)](const std::vector<Command>& c) { return run_slot(w, j, slot, c, Access::read); };
  }

  const std::string& ns() const { return state_->cfg.name_space; }
  std::string chunk_tag(const std::string& ctx, uint32_t chunk) const {
    return fmt::format("{{{}:{}:{}}}", ns(), ctx, chunk);
  }
  std::string value_key(const std::string& ctx, uint32_t chunk, uint32_t level) const {
    return fmt::format("kvs:{}:{}", chunk_tag(ctx, chunk), level);
  }
  std::string sizes_key(const std::string& ctx, uint32_t chunk) const {
    return fmt::format("kvs:{}:sizes", chunk_tag(ctx, chunk));
  }
  std::string parts_key(const std::string& ctx, uint32_t chunk) const {
    return fmt::format("kvs:{}:parts", chunk_tag(ctx, chunk));
  }
  std::string chunks_key(const std::string& ctx) const { return fmt::format("kvs:{{{}:{}}}:chunks", ns(), ctx); }
  std::string contexts_key() const { return fmt::format("kvs:{{{}}}:contexts", ns()); }
  std::string marks_key() const { return fmt::format("kvs:{{{}}}:marks", ns()); }  // the contexts' slot

  // A write batch on `key`'s slot, then WAIT for put_replicas replicas. `exec_results`:
  // the batch is MULTI ... EXEC with that many commands inside.
  Status write(ClusterWorker& w, const QueueJob& j, const std::string& key, std::vector<Command> cmds,
               size_t exec_results = 0) const {
    const uint32_t want = state_->cfg.put_replicas;
    const size_t n = cmds.size();
    const std::string replicas = std::to_string(want);
    std::string wait_ms;
    if (want > 0) {
      // WAIT gives up a little before the call's deadline, so that its answer (how
      // many replicas have it) still arrives in time to be reported.
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(j.deadline - Clock::now());
      const auto margin = std::max<std::chrono::milliseconds>(left / 5, 50ms);
      wait_ms = std::to_string(std::max<int64_t>(1, (left - margin).count()));  // 0 would wait forever
      cmds.push_back({"WAIT", replicas, wait_ms});
    }
    KVS_ASSIGN_OR_RETURN(auto rs, run_slot(w, j, key_slot(key), cmds, Access::write));
    std::vector<Reply> own(std::make_move_iterator(rs.begin()), std::make_move_iterator(rs.begin() + n));
    if (exec_results > 0) KVS_RETURN_IF_ERROR(check_exec(own, exec_results, "put"));
    else
      for (auto& x : own) KVS_RETURN_IF_ERROR(reply_error(x.get(), "put"));
    if (want > 0) {
      const redisReply* acked = rs[n].get();
      KVS_RETURN_IF_ERROR(reply_error(acked, "WAIT"));
      if (acked->type != REDIS_REPLY_INTEGER || acked->integer < (long long)want)
        return make_status(StatusCode::unavailable,
                           "redis cluster: {} is on its primary, but {} of {} replicas acknowledged it in time (a "
                           "failover could lose it; put it again)",
                           key, acked->type == REDIS_REPLY_INTEGER ? acked->integer : 0, want);
    }
    return {};
  }

  Result<std::vector<uint32_t>> chunk_numbers(ClusterWorker& w, const QueueJob& j, const std::string& context,
                                              Access access) const {
    const std::string key = chunks_key(context);
    KVS_ASSIGN_OR_RETURN(auto rs, run_slot(w, j, key_slot(key), {{"SMEMBERS", key}}, access));
    return parse_chunk_numbers(rs[0].get(), key);
  }
  // A chunk set's members (SMEMBERS of `key`), as numbers in order.
  static Result<std::vector<uint32_t>> parse_chunk_numbers(const redisReply* members, const std::string& key) {
    KVS_ASSIGN_OR_RETURN(auto names, string_set(members, "chunk set"));
    std::vector<uint32_t> out;
    for (const auto& n : names) {
      uint32_t c = 0;
      const auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), c);
      if (ec != std::errc() || end != n.data() + n.size())
        return make_status(StatusCode::corrupt_data, "{} holds '{}', not a chunk number", key, n);
      out.push_back(c);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
};

}  // namespace

Result<std::unique_ptr<storage::Client>> connect_cluster(const RedisConfig& config, Deadline deadline,
                                                         const CancelToken& cancel) {
  return ClusterClient::create(config, deadline, cancel);
}

}  // namespace kvstream::redis::detail
