// A node's lease-held entry in etcd (node_registration.hpp).
#include "storage/cluster/node_registration.hpp"

#include "core/log.hpp"

namespace kvstream::cluster {

using transport::Clock;
using transport::Deadline;

Result<std::unique_ptr<NodeRegistration>> NodeRegistration::start(EtcdClient etcd, std::string address,
                                                                  Deadline deadline, Hooks hooks) {
  auto r = std::unique_ptr<NodeRegistration>(new NodeRegistration(std::move(etcd), std::move(address), std::move(hooks)));
  KVS_RETURN_IF_ERROR(r->register_now(deadline));
  if (r->hooks_.on_member) r->hooks_.on_member();
  KVS_LOG_INFO("etcd: node {} registered under lease {:x} (TTL {} s)", r->address_, r->lease_,
               r->etcd_.config().lease_ttl.count());
  r->thread_ = std::thread([p = r.get()] { p->renew(); });
  return r;
}

NodeRegistration::~NodeRegistration() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  stop_.cancel();
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Leave at once rather than after the TTL (a fresh token: stop_ is cancelled).
  if (lease_ != 0) (void)etcd_.revoke(lease_, Clock::now() + etcd_.config().request_timeout, {});
}

Status NodeRegistration::register_now(Deadline deadline) {
  KVS_ASSIGN_OR_RETURN(int64_t lease, etcd_.grant(etcd_.config().lease_ttl, deadline, stop_));
  const std::string& prefix = etcd_.config().prefix;
  KVS_RETURN_IF_ERROR(etcd_.put(prefix + "nodes/" + address_, address_, lease, deadline, stop_));
  std::map<std::string, std::string> again;
  {
    std::lock_guard lock(mu_);
    lease_ = lease;
    again = published_;
  }
  for (const auto& [what, value] : again)
    KVS_RETURN_IF_ERROR(etcd_.put(prefix + what + "/" + address_, value, lease, deadline, stop_));
  return {};
}

Status NodeRegistration::publish(const std::string& what, const std::string& value, Deadline deadline) {
  int64_t lease;
  {
    std::lock_guard lock(mu_);
    published_[what] = value;
    lease = lease_;
  }
  return etcd_.put(etcd_.config().prefix + what + "/" + address_, value, lease, deadline, stop_);
}

void NodeRegistration::renew() {
  const auto period = std::chrono::duration_cast<Clock::duration>(etcd_.config().lease_ttl) / 3;
  bool lost = false;  // logged once per outage
  // When the lease was last found alive: the others count the node a member until a
  // TTL after it.
  Clock::time_point member_at = Clock::now();
  std::unique_lock lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, lost ? Clock::duration(std::chrono::milliseconds(500)) : period);
    if (stopping_) break;
    const int64_t lease = lease_;
    lock.unlock();
    const Deadline d = Clock::now() + etcd_.config().request_timeout;
    auto ttl = etcd_.keep_alive(lease, d, stop_);
    Status s = ttl.status();
    if (ttl.ok() && *ttl <= 0) {
      // The lease ran out while etcd was out of reach: the others have dropped this
      // node. Register again (they add it back, and rebalance).
      const auto away = Clock::now() - member_at;
      KVS_LOG_WARN("etcd: the lease of node {} expired (last renewed {:.1f} s ago); registering again", address_,
                   std::chrono::duration<double>(away).count());
      if (hooks_.before_rejoin) hooks_.before_rejoin(away);
      s = register_now(d);
    }
    if (!s.ok() && !stop_.cancelled() && !lost)
      KVS_LOG_WARN("etcd: node {} could not renew its registration ({}); retrying", address_, s.to_string());
    lost = !s.ok();
    if (s.ok()) {
      member_at = Clock::now();
      if (hooks_.on_member) hooks_.on_member();
    }
    lock.lock();
  }
}

}  // namespace kvstream::cluster
