// The fetch scheduler: a queue ordered by priority in front of one pipeline. A
// dispatcher thread starts queued fetches while fewer than max_running run, and ends
// queued fetches whose deadline passed or that were cancelled; one waiter thread per
// running fetch hands its slot back when it ends.
#include "kvstream/scheduler.hpp"

#include <algorithm>
#include <condition_variable>
#include <atomic>
#include <deque>
#include <list>
#include <mutex>
#include <thread>

#include "core/log.hpp"

namespace kvstream::pipeline {

namespace {
// What the chooser plans for: the fetch's target, else its deadline.
transport::Deadline target_of(const ScheduledFetch& f) {
  return f.target == transport::Deadline{} ? f.request.deadline : std::min(f.target, f.request.deadline);
}
}  // namespace
namespace {

using namespace std::chrono_literals;

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

class SchedulerImpl;

// How a ticket wakes its scheduler's dispatcher (on cancel). Tickets may outlive the
// scheduler: it clears `cv` when it goes, under `mu`.
struct Waker {
  std::mutex mu;
  std::condition_variable* cv = nullptr;
  void wake() {
    std::lock_guard lk(mu);
    if (cv) cv->notify_all();
  }
};

// A fetch ahead of the one being predicted, as seen under the scheduler's lock.
struct Ahead {
  bool started = false;
  double remaining_s = 0;  // started: predicted time until it ends
  double duration_s = 0;   // queued: its predicted running time
};

class TicketImpl final : public Ticket {
 public:
  TicketImpl(ScheduledFetch f, Admission a, uint64_t order, Clock::time_point submitted)
      : fetch_(std::move(f)), admission_(std::move(a)), order_(order), submitted_(submitted) {}

  Status wait() override {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return ended_; });
    return result_;
  }
  void cancel() override {
    fetch_.request.cancel.cancel();
    std::shared_ptr<Fetch> running;
    {
      std::lock_guard lk(mu_);
      running = running_;
    }
    if (running) running->cancel();
    if (waker_) waker_->wake();
  }
  bool started() const override {
    std::lock_guard lk(mu_);
    return started_;
  }
  std::vector<ChunkTimings> timings() const override {
    std::lock_guard lk(mu_);
    return timings_;
  }
  const Admission& admission() const override { return admission_; }
  std::vector<std::vector<uint8_t>> take_kept_bytes() override {
    std::lock_guard lk(mu_);
    return std::exchange(kept_, {});
  }

  // Scheduler side.
  void end(Status s, std::vector<ChunkTimings> t, std::vector<std::vector<uint8_t>> kept = {}) {
    {
      std::lock_guard lk(mu_);
      result_ = std::move(s);
      timings_ = std::move(t);
      kept_ = std::move(kept);
      running_.reset();
      ended_ = true;
    }
    cv_.notify_all();
  }
  void set_running(std::shared_ptr<Fetch> f) {
    std::lock_guard lk(mu_);
    running_ = std::move(f);
  }
  /// Set as it leaves the queue, before its chunks can be delivered (they may be before
  /// the pipeline's fetch() returns); cleared when the pipeline refused it.
  void set_started(bool started) {
    std::lock_guard lk(mu_);
    started_ = started;
  }
  /// When this fetch is predicted to release its slot (for later admissions).
  Clock::time_point predicted_end(Clock::time_point now) const {
    const auto start = started_at_ == Clock::time_point{} ? now : started_at_;
    return start + std::chrono::duration_cast<Clock::duration>(
                       std::chrono::duration<double>(admission_.predicted_seconds - admission_.queue_seconds));
  }

  ScheduledFetch fetch_;
  Admission admission_;
  const uint64_t order_;
  const Clock::time_point submitted_;
  Clock::time_point started_at_{};
  std::shared_ptr<Waker> waker_;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool ended_ = false;
  bool started_ = false;
  Status result_;
  std::vector<ChunkTimings> timings_;
  std::vector<std::vector<uint8_t>> kept_;
  std::shared_ptr<Fetch> running_;
};

class SchedulerImpl final : public Scheduler {
 public:
  SchedulerImpl(Pipeline& p, storage::Client& c, AdaptivePlan plan, SchedulerConfig cfg)
      : pipeline_(p), client_(c), plan_(std::move(plan)), cfg_(cfg), now_(cfg.now ? cfg.now : Now(&Clock::now)) {
    waker_->cv = &cv_;
    dispatcher_ = std::thread([this] { dispatch(); });
  }

  ~SchedulerImpl() override {
    {
      std::lock_guard lk(waker_->mu);
      waker_->cv = nullptr;
    }
    std::vector<std::shared_ptr<TicketImpl>> all;
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
      all.assign(queue_.begin(), queue_.end());
      all.insert(all.end(), running_.begin(), running_.end());
    }
    for (auto& t : all) t->cancel();
    cv_.notify_all();
    dispatcher_.join();
    for (auto& w : waiters_) w.thread.join();
  }

  Result<Admission> predict(const ScheduledFetch& f) const override {
    std::vector<Ahead> ahead;
    {
      std::lock_guard lk(mu_);
      const auto now = now_();
      for (const auto& t : running_)
        ahead.push_back({true, std::max(0.0, seconds_between(now, t->predicted_end(now))), 0});
      for (const auto& t : queue_)
        if (t->fetch_.priority >= f.priority)
          ahead.push_back({false, 0, t->admission_.predicted_seconds - t->admission_.queue_seconds});
    }
    return predict_with(f, ahead);
  }

  Result<std::shared_ptr<Ticket>> submit(ScheduledFetch f) override {
    KVS_ASSIGN_OR_RETURN(Admission a, predict(f));
    std::lock_guard lk(mu_);
    if (stopping_) return make_status(StatusCode::cancelled, "scheduler is shutting down");
    auto t = std::make_shared<TicketImpl>(std::move(f), std::move(a), next_order_++, now_());
    t->waker_ = waker_;
    queue_.push_back(t);
    // Highest priority first; first come first served within one.
    std::stable_sort(queue_.begin(), queue_.end(), [](const auto& x, const auto& y) {
      return x->fetch_.priority != y->fetch_.priority ? x->fetch_.priority > y->fetch_.priority : x->order_ < y->order_;
    });
    cv_.notify_all();
    return std::shared_ptr<Ticket>(t);
  }

  uint32_t running() const override {
    std::lock_guard lk(mu_);
    return uint32_t(running_.size());
  }
  uint32_t queued() const override {
    std::lock_guard lk(mu_);
    return uint32_t(queue_.size());
  }

 private:
  Pipeline& pipeline_;
  storage::Client& client_;
  const AdaptivePlan plan_;
  const SchedulerConfig cfg_;
  using Now = std::function<Clock::time_point()>;
  const Now now_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<Waker> waker_ = std::make_shared<Waker>();
  std::deque<std::shared_ptr<TicketImpl>> queue_;
  std::vector<std::shared_ptr<TicketImpl>> running_;
  struct Waiter {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::list<Waiter> waiters_;
  uint64_t next_order_ = 0;
  bool stopping_ = false;
  std::thread dispatcher_;

  Result<policy::ContextCosts> costs_for(const ScheduledFetch& f) const {
    KVS_ASSIGN_OR_RETURN(auto sizes, range_level_bytes(client_, f.request, pipeline_.profile().progressive()));
    for (size_t i = 0; i < sizes.size(); ++i)
      if (sizes[i].empty())
        return make_status(StatusCode::not_found, "context '{}' has no chunk for range {}", f.request.context, i);
    policy::ContextCosts c = plan_costs(plan_, std::move(sizes), f.chunk_level_quality_loss, f.chunk_tokens);
    KVS_RETURN_IF_ERROR(c.validate());
    return c;
  }

  Result<Admission> predict_with(const ScheduledFetch& f, const std::vector<Ahead>& ahead) const {
    KVS_ASSIGN_OR_RETURN(policy::ContextCosts costs, costs_for(f));
    auto est = plan_.estimators->predict(plan_.peer, cfg_.probe_bytes);
    if (!est.ok())
      return est.status().with_context(fmt::format("no throughput estimate for {} yet", plan_.peer));
    const double full_rate = double(cfg_.probe_bytes) * 8.0 / std::max(est->seconds, 1e-9);
    const auto now = now_();
    Admission a;
    // Wait for a slot: slots free up as the running fetches end; each queued fetch
    // ahead then takes the earliest free slot for its predicted duration.
    const uint32_t slots = cfg_.max_running;
    if (ahead.size() >= slots) {
      std::vector<double> free_at;  // a min-heap of when each slot frees
      for (const auto& x : ahead)
        if (x.started) free_at.push_back(x.remaining_s);
      while (free_at.size() < slots) free_at.push_back(0.0);
      std::make_heap(free_at.begin(), free_at.end(), std::greater<>());
      for (const auto& x : ahead) {
        if (x.started) continue;
        std::pop_heap(free_at.begin(), free_at.end(), std::greater<>());
        free_at.back() += x.duration_s;
        std::push_heap(free_at.begin(), free_at.end(), std::greater<>());
      }
      a.queue_seconds = free_at.front();
    }
    // While it runs it shares the link with the others that run then.
    const uint32_t sharing = std::min<uint32_t>(slots, uint32_t(ahead.size()) + 1);
    a.link_bits_per_second = full_rate / sharing;
    const double time_left = seconds_between(now, target_of(f)) - a.queue_seconds;
    policy::SimConfig sim;
    sim.trace.segments = {{0.0, a.link_bits_per_second}};
    sim.costs = std::move(costs);
    sim.deadline_s = std::max(time_left, 1e-3);
    policy::EstimatorOptions eo;
    eo.trace = std::make_shared<const policy::LinkTrace>(sim.trace);
    KVS_ASSIGN_OR_RETURN(auto oracle, policy::make_estimator("oracle", eo));
    KVS_ASSIGN_OR_RETURN(policy::SimResult r, policy::simulate(sim, *oracle, *plan_.chooser));
    a.predicted_seconds = a.queue_seconds + r.finish_s;
    a.fits = time_left > 0 && !r.violated;
    a.mean_quality_loss = r.mean_quality_loss;
    a.recompute_chunks = r.recomputed;
    for (const auto& c : r.chunks)
      a.plan.push_back(c.choice.recompute() ? ChunkDecision{ChunkDecision::Action::recompute, 0}
                                            : ChunkDecision{ChunkDecision::Action::fetch, c.choice.level});
    return a;
  }

  void dispatch() {
    std::unique_lock lk(mu_);
    for (;;) {
      // End queued fetches that were cancelled or whose deadline passed.
      const auto now = now_();
      for (auto it = queue_.begin(); it != queue_.end();) {
        auto& t = *it;
        Status why;
        if (t->fetch_.request.cancel.cancelled())
          why = make_status(StatusCode::cancelled, "fetch of '{}' cancelled while queued", t->fetch_.request.context);
        else if (now >= t->fetch_.request.deadline)
          why = make_status(StatusCode::timed_out, "fetch of '{}' passed its deadline while queued",
                            t->fetch_.request.context);
        if (why.ok()) {
          ++it;
          continue;
        }
        t->end(why, {});
        it = queue_.erase(it);
      }
      if (stopping_ && queue_.empty() && running_.empty()) return;
      while (!stopping_ && !queue_.empty() && running_.size() < cfg_.max_running) {
        auto t = queue_.front();
        queue_.pop_front();
        start(t, lk);
      }
      reap_waiters();
      // Wake at the earliest queued deadline (or on submit / end / cancel). A span,
      // not a time point: the clock may be any.
      const auto before = now_();
      auto wake = before + 1s;
      for (const auto& t : queue_) wake = std::min(wake, t->fetch_.request.deadline);
      cv_.wait_for(lk, wake - before);
    }
  }

  // Called with `lk` held; releases it around the network calls. Starts `t` on the
  // pipeline with adaptive decisions.
  void start(const std::shared_ptr<TicketImpl>& t, std::unique_lock<std::mutex>& lk) {
    t->started_at_ = now_();
    t->set_started(true);
    running_.push_back(t);
    AdaptivePlan plan = plan_;
    plan.chunk_tokens = t->fetch_.chunk_tokens;
    plan.chunk_level_quality_loss = t->fetch_.chunk_level_quality_loss;
    lk.unlock();
    // The sizes are read again: they may have changed since admission.
    // A placeholder every branch below overwrites: not logged (make_status would).
    Result<std::shared_ptr<Fetch>> f = Status(StatusCode::internal, "not started");
    if (auto costs = costs_for(t->fetch_); !costs.ok()) {
      f = costs.status();
    } else if (auto cb = adaptive_callbacks(plan, costs->level_bytes, target_of(t->fetch_), t->fetch_.on_chunk);
               !cb.ok()) {
      f = cb.status();
    } else {
      f = pipeline_.fetch(t->fetch_.request, std::move(cb).value());
    }
    lk.lock();
    if (!f.ok()) {
      running_.erase(std::find(running_.begin(), running_.end(), t));
      t->set_started(false);
      t->end(f.status(), {});
      return;
    }
    std::shared_ptr<Fetch> fetch = std::move(f).value();
    t->set_running(fetch);
    KVS_LOG_DEBUG("scheduler: started '{}' (priority {}) after {:.3f} s queued", t->fetch_.request.context,
                  t->fetch_.priority, seconds_between(t->submitted_, t->started_at_));
    auto done = std::make_shared<std::atomic<bool>>(false);
    waiters_.push_back({std::thread([this, t, fetch, done] {
                          Status s = fetch->wait();
                          auto timings = fetch->timings();
                          auto kept = fetch->take_kept_bytes();
                          {
                            std::lock_guard g(mu_);
                            running_.erase(std::find(running_.begin(), running_.end(), t));
                          }
                          t->end(std::move(s), std::move(timings), std::move(kept));
                          done->store(true);
                          cv_.notify_all();
                        }),
                        done});
  }

  // Requires mu_. Joins the waiter threads of fetches that ended.
  void reap_waiters() {
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (!it->done->load()) {
        ++it;
        continue;
      }
      it->thread.join();
      it = waiters_.erase(it);
    }
  }
};

}  // namespace

Result<std::unique_ptr<Scheduler>> Scheduler::create(Pipeline& pipeline, storage::Client& client, AdaptivePlan plan,
                                                     const SchedulerConfig& config) {
  if (!plan.chooser || !plan.estimators)
    return make_status(StatusCode::invalid_argument, "scheduler needs a chooser and an estimator set");
  if (config.max_running == 0) return make_status(StatusCode::invalid_argument, "max_running must be >= 1");
  if (config.probe_bytes == 0) return make_status(StatusCode::invalid_argument, "probe_bytes must be > 0");
  return std::unique_ptr<Scheduler>(new SchedulerImpl(pipeline, client, std::move(plan), config));
}

}  // namespace kvstream::pipeline
