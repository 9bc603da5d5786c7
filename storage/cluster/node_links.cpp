#include "storage/cluster/node_links.hpp"

#include <future>

#include "core/log.hpp"

namespace kvstream::cluster {

using namespace std::chrono_literals;
using transport::CancelToken;
using transport::Clock;
using transport::Deadline;

NodeLinks::NodeLinks(const ClusterConfig& cfg, std::shared_ptr<transport::Backend> backend,
                     std::function<std::vector<ClusterNode*>()> members, std::shared_ptr<storage::MembersLink> set)
    : cfg_(cfg), backend_(std::move(backend)), members_(std::move(members)), set_(std::move(set)) {}

NodeLinks::~NodeLinks() { stop(); }

void NodeLinks::start_maintenance() { maintenance_ = std::thread([this] { maintain(); }); }

Status NodeLinks::connect(ClusterNode& n, Deadline deadline, const CancelToken& cancel) {
  storage::ClientConfig cc;
  cc.address = n.address;
  cc.name_space = cfg_.name_space;
  cc.secret = cfg_.secret;
  cc.connections = cfg_.connections_per_node;
  auto c = storage::connect_following_members(cc, backend_, set_, deadline, cancel);
  std::lock_guard lock(n.mu);
  if (!c.ok()) {
    n.retry_at = Clock::now() + cfg_.retry_down_after;
    return c.status();
  }
  n.client = std::shared_ptr<storage::Client>(std::move(c).value());
  n.health.clear_down();
  return {};
}

Status NodeLinks::reconnect(ClusterNode& n) { return connect(n, Clock::now() + cfg_.connect_timeout, stop_); }

std::shared_ptr<storage::Client> NodeLinks::client_of(ClusterNode& n) {
  std::lock_guard lock(n.mu);
  return n.client;
}

void NodeLinks::retire(ClusterNode& n, const storage::Client* c, const Status& why) {
  std::shared_ptr<storage::Client> old;
  {
    std::lock_guard lock(n.mu);
    if (!c || n.client.get() != c) return;
    old = std::move(n.client);
      n.retry_at = Clock::now() + cfg_.retry_down_after;
  }
  n.health.mark_down(Clock::now() + cfg_.retry_down_after);
  KVS_LOG_WARN("cluster: node {} is down ({}); reconnecting in the background", n.address, why.to_string());
  bury(std::move(old));
}

void NodeLinks::let_go(ClusterNode& n) {
  std::shared_ptr<storage::Client> old;
  {
    std::lock_guard lock(n.mu);
    old = std::move(n.client);
    }
  if (old) bury(std::move(old));
}

bool NodeLinks::closing() {
  std::lock_guard lock(mu_);
  return closing_;
}

void NodeLinks::close(const std::vector<std::unique_ptr<ClusterNode>>& nodes) {
  stop();
  // Pending gets complete now ("client closed"); their callbacks see closing().
  for (const auto& n : nodes) {
    std::shared_ptr<storage::Client> c;
    {
      std::lock_guard lock(n->mu);
      c = std::move(n->client);
    }
    destroy_when_unique(std::move(c));
  }
  std::vector<std::shared_ptr<storage::Client>> rest;
  {
    std::lock_guard lock(mu_);
    rest.swap(graveyard_);
  }
  for (auto& c : rest) destroy_when_unique(std::move(c));
}

void NodeLinks::stop() {
  stop_.cancel();  // ends a connect that a membership change or the maintenance waits for
  {
    std::lock_guard lock(mu_);
    closing_ = true;
  }
  cv_.notify_all();
  if (maintenance_.joinable()) maintenance_.join();
}

// Other threads may hold a node client for the length of one call; it is destroyed
// here, never on one of its own threads.
void NodeLinks::destroy_when_unique(std::shared_ptr<storage::Client> c) {
  while (c && c.use_count() > 1) std::this_thread::sleep_for(1ms);
  c.reset();
}

void NodeLinks::bury(std::shared_ptr<storage::Client> c) {
  std::lock_guard lock(mu_);
  graveyard_.push_back(std::move(c));
  cv_.notify_all();
}

void NodeLinks::maintain() {
  std::unique_lock lock(mu_);
  while (!closing_) {
    cv_.wait_for(lock, 50ms);
    if (closing_) break;
    // A retired client whose last user is gone is destroyed here.
    std::vector<std::shared_ptr<storage::Client>> free_now;
    for (auto it = graveyard_.begin(); it != graveyard_.end();) {
      if (it->use_count() == 1) {
        free_now.push_back(std::move(*it));
        it = graveyard_.erase(it);
      } else {
        ++it;
      }
    }
    lock.unlock();
    free_now.clear();
    const auto now = Clock::now();
    std::vector<std::future<Status>> reconnects;
    for (ClusterNode* np : members_()) {
      {
        std::lock_guard nl(np->mu);
        if (np->client || now < np->retry_at) continue;
      }
      reconnects.push_back(std::async(std::launch::async, [this, np] { return reconnect(*np); }));
    }
    for (auto& f : reconnects) (void)f.get();
    lock.lock();
  }
}

}  // namespace kvstream::cluster
