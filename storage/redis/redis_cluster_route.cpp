// How the Redis Cluster client reaches a slot: see redis_cluster_route.hpp.
#include "storage/redis/redis_cluster_route.hpp"

#include <algorithm>
#include <charconv>
#include <optional>
#include <thread>

#include "core/log.hpp"

namespace kvstream::redis::detail {

using namespace std::chrono_literals;
using transport::Clock;
using transport::Deadline;

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

// Waits `backoff` (never past the deadline) before a retry, and doubles it up to 50 ms.
void pause(Clock::duration& backoff, Deadline deadline) {
  const auto left = deadline - Clock::now();
  if (left > Clock::duration::zero()) std::this_thread::sleep_for(std::min(backoff, left));
  backoff = std::min<Clock::duration>(backoff * 2, 50ms);
}

}  // namespace

Status refresh(ClusterWorker& w, Deadline deadline, uint64_t seen, const std::string& failed) {
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

}  // namespace kvstream::redis::detail
