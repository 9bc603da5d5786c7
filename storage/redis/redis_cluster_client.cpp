// The Redis Cluster storage client: the single-server client's calls and value format
// (redis_value.hpp), routed by hash slot. Each worker thread keeps one connection per
// node it talks to; the slot map is shared and refreshed when a reply says it is
// stale (MOVED, a node that cannot be reached, a write that reached a replica).
#include "storage/redis/redis_cluster_client.hpp"

#include <algorithm>
#include <charconv>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "core/log.hpp"
#include "storage/protocol.hpp"
#include "storage/redis/redis_calls.hpp"
#include "storage/redis/redis_conn.hpp"
#include "storage/redis/redis_job_queue.hpp"
#include "storage/redis/redis_marks.hpp"
#include "storage/redis/redis_value.hpp"
#include "storage/redis/slot_map.hpp"
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

// What a reply batch says about where its slot lives.
struct Redirect {
  enum Kind { none, moved, ask, retry } kind = none;
  uint16_t slot = 0;
  std::string address;
  std::string why;
};

// The first cluster redirection among a batch's replies ("MOVED 3999 host:port",
// "ASK 3999 host:port"), or a state worth retrying: TRYAGAIN (a multi-key command
// during a slot's migration), CLUSTERDOWN, LOADING, MASTERDOWN, READONLY (a write
// that reached a node demoted to replica).
Redirect find_redirect(std::span<const Reply> rs) {
  for (const auto& r : rs) {
    if (r->type != REDIS_REPLY_ERROR) continue;
    const std::string_view e = reply_str(r.get());
    for (auto [prefix, kind] : {std::pair{std::string_view("MOVED "), Redirect::moved},
                                std::pair{std::string_view("ASK "), Redirect::ask}}) {
      if (e.substr(0, prefix.size()) != prefix) continue;
      const std::string_view rest = e.substr(prefix.size());
      const size_t space = rest.find(' ');
      uint32_t slot = 0;
      const auto [end, ec] = std::from_chars(rest.data(), rest.data() + std::min(space, rest.size()), slot);
      if (space == std::string_view::npos || ec != std::errc() || slot >= kSlots) break;
      std::string address(rest.substr(space + 1));
      // A node that does not know its own address answers ":port" (redis' '?'
      // endpoint): the host we asked is the best guess, and loopback clusters use it.
      if (!address.empty() && address[0] == ':') address = "127.0.0.1" + address;
      return {kind, uint16_t(slot), std::move(address), std::string(e)};
    }
    for (std::string_view p : {"TRYAGAIN", "CLUSTERDOWN", "LOADING", "MASTERDOWN", "READONLY"})
      if (e.substr(0, p.size()) == p) return {Redirect::retry, 0, {}, std::string(e)};
  }
  return {};
}

// Shared by the client and its workers.
struct ClusterState {
  RedisConfig cfg;
  ClientSecurity sec;
  SlotMap map;
  std::mutex refresh_mu;
  Clock::time_point last_refresh{};
};

// One worker thread's connections: one per node for primaries, one per node in
// READONLY mode for replica reads.
class ClusterWorker {
 public:
  explicit ClusterWorker(ClusterState& s) : s_(s) {}
  Conn& conn(const std::string& address, bool replica) {
    auto& m = replica ? replica_conns_ : primary_conns_;
    auto& c = m[address];
    if (!c)
      c = std::make_unique<Conn>(ConnSettings{address, s_.cfg.password, 0, s_.cfg.connect_timeout,
                                              /*read_only=*/replica, /*log_errors=*/false, s_.sec.tls});
    return *c;
  }
  ClusterState& state() { return s_; }

 private:
  ClusterState& s_;
  std::map<std::string, std::unique_ptr<Conn>> primary_conns_, replica_conns_;
};

using Queue = JobQueue<ClusterWorker>;
using QueueJob = Queue::JobT;

// Reads the topology from the first node that answers (the known nodes, then the
// seeds) and installs it. Skipped when someone refreshed since `seen` or within the
// last 50 ms (many workers see the same stale slot at once). CLUSTER SLOTS first:
// redis 7.0's CLUSTER SHARDS can list a just-promoted replica in a shard of its own,
// without slots, until the shard ids converge; SHARDS is the fallback for servers
// that drop SLOTS. Not logged: a failed refresh is not the call's error (the call's
// own deadline or redirection count is). Errors: unavailable, timed_out.
Status refresh(ClusterWorker& w, Deadline deadline, uint64_t seen, const std::string& failed = {}) {
  ClusterState& s = w.state();
  std::lock_guard lk(s.refresh_mu);
  if (s.map.version() != seen || Clock::now() - s.last_refresh < 50ms) return {};
  s.last_refresh = Clock::now();
  std::vector<std::string> ask = s.map.addresses();
  // Once a topology is known, a node that has not answered in 500 ms is passed over
  // for the next. The first one (at connect) waits for each seed up to
  // connect_timeout: its only seed may be on a slow link or a loaded host, and the
  // connect's own deadline is the caller's to choose.
  const Clock::duration per_node = ask.empty() ? Clock::duration(s.cfg.connect_timeout)
                                               : std::min<Clock::duration>(s.cfg.connect_timeout, 500ms);
  for (const auto& a : s.cfg.seeds) ask.push_back(a);
  ask.push_back(s.cfg.address);
  // The node that just failed us is asked last: a stalled one would hold each try.
  std::stable_partition(ask.begin(), ask.end(), [&](const std::string& a) { return a != failed; });
  Status last(StatusCode::unavailable, "no redis cluster node to ask for the topology");
  for (const auto& a : ask) {
    if (Clock::now() >= deadline) return Status(StatusCode::timed_out, "redis cluster topology: past the deadline");
    Conn& c = w.conn(a, false);
    const Deadline d = std::min(deadline, Clock::now() + per_node);
    auto rs = c.run({{"CLUSTER", "SLOTS"}}, d);
    if (!rs.ok()) {
      last = rs.status();
      continue;
    }
    Result<std::vector<ShardNodes>> shards = parse_cluster_slots((*rs)[0].get());
    if (!shards.ok() && (*rs)[0]->type == REDIS_REPLY_ERROR &&
        reply_str((*rs)[0].get()).find("nknown") != std::string_view::npos) {
      auto sh = c.run({{"CLUSTER", "SHARDS"}}, d);
      shards = sh.ok() ? parse_cluster_shards((*sh)[0].get()) : sh.status();
    }
    if (!shards.ok()) {
      last = shards.status();
      continue;
    }
    if (shards->empty()) {
      last = Status(StatusCode::unavailable, fmt::format("redis {} reports no slots (cluster not created yet?)", a));
      continue;
    }
    const uint32_t before = s.map.covered();
    s.map.install(*shards);
    KVS_LOG_DEBUG("redis cluster topology from {}: {} slot ranges, {} slots covered (was {})", a, shards->size(),
                  s.map.covered(), before);
    return {};
  }
  return last;
}

enum class Access { write, read };

// Waits `backoff` (never past the deadline) before a retry, and doubles it up to 50 ms.
void pause(Clock::duration& backoff, Deadline deadline) {
  const auto left = deadline - Clock::now();
  if (left > Clock::duration::zero()) std::this_thread::sleep_for(std::min(backoff, left));
  backoff = std::min<Clock::duration>(backoff * 2, 50ms);
}

// Runs `cmds` (all on keys of `slot`) where the slot lives, following redirections
// and waiting out failovers and migrations until the job's deadline. Reads go to a
// replica when the primary cannot be reached or is slower than replica_after. The
// replies are those of `cmds` (an ASKING prefix is stripped).
Result<std::vector<Reply>> run_slot(ClusterWorker& w, const QueueJob& j, uint16_t slot,
                                    const std::vector<Command>& cmds, Access access) {
  ClusterState& s = w.state();
  std::string ask;
  Status last;
  Clock::duration backoff = 2ms;
  int redirects = 0;  // MOVED and ASK: a loop of them is a broken cluster, not a wait
  for (int tries = 0;; ++tries) {
    if (!j.open()) return Status(StatusCode::cancelled, "call already completed");  // nobody waits for it
    if (Clock::now() >= j.deadline)
      return make_status(StatusCode::timed_out, "redis cluster: slot {} past the deadline{}{}", slot,
                         last.ok() ? "" : " (last: ", last.ok() ? "" : last.to_string() + ")");
    if (redirects > 64)
      return make_status(StatusCode::unavailable, "redis cluster: slot {}: redirected {} times", slot, redirects);
    const uint64_t seen = s.map.version();
    SlotMap::Route route = s.map.route(slot);
    if (route.primary.empty() && ask.empty()) {
      if (Status r = refresh(w, j.deadline, seen); !r.ok()) last = r;
      route = s.map.route(slot);
      if (route.primary.empty()) {
        pause(backoff, j.deadline);
        continue;
      }
    }
    std::vector<Command> batch;
    if (!ask.empty()) batch.push_back({"ASKING"});
    batch.insert(batch.end(), cmds.begin(), cmds.end());
    // A read gives its primary replica_after to answer, the first time or while the
    // slot has replicas to turn to (with none, waiting longer is the only way).
    Deadline d = j.deadline;
    if (access == Access::read && ask.empty() && (tries == 0 || !route.replicas.empty()))
      d = std::min(d, Clock::now() + s.cfg.replica_after);
    auto rs = w.conn(ask.empty() ? route.primary : ask, false).run(batch, d);
    if (!rs.ok()) {
      const StatusCode code = rs.status().code();
      if (code == StatusCode::permission_denied || code == StatusCode::invalid_argument)
        return make_status(code, "redis cluster: {}", rs.status().message());  // no node will answer otherwise
      last = rs.status();
      auto from_replicas = [&](const std::vector<std::string>& replicas) -> std::optional<std::vector<Reply>> {
        for (const auto& r : replicas) {
          auto got = w.conn(r, true).run(cmds, j.deadline);
          if (got.ok() && find_redirect(*got).kind == Redirect::none) return std::move(got).value();
        }
        return std::nullopt;
      };
      if (access == Access::read)
        if (auto got = from_replicas(route.replicas)) return std::move(*got);
      // A failover may have moved the slot, or replicas the map did not list come up.
      (void)refresh(w, j.deadline, seen, ask.empty() ? route.primary : ask);
      if (access == Access::read)
        if (const auto now_replicas = s.map.route(slot).replicas; now_replicas != route.replicas)
          if (auto got = from_replicas(now_replicas)) return std::move(*got);
      ask.clear();
      pause(backoff, j.deadline);
      continue;
    }
    const Redirect r = find_redirect(*rs);
    switch (r.kind) {
      case Redirect::none:
        if (!ask.empty()) rs->erase(rs->begin());
        return rs;
      case Redirect::moved:
        ++redirects;
        s.map.moved(r.slot, r.address);
        (void)refresh(w, j.deadline, seen);
        ask.clear();
        continue;
      case Redirect::ask:
        ++redirects;
        ask = r.address;
        continue;
      case Redirect::retry:
        last = Status(StatusCode::unavailable, r.why);
        if (r.why.rfind("TRYAGAIN", 0) != 0) (void)refresh(w, j.deadline, seen);
        ask.clear();
        pause(backoff, j.deadline);
        continue;
    }
  }
}

// Commands on the keys of one slot, for run_slot_groups.
struct SlotGroup {
  uint16_t slot = 0;
  std::vector<Command> cmds;
};

// Reads many slots at once: the groups are sorted by the node the map routes each slot
// to and sent to it in one pipeline (at most kGroupsPerPipeline groups each), so a
// listing of N chunks costs a round trip or two per node instead of one per chunk. A
// pipeline its primary does not answer within replica_after goes whole to a replica
// of that primary (so a stalled primary costs one wait, not one per chunk). A group
// whose replies carry a redirection or a retry state, or that no node answered, runs
// again alone through run_slot, which follows redirections and failovers. The
// replies per group, in the order given.
Result<std::vector<std::vector<Reply>>> run_slot_groups(ClusterWorker& w, const QueueJob& j,
                                                        const std::vector<SlotGroup>& groups) {
  constexpr size_t kGroupsPerPipeline = 256;
  ClusterState& s = w.state();
  std::vector<std::vector<Reply>> out(groups.size());
  std::map<std::string, std::vector<size_t>> by_node;
  std::vector<size_t> alone;
  for (size_t i = 0; i < groups.size(); ++i) {
    const SlotMap::Route route = s.map.route(groups[i].slot);
    if (route.primary.empty()) alone.push_back(i);
    else by_node[route.primary].push_back(i);
  }
  for (const auto& [node, members] : by_node)
    for (size_t at = 0; at < members.size(); at += kGroupsPerPipeline) {
      if (!j.open()) return Status(StatusCode::cancelled, "call already completed");
      const std::span<const size_t> part =
          std::span(members).subspan(at, std::min(kGroupsPerPipeline, members.size() - at));
      std::vector<Command> batch;
      for (size_t i : part) batch.insert(batch.end(), groups[i].cmds.begin(), groups[i].cmds.end());
      // As run_slot's first try of a read: the primary has replica_after to answer.
      auto rs = w.conn(node, false).run(batch, std::min(j.deadline, Clock::now() + s.cfg.replica_after));
      if (!rs.ok()) {
        const StatusCode code = rs.status().code();
        if (code == StatusCode::permission_denied || code == StatusCode::invalid_argument)
          return make_status(code, "redis cluster: {}", rs.status().message());
        for (const auto& replica : s.map.route(groups[part[0]].slot).replicas) {
          rs = w.conn(replica, true).run(batch, j.deadline);
          if (rs.ok()) break;
        }
        if (!rs.ok()) {
          alone.insert(alone.end(), part.begin(), part.end());
          continue;
        }
      }
      size_t k = 0;
      for (size_t i : part) {
        const std::span<Reply> mine = std::span(*rs).subspan(k, groups[i].cmds.size());
        k += mine.size();
        if (find_redirect(mine).kind != Redirect::none) {
          alone.push_back(i);
          continue;
        }
        out[i].assign(std::make_move_iterator(mine.begin()), std::make_move_iterator(mine.end()));
      }
    }
  for (size_t i : alone) {
    KVS_ASSIGN_OR_RETURN(out[i], run_slot(w, j, groups[i].slot, groups[i].cmds, Access::read));
  }
  return out;
}

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
