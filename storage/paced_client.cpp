// The paced client (include/kvstream/paced_client.hpp): a token bucket in front of a
// storage client. Virtual link time is kept in seconds on the config's clock (the
// steady clock by default); held completions wait on one timer thread.
#include "kvstream/paced_client.hpp"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvstream::storage {

namespace {

using namespace std::chrono_literals;
using transport::CancelToken;
using transport::Clock;
using transport::Deadline;
using Now = std::function<Clock::time_point()>;

double secs(Clock::time_point t) { return std::chrono::duration<double>(t.time_since_epoch()).count(); }
Clock::time_point at(double s) {
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)));
}

// One direction of the link: a token bucket of `burst` bytes filled at `rate` bytes/s.
class Bucket {
 public:
  Bucket(double bytes_per_second, double burst) : rate_(bytes_per_second), burst_(burst), tokens_(burst) {}
  // Charges n bytes of a transfer requested at `requested_s`; returns when it ends.
  double charge(double requested_s, uint64_t n) {
    std::lock_guard lock(mu_);
    const double start = std::max(requested_s, last_);
    const double tokens = std::min(burst_, tokens_ + rate_ * (start - last_));
    const double wait = std::max(0.0, (double(n) - tokens) / rate_);
    const double end = start + wait;
    tokens_ = tokens + rate_ * wait - double(n);
    last_ = end;
    return end;
  }

 private:
  std::mutex mu_;
  double rate_, burst_, tokens_;
  double last_ = 0;  // when the link finished the last charged body
};

// Completions held until their paced time.
class Timer {
 public:
  explicit Timer(Now now) : now_(std::move(now)), thread_([this] { loop(); }) {}
  ~Timer() { stop(); }

  struct Held {
    double release_s;
    Deadline deadline;
    CancelToken cancel;
    Result<size_t> result;
    GetCallback done;
  };
  void hold(Held h) {
    {
      std::lock_guard lock(mu_);
      if (!stopping_) {
        held_.push_back(std::move(h));
        cv_.notify_one();
        return;
      }
    }
    h.done(std::move(h.result));  // stopping: no waiting any more
  }
  // Releases everything still held, at once, and joins the thread.
  void stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  const Now now_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Held> held_;
  bool stopping_ = false;
  std::thread thread_;

  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      std::vector<Held> due;
      const auto now = now_();
      const double now_s = secs(now);
      for (size_t i = 0; i < held_.size();) {
        Held& h = held_[i];
        if (stopping_ || h.release_s <= now_s) {
        } else if (h.cancel.cancelled()) {
          h.result = make_status(StatusCode::cancelled, "request cancelled (held by the paced link)");
        } else if (now >= h.deadline) {
          h.result = make_status(StatusCode::timed_out, "request past its deadline (held by the paced link)");
        } else {
          ++i;
          continue;
        }
        due.push_back(std::move(h));
        held_[i] = std::move(held_.back());
        held_.pop_back();
      }
      if (!due.empty()) {
        lock.unlock();
        for (Held& h : due) h.done(std::move(h.result));
        lock.lock();
        continue;
      }
      if (stopping_) return;
      if (held_.empty()) {
        cv_.wait(lock);
        continue;
      }
      // Next release or deadline; at most 1 ms, so that cancellation is seen promptly
      // (and a clock that is not the real one is read again). A span, not a time
      // point: the clock may be any.
      Clock::time_point wake = now + 1ms;
      for (const Held& h : held_) wake = std::min({wake, at(h.release_s), h.deadline});
      cv_.wait_for(lock, wake - now);
    }
  }
};

class PacedClient final : public Client {
 public:
  PacedClient(std::unique_ptr<Client> inner, const PacedClientConfig& c)
      : inner_(std::move(inner)),
        config_(c),
        now_(c.now ? c.now : Now(&Clock::now)),
        down_(std::make_shared<Bucket>(c.bits_per_second / 8, double(c.burst_bytes))),
        up_(c.bits_per_second / 8, double(c.burst_bytes)),
        timer_(std::make_shared<Timer>(now_)) {}
  ~PacedClient() override {
    inner_.reset();  // its pending requests complete (into the timer) with its errors
    timer_->stop();
  }

  // The pacer only delays: memory and capabilities are the inner client's.
  const transport::Capabilities* capabilities() const override { return inner_->capabilities(); }

  Result<transport::MemoryRegion> register_memory(void* data, size_t size) override {
    return inner_->register_memory(data, size);
  }
  Result<transport::MemoryRegion> register_memory(void* data, size_t size, transport::MemoryType type) override {
    return inner_->register_memory(data, size, type);
  }

  Status put(const std::string& context, uint32_t chunk, uint32_t level, std::span<const std::byte> bytes,
             Deadline deadline, const CancelToken& cancel) override {
    const double requested = secs(now_());
    return pace_put(inner_->put(context, chunk, level, bytes, deadline, cancel), requested, bytes.size(), deadline,
                    cancel);
  }

  Status put_versioned(const std::string& context, uint32_t chunk, uint32_t level, std::span<const std::byte> bytes,
                       uint64_t version, Deadline deadline, const CancelToken& cancel) override {
    const double requested = secs(now_());
    return pace_put(inner_->put_versioned(context, chunk, level, bytes, version, deadline, cancel), requested,
                    bytes.size(), deadline, cancel);
  }

  Status put_parts(const std::string& context, uint32_t chunk, uint32_t level, std::span<const std::byte> bytes,
                   std::span<const ObjectPart> parts, uint64_t version, Deadline deadline,
                   const CancelToken& cancel) override {
    const double requested = secs(now_());
    return pace_put(inner_->put_parts(context, chunk, level, bytes, parts, version, deadline, cancel), requested,
                    bytes.size(), deadline, cancel);
  }

  // Holds a put that the node took until the paced uplink would have carried it.
  Status pace_put(Status s, double requested, size_t bytes, Deadline deadline, const CancelToken& cancel) {
    if (!s.ok() || !config_.pace_puts) return s;
    const auto end = at(up_.charge(requested, bytes));
    for (auto now = now_(); now < end; now = now_()) {
      if (cancel.cancelled()) return make_status(StatusCode::cancelled, "put cancelled (paced link)");
      if (now >= deadline) return make_status(StatusCode::timed_out, "put past its deadline (paced link)");
      std::this_thread::sleep_for(std::min({end, deadline, now + 1ms}) - now);
    }
    return s;
  }

  void get_async(const std::string& context, uint32_t chunk, uint32_t level, transport::MemoryRegion dest,
                 size_t offset, size_t capacity, Deadline deadline, const CancelToken& cancel,
                 GetCallback done) override {
    inner_->get_async(context, chunk, level, std::move(dest), offset, capacity, deadline, cancel,
                      paced(deadline, cancel, std::move(done)));
  }

  // As get_async, charging the range's `length` bytes (what crossed the link).
  void get_range_async(const std::string& context, uint32_t chunk, uint32_t level, uint64_t offset, uint64_t length,
                       transport::MemoryRegion dest, size_t dest_offset, Deadline deadline, const CancelToken& cancel,
                       GetCallback done) override {
    inner_->get_range_async(context, chunk, level, offset, length, std::move(dest), dest_offset, deadline, cancel,
                            paced(deadline, cancel, std::move(done)));
  }

  Result<std::vector<ChunkStat>> stat(const std::string& context, Deadline deadline,
                                      const CancelToken& cancel) override {
    return inner_->stat(context, deadline, cancel);
  }
  Status remove(const std::string& context, Deadline deadline, const CancelToken& cancel) override {
    return inner_->remove(context, deadline, cancel);
  }
  Status remove_up_to(const std::string& context, uint64_t version, Deadline deadline,
                      const CancelToken& cancel) override {
    return inner_->remove_up_to(context, version, deadline, cancel);
  }
  Status remove_many(std::span<const ContextRemove> removes, Deadline deadline, const CancelToken& cancel) override {
    return inner_->remove_many(removes, deadline, cancel);
  }
  Result<std::vector<std::string>> list(Deadline deadline, const CancelToken& cancel) override {
    return inner_->list(deadline, cancel);
  }
  Status touch(std::span<const ContextTouch> contexts, uint64_t stamp, Deadline deadline,
               const CancelToken& cancel) override {
    return inner_->touch(contexts, stamp, deadline, cancel);
  }
  Result<std::vector<ContextUsage>> usage(const std::string& prefix, Deadline deadline,
                                          const CancelToken& cancel) override {
    return inner_->usage(prefix, deadline, cancel);
  }

 private:
  // The completion of a body requested now: an inner success of n bytes charges the
  // downlink n bytes and is held until the paced end; errors pass at once.
  GetCallback paced(Deadline deadline, const CancelToken& cancel, GetCallback done) {
    return [now = now_, down = down_, timer = timer_, requested = secs(now_()), deadline, cancel,
            done = std::move(done)](Result<size_t> r) mutable {
      if (!r.ok()) return done(std::move(r));
      const double release = down->charge(requested, *r);
      if (release <= secs(now())) return done(std::move(r));
      timer->hold({release, deadline, cancel, std::move(r), std::move(done)});
    };
  }

  std::unique_ptr<Client> inner_;
  PacedClientConfig config_;
  Now now_;
  std::shared_ptr<Bucket> down_;
  Bucket up_;
  std::shared_ptr<Timer> timer_;
};

}  // namespace

Result<std::unique_ptr<Client>> make_paced_client(std::unique_ptr<Client> inner, const PacedClientConfig& config) {
  if (!inner) return make_status(StatusCode::invalid_argument, "paced client: no inner client");
  if (!(config.bits_per_second > 0) || !std::isfinite(config.bits_per_second))
    return make_status(StatusCode::invalid_argument, "paced client: rate {} bit/s is not > 0 and finite",
                       config.bits_per_second);
  return std::unique_ptr<Client>(std::make_unique<PacedClient>(std::move(inner), config));
}

std::unique_ptr<Client> make_paced_client(std::unique_ptr<Client> inner, double bits_per_second) {
  PacedClientConfig c;
  c.bits_per_second = bits_per_second;
  auto r = make_paced_client(std::move(inner), c);
  return r.ok() ? std::move(r).value() : nullptr;
}

}  // namespace kvstream::storage
