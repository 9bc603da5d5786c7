// How the Redis Cluster client reaches a slot (redis_cluster_client.cpp): the state
// its workers share (the slot map, refreshed when a reply says it is stale), each
// worker's connections, and runs of commands on one slot or on many at once that
// follow redirections (MOVED, ASK) and wait out failovers and migrations until the
// job's deadline.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kvstream/redis_storage.hpp"
#include "storage/redis/redis_calls.hpp"
#include "storage/redis/redis_conn.hpp"
#include "storage/redis/redis_job_queue.hpp"
#include "storage/redis/slot_map.hpp"

namespace kvstream::redis::detail {

// Shared by the client and its workers.
struct ClusterState {
  RedisConfig cfg;
  ClientSecurity sec;
  SlotMap map;
  std::mutex refresh_mu;
  transport::Clock::time_point last_refresh{};
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
Status refresh(ClusterWorker& w, transport::Deadline deadline, uint64_t seen, const std::string& failed = {});

enum class Access { write, read };

// Runs `cmds` (all on keys of `slot`) where the slot lives, following redirections
// and waiting out failovers and migrations until the job's deadline. Reads go to a
// replica when the primary cannot be reached or is slower than replica_after. The
// replies are those of `cmds` (an ASKING prefix is stripped).
Result<std::vector<Reply>> run_slot(ClusterWorker& w, const QueueJob& j, uint16_t slot,
                                    const std::vector<Command>& cmds, Access access);

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
                                                        const std::vector<SlotGroup>& groups);

}  // namespace kvstream::redis::detail
