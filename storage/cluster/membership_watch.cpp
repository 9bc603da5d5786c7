// The member set from etcd, kept current by a watch (membership_watch.hpp).
#include "storage/cluster/membership_watch.hpp"

#include <set>

#include "core/log.hpp"

namespace kvstream::cluster {

using namespace std::chrono_literals;
using transport::Clock;

namespace {

std::vector<std::string> addresses(const std::map<std::string, std::string>& by_key) {
  std::vector<std::string> out;
  for (const auto& [k, v] : by_key) out.push_back(v);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

std::vector<std::map<std::string, std::string>> member_steps(std::map<std::string, std::string> by_key,
                                                             const std::vector<EtcdEvent>& events) {
  std::vector<std::map<std::string, std::string>> steps;
  std::set<std::string> gone;  // keys deleted since the last step
  for (const auto& e : events) {
    if (e.deleted) {
      if (by_key.erase(e.kv.key) > 0) gone.insert(e.kv.key);
      continue;
    }
    if (gone.contains(e.kv.key)) {  // back: the set without it is a step of its own
      steps.push_back(by_key);
      gone.clear();
    }
    by_key[e.kv.key] = e.kv.value;
  }
  steps.push_back(std::move(by_key));
  return steps;
}

Result<std::unique_ptr<MembershipWatch>> MembershipWatch::start(EtcdClient etcd, OnChange on_change,
                                                                transport::Deadline deadline,
                                                                const transport::CancelToken& cancel) {
  const std::string prefix = etcd.config().prefix + "nodes/";
  KVS_ASSIGN_OR_RETURN(auto range, etcd.range_prefix(prefix, deadline, cancel));
  auto w = std::unique_ptr<MembershipWatch>(new MembershipWatch(std::move(etcd), std::move(on_change)));
  for (auto& kv : range.kvs) w->by_key_[kv.key] = kv.value;
  w->revision_ = range.revision;
  w->thread_ = std::thread([p = w.get()] { p->run(); });
  return w;
}

MembershipWatch::~MembershipWatch() {
  stop_.cancel();
  if (thread_.joinable()) thread_.join();
}

std::vector<std::string> MembershipWatch::members() const {
  std::lock_guard lock(mu_);
  return addresses(by_key_);
}

int64_t MembershipWatch::revision() const {
  std::lock_guard lock(mu_);
  return revision_;
}

void MembershipWatch::reset(std::map<std::string, std::string> by_key, int64_t revision) {
  std::vector<std::string> before, after;
  {
    std::lock_guard lock(mu_);
    before = addresses(by_key_);
    by_key_ = std::move(by_key);
    revision_ = revision;
    after = addresses(by_key_);
  }
  if (before != after) on_change_(after, revision);
}

void MembershipWatch::run() {
  const std::string prefix = etcd_.config().prefix + "nodes/";
  bool logged = false;  // one warning per outage
  while (!stop_.cancelled()) {
    int64_t from;
    {
      std::lock_guard lock(mu_);
      from = revision_ + 1;
    }
    Status s = etcd_.watch_prefix(prefix, from, stop_, [&](const std::vector<EtcdEvent>& events, int64_t rev) {
      std::map<std::string, std::string> now;
      {
        std::lock_guard lock(mu_);
        now = by_key_;
      }
      for (auto& step : member_steps(std::move(now), events)) reset(std::move(step), rev);
      logged = false;
    });
    if (stop_.cancelled()) break;
    if (!logged) {
      KVS_LOG_WARN("etcd membership watch broke ({}); reading the member set again every 500 ms", s.to_string());
      logged = true;
    }
    // Read the whole set again (what changed while the watch was down), then resume.
    for (int i = 0; i < 10 && !stop_.cancelled(); ++i) std::this_thread::sleep_for(50ms);
    auto range = etcd_.range_prefix(prefix, Clock::now() + etcd_.config().request_timeout, stop_);
    if (!range.ok()) continue;
    std::map<std::string, std::string> fresh;
    for (auto& kv : range->kvs) fresh[kv.key] = kv.value;
    reset(std::move(fresh), range->revision);
  }
}

}  // namespace kvstream::cluster
