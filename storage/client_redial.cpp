// Requests waiting for the storage client to connect again (client_redial.hpp).
#include "storage/client_redial.hpp"

#include <algorithm>

namespace kvstream::storage::client_detail {

using namespace std::chrono_literals;
using transport::Clock;
using transport::Deadline;

Redial::Redial(Reconnect reconnect, Dispatch dispatch)
    : reconnect_(std::move(reconnect)), dispatch_(std::move(dispatch)) {}

Redial::~Redial() { close(); }

void Redial::wait(Request req, std::span<const std::byte> body, Pending p) {
  {
    std::lock_guard lock(mu_);
    if (!closed_) {
      waiting_.push_back(Waiting{std::move(req), body, std::move(p)});
      if (!loop_.joinable()) loop_ = std::thread([this] { run(); });
      cv_.notify_all();
      return;
    }
  }
  p.done(make_status(StatusCode::cancelled, "storage client closed"), {});
}

void Redial::close() {
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    closed_ = true;
    cv_.notify_all();
  }
  stop_.cancel();
  if (loop_.joinable()) loop_.join();
  if (attempt_.joinable()) attempt_.join();  // the loop is gone: nobody else touches it
  std::deque<Waiting> left;
  {
    std::lock_guard lock(mu_);
    left.swap(waiting_);
  }
  for (auto& w : left) w.p.done(make_status(StatusCode::cancelled, "storage client closed"), {});
}

// The requests cancelled or past their deadline, taken out with their errors.
std::vector<std::pair<Done, Status>> Redial::take_due_locked() {
  std::vector<std::pair<Done, Status>> due;
  const auto now = Clock::now();
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (it->p.cancel.cancelled())
      due.emplace_back(std::move(it->p.done), make_status(StatusCode::cancelled, "request cancelled"));
    else if (now >= it->p.deadline)
      due.emplace_back(std::move(it->p.done),
                       make_status(StatusCode::timed_out, "past the deadline while connecting to the node again"));
    else {
      ++it;
      continue;
    }
    it = waiting_.erase(it);
  }
  return due;
}

void Redial::run() {
  std::unique_lock lk(mu_);
  while (!closed_) {
    auto due = take_due_locked();
    if (!due.empty()) {
      lk.unlock();
      for (auto& [done, st] : due) done(st, {});
      lk.lock();
      continue;
    }
    if (attempting_ && attempt_done_) {
      lk.unlock();
      attempt_.join();
      lk.lock();
      attempting_ = false;
      const Status result = attempt_result_;
      std::deque<Waiting> ready;
      ready.swap(waiting_);
      lk.unlock();
      // On a fresh connection; with none alive again (it was lost at once), back here
      // for another reconnection, within the request's deadline.
      for (auto& w : ready)
        if (result.ok()) dispatch_(std::move(w.req), w.body, std::move(w.p));
        else w.p.done(result, {});
      lk.lock();
      continue;
    }
    if (!attempting_ && !waiting_.empty()) {
      Deadline latest = waiting_.front().p.deadline;
      for (const auto& w : waiting_) latest = std::max(latest, w.p.deadline);
      attempting_ = true, attempt_done_ = false;
      attempt_ = std::thread([this, latest] {
        Status s = reconnect_(latest, stop_);
        std::lock_guard lock(mu_);
        attempt_result_ = std::move(s);
        attempt_done_ = true;
        cv_.notify_all();
      });
      continue;
    }
    if (waiting_.empty()) {
      cv_.wait(lk);
      continue;
    }
    // Cancel tokens have no callback: looked at every 20 ms, and the earliest
    // deadline is kept to.
    Deadline next = Clock::now() + 20ms;
    for (const auto& w : waiting_) next = std::min(next, w.p.deadline);
    cv_.wait_until(lk, next);
  }
}

}  // namespace kvstream::storage::client_detail
