// Reads of the member set on behalf of gets (member_catch_up.hpp).
#include "storage/cluster/member_catch_up.hpp"

namespace kvstream::cluster {

using transport::Clock;

MemberCatchUp::MemberCatchUp(Read read, Revision revision, Clock::duration timeout, Clock::duration spacing)
    : read_(std::move(read)), revision_(std::move(revision)), timeout_(timeout), spacing_(spacing),
      thread_([this] { run(); }) {}

MemberCatchUp::~MemberCatchUp() { stop(); }

void MemberCatchUp::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  stop_.cancel();
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool MemberCatchUp::request(int64_t told, Then then) {
  {
    // Under the lock, so that stop() returns only after the last look at the set.
    std::lock_guard lock(mu_);
    if (stopping_ || told <= revision_()) return false;
    waiting_.push_back(std::move(then));
  }
  cv_.notify_all();
  return true;
}

void MemberCatchUp::nudge(int64_t told) {
  int64_t seen = nudged_.load(std::memory_order_relaxed);
  do {
    if (told <= seen) return;
  } while (!nudged_.compare_exchange_weak(seen, told, std::memory_order_relaxed));
  {
    std::lock_guard lock(mu_);
    if (stopping_ || told <= revision_()) return;
    wanted_ = true;
  }
  cv_.notify_all();
}

Status MemberCatchUp::recent_failure(Clock::duration within) const {
  std::lock_guard lock(mu_);
  if (last_failure_.ok() || Clock::now() - last_failed_at_ >= within) return {};
  return last_failure_;
}

uint64_t MemberCatchUp::reads() const {
  std::lock_guard lock(mu_);
  return reads_;
}

void MemberCatchUp::run() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || wanted_ || !waiting_.empty(); });
    if (reads_ > 0) cv_.wait_until(lock, last_start_ + spacing_, [&] { return stopping_; });
    if (stopping_) break;
    auto serving = std::move(waiting_);
    waiting_.clear();
    wanted_ = false;
    last_start_ = Clock::now();
    ++reads_;
    lock.unlock();
    const Status s = read_(Clock::now() + timeout_, stop_);
    lock.lock();
    last_failure_ = s;  // before the askers hear of it: a call after theirs finds it
    last_failed_at_ = Clock::now();
    if (!s.ok()) nudged_.store(0, std::memory_order_relaxed);  // the next nudge asks again
    lock.unlock();
    for (auto& then : serving) then(s);
    lock.lock();
  }
  auto left = std::move(waiting_);
  waiting_.clear();
  lock.unlock();
  const Status closed(StatusCode::cancelled, "client closed");
  for (auto& then : left) then(closed);
}

}  // namespace kvstream::cluster
