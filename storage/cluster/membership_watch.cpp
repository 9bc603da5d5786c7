// The member set from etcd, kept current by a watch (membership_watch.hpp).
#include "storage/cluster/membership_watch.hpp"

#include <set>

#include "core/log.hpp"

namespace kvstream::cluster {

using namespace std::chrono_literals;
using transport::Clock;

namespace {

// The events that lead `before` to `after` (a fresh read after the watch broke): a
// node registered again meanwhile is a put of a key that is there.
std::vector<EtcdEvent> changes(const Registrations& before, const Registrations& after) {
  std::vector<EtcdEvent> out;
  for (const auto& [key, reg] : before)
    if (!after.contains(key)) out.push_back({.deleted = true, .kv = {.key = key}});
  for (const auto& [key, reg] : after) {
    const auto it = before.find(key);
    if (it == before.end() || it->second != reg)
      out.push_back({.kv = {.key = key, .value = reg.address, .mod_revision = reg.revision}});
  }
  return out;
}

// The registrations a read of the set returned.
Registrations registrations_of(const EtcdClient::Range& range) {
  Registrations out;
  for (const auto& kv : range.kvs) out[kv.key] = {kv.value, kv.mod_revision};
  return out;
}

std::string nodes_prefix(const EtcdClient& etcd) { return etcd.config().prefix + "nodes/"; }

}  // namespace

int64_t MemberSet::newest() const {
  int64_t n = 0;
  for (const auto& [address, revision] : registered) n = std::max(n, revision);
  return n;
}

MemberSet member_set(const Registrations& by_key) {
  MemberSet set;
  for (const auto& [key, reg] : by_key) {
    auto [it, fresh] = set.registered.emplace(reg.address, reg.revision);
    if (!fresh) it->second = std::max(it->second, reg.revision);
  }
  for (const auto& [address, revision] : set.registered) set.nodes.push_back(address);  // sorted: a map's order
  return set;
}

std::vector<Registrations> member_steps(Registrations by_key, const std::vector<EtcdEvent>& events) {
  std::vector<Registrations> steps;
  std::set<std::string> gone;  // keys deleted since the last step
  for (const auto& e : events) {
    if (e.deleted) {
      if (by_key.erase(e.kv.key) > 0) gone.insert(e.kv.key);
      continue;
    }
    const Registration reg{e.kv.value, e.kv.mod_revision};
    if (const auto it = by_key.find(e.kv.key); it != by_key.end()) {
      if (it->second == reg) continue;
      by_key.erase(it);  // registered again without a delete between: out, then in
      steps.push_back(by_key);
      gone.clear();
    } else if (gone.contains(e.kv.key)) {  // back: the set without it is a step of its own
      steps.push_back(by_key);
      gone.clear();
    }
    by_key[e.kv.key] = reg;
  }
  steps.push_back(std::move(by_key));
  return steps;
}

Result<std::unique_ptr<MembershipWatch>> MembershipWatch::start(EtcdClient etcd, OnChange on_change,
                                                                transport::Deadline deadline,
                                                                const transport::CancelToken& cancel,
                                                                OnRevision on_revision) {
  KVS_ASSIGN_OR_RETURN(auto range, etcd.range_prefix(nodes_prefix(etcd), deadline, cancel));
  auto w = std::unique_ptr<MembershipWatch>(
      new MembershipWatch(std::move(etcd), std::move(on_change), std::move(on_revision)));
  w->by_key_ = registrations_of(range);
  w->revision_ = range.revision;
  w->read_revision_ = range.revision;
  w->thread_ = std::thread([p = w.get()] { p->run(); });
  return w;
}

MembershipWatch::~MembershipWatch() {
  stop_.cancel();
  {
    std::lock_guard lock(mu_);
    stream_.cancel();
  }
  if (thread_.joinable()) thread_.join();
}

MemberSet MembershipWatch::members() const {
  std::lock_guard lock(mu_);
  return member_set(by_key_);
}

int64_t MembershipWatch::revision() const { return revision_.load(); }

void MembershipWatch::reset(Registrations by_key, int64_t revision) {
  MemberSet before, after;
  {
    std::lock_guard lock(mu_);
    before = member_set(by_key_);
    by_key_ = std::move(by_key);
    after = member_set(by_key_);
  }
  if (before != after) on_change_(after);
  advance(revision, false);
}

void MembershipWatch::advance(int64_t revision, bool read) {
  // Moved once the change is applied: a follower that reads revision() before the
  // state on_change sets has state at least that new (a client names it in requests
  // made under that state, docs/protocol.md "Member sets").
  {
    std::lock_guard lock(mu_);
    revision_ = revision;
    if (read) read_revision_ = revision;
  }
  if (on_revision_) on_revision_(revision);
}

void MembershipWatch::run() {
  const std::string prefix = nodes_prefix(etcd_);
  bool logged = false;  // one warning per outage
  while (true) {
    int64_t from;
    transport::CancelToken stream;
    {
      // Under the lock the destructor and catch_up take to end the stream: either this
      // sees the stop, or they see this stream's token.
      std::lock_guard lock(mu_);
      if (stop_.cancelled()) break;
      from = revision_ + 1;
      stream_ = stream;
      restart_ = false;
    }
    Status s = etcd_.watch_prefix(prefix, from, stream, [&](const std::vector<EtcdEvent>& events, int64_t rev) {
      logged = false;
      std::lock_guard steps(step_mu_);
      Registrations now;
      int64_t read_at;
      {
        std::lock_guard lock(mu_);
        now = by_key_, read_at = read_revision_;
      }
      // Events a catch_up read brought in already (this stream began before it) are
      // skipped: a delete and a put of one key both before the read would otherwise
      // be a leave and a join again.
      std::vector<EtcdEvent> newer;
      for (const auto& e : events)
        if (e.kv.mod_revision > read_at) newer.push_back(e);
      if (newer.empty()) return;
      for (auto& step : member_steps(std::move(now), newer)) reset(std::move(step), rev);
    });
    if (stop_.cancelled()) break;
    {
      std::lock_guard lock(mu_);
      if (restart_) continue;  // a read found it behind: a fresh stream, where the read was answered
    }
    if (!logged) {
      KVS_LOG_WARN("etcd membership watch broke ({}); reading the member set again every 500 ms", s.to_string());
      logged = true;
    }
    // Read the whole set again (what changed while the watch was down), then resume.
    for (int i = 0; i < 10 && !stop_.cancelled(); ++i) std::this_thread::sleep_for(50ms);
    (void)catch_up(Clock::now() + etcd_.config().request_timeout, stop_);  // failed: again after the pause
  }
}

Status MembershipWatch::catch_up(transport::Deadline deadline, const transport::CancelToken& cancel) {
  KVS_ASSIGN_OR_RETURN(auto range, etcd_.range_prefix(nodes_prefix(etcd_), deadline, cancel));
  const Registrations fresh = registrations_of(range);
  const int64_t revision = range.revision;
  std::lock_guard steps(step_mu_);
  Registrations now;
  {
    std::lock_guard lock(mu_);
    if (revision <= revision_) return {};  // the watch got there first
    now = by_key_;
  }
  // A node that registered again meanwhile shows as out, then in.
  const auto events = changes(now, fresh);
  for (auto& step : member_steps(std::move(now), events)) reset(std::move(step), revision);
  advance(revision, true);  // where no step changed anything too
  if (!events.empty()) {
    // The stream had not brought what the read found: its member may be stuck (a
    // frozen process keeps its connections open and silent, which TCP keepalives do
    // not notice). It starts again, from the endpoint that answered the read.
    std::lock_guard lock(mu_);
    restart_ = true;
    stream_.cancel();
  }
  return {};
}

}  // namespace kvstream::cluster
