// The Redis clients' threads: calls wait in a queue served by a fixed set of worker
// threads, each owning its connections (a Worker), and a reaper completes calls that
// pass their deadline or are cancelled while a command is still on the wire, so no
// caller waits on a stalled server. Internal to the Redis clients.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kvstream/status.hpp"
#include "kvstream/transport.hpp"

namespace kvstream::redis::detail {

/// One call. Completed exactly once: by its worker, or by the reaper (deadline,
/// cancel, shutdown), whichever claims it first; only the claimer touches the
/// caller's memory or calls back.
template <typename Worker>
struct Job {
  transport::Deadline deadline;
  transport::CancelToken cancel;
  std::atomic<bool> claimed{false};
  std::function<void(Worker&, Job&)> run;  // on a worker; claims before completing
  std::function<void(Status)> fail;        // completes with an error (the caller claimed)
  bool claim() {
    bool expected = false;
    return claimed.compare_exchange_strong(expected, true);
  }
  /// Whether the call is still owed a result (a worker retrying stops when not).
  [[nodiscard]] bool open() const { return !claimed.load(); }
};

template <typename Worker>
class JobQueue {
 public:
  using JobT = Job<Worker>;
  /// Starts `threads` workers, each with the Worker `make_worker` builds on it.
  JobQueue(uint32_t threads, std::function<std::unique_ptr<Worker>()> make_worker)
      : make_worker_(std::move(make_worker)) {
    for (uint32_t i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
    reaper_ = std::thread([this] { reap(); });
  }
  ~JobQueue() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    reaper_cv_.notify_all();
    for (auto& t : workers_) t.join();
    if (reaper_.joinable()) reaper_.join();
    for (auto& j : active_)  // whatever is left completes now
      if (j->claim()) j->fail(make_status(StatusCode::cancelled, "redis client closed"));
  }
  JobQueue(const JobQueue&) = delete;
  JobQueue& operator=(const JobQueue&) = delete;

  void enqueue(std::shared_ptr<JobT> job) {
    if (job->cancel.cancelled()) {
      if (job->claim()) job->fail(make_status(StatusCode::cancelled, "request cancelled"));
      return;
    }
    if (transport::Clock::now() >= job->deadline) {
      if (job->claim()) job->fail(make_status(StatusCode::timed_out, "request past its deadline"));
      return;
    }
    {
      std::lock_guard lock(mu_);
      if (!stopping_) {
        active_.push_back(job);
        queue_.push_back(std::move(job));
        cv_.notify_one();
        return;
      }
    }
    if (job->claim()) job->fail(make_status(StatusCode::cancelled, "redis client closed"));
  }

  /// A blocking call: runs `fn(worker, deadline, job)` on a worker; returns by the
  /// deadline or on cancel.
  template <typename T, typename F>
  Result<T> call(transport::Deadline deadline, const transport::CancelToken& cancel, F fn) {
    auto promise = std::make_shared<std::promise<Result<T>>>();
    auto future = promise->get_future();
    auto job = std::make_shared<JobT>();
    job->deadline = deadline, job->cancel = cancel;
    job->fail = [promise](Status s) { promise->set_value(std::move(s)); };
    job->run = [promise, fn = std::move(fn)](Worker& w, JobT& j) mutable {
      Result<T> r = fn(w, j);
      if (j.claim()) promise->set_value(std::move(r));
    };
    enqueue(std::move(job));
    return future.get();
  }

 private:
  std::function<std::unique_ptr<Worker>()> make_worker_;
  std::mutex mu_;
  std::condition_variable cv_;         // workers wait on it for calls
  std::condition_variable reaper_cv_;  // the reaper waits on it (so a call never wakes it instead of a worker)
  bool stopping_ = false;
  std::deque<std::shared_ptr<JobT>> queue_;
  std::list<std::shared_ptr<JobT>> active_;  // queued or running: what the reaper watches
  std::vector<std::thread> workers_;
  std::thread reaper_;

  void work() {
    std::unique_ptr<Worker> w = make_worker_();
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      auto job = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      if (job->open()) job->run(*w, *job);
      lock.lock();
      active_.remove(job);
    }
  }

  // Completes calls that passed their deadline or were cancelled, every 10 ms.
  void reap() {
    using namespace std::chrono_literals;
    std::unique_lock lock(mu_);
    while (!stopping_) {
      reaper_cv_.wait_for(lock, 10ms, [&] { return stopping_; });
      const auto now = transport::Clock::now();
      std::vector<std::pair<std::shared_ptr<JobT>, Status>> due;
      for (auto it = active_.begin(); it != active_.end();) {
        auto& j = *it;
        Status why;
        if (j->cancel.cancelled()) why = make_status(StatusCode::cancelled, "request cancelled");
        else if (now >= j->deadline) why = make_status(StatusCode::timed_out, "redis request passed its deadline");
        if (!why.ok() && j->claim()) due.emplace_back(j, why);
        // Claimed jobs still queued are dropped here; running ones by their worker.
        if (j->claimed.load() && std::find(queue_.begin(), queue_.end(), j) != queue_.end()) {
          queue_.erase(std::find(queue_.begin(), queue_.end(), j));
          it = active_.erase(it);
        } else {
          ++it;
        }
      }
      lock.unlock();
      for (auto& [j, why] : due) j->fail(why);
      lock.lock();
    }
  }
};

}  // namespace kvstream::redis::detail
