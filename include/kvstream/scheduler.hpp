// Fetch scheduling for runtimes with schedulers of their own: ask what a fetch would
// cost before committing (admission: fetch, or recompute everything), submit it with a
// deadline and a priority, follow it chunk by chunk, cancel it. Several fetches share
// one link: at most `max_running` run at once (they split the link, and the per-peer
// estimator, shared by all of them, sees the split); the rest wait, highest priority
// first, first come first served within a priority.
//
// Every running fetch chooses its levels adaptively (adaptive_fetch.hpp) against its
// own deadline; the time a fetch spends waiting for a slot counts against it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kvstream/adaptive_fetch.hpp"
#include "kvstream/pipeline.hpp"
#include "kvstream/storage.hpp"

namespace kvstream::pipeline {

/// Scheduler settings (defaults documented per field).
struct SchedulerConfig {
  uint32_t max_running = 2;  ///< fetches in flight at once, sharing the link; >= 1
  /// Transfer size used to turn the peer's estimate into a link rate for predictions.
  uint64_t probe_bytes = uint64_t(4) << 20;
  /// The clock admission predicts from and queued deadlines are checked on (the
  /// running fetches keep the pipeline's). Empty (default): transport::Clock::now, the
  /// steady clock. Tests pass a clock they move, so that what a prediction subtracts
  /// for time already spent is what the test says; the dispatcher then looks at the
  /// queue again at least every second of real time (and on every submit, end and
  /// cancel).
  std::function<transport::Clock::time_point()> now;
};

/// One fetch as a runtime's scheduler hands it over.
struct ScheduledFetch {
  FetchRequest request;  ///< context, destination, chunks, deadline (absolute), cancel
  int priority = 0;      ///< higher runs first
  /// When the runtime wants the fetch done: the time the chooser plans each chunk's
  /// level for, and admission predicts against. A late fetch still runs on, until
  /// request.deadline, where it fails timed_out. Unset (the epoch): request.deadline.
  transport::Deadline target{};
  /// Tokens of each chunk, for the recompute option (empty: never recompute).
  std::vector<uint64_t> chunk_tokens;
  /// Each chunk's own quality loss per level, where the store measured it (empty:
  /// the plan's level_quality_loss for every chunk).
  std::vector<std::vector<double>> chunk_level_quality_loss;
  /// Called per chunk the moment it is in the runtime's memory, reported for
  /// recompute, or failed (from a pipeline thread).
  std::function<void(const ChunkTimings&)> on_chunk;
};

/// What the scheduler predicts for a fetch if it were submitted now.
struct Admission {
  bool fits = false;              ///< predicted to finish by the deadline
  double queue_seconds = 0;       ///< predicted wait for a slot behind running and queued fetches
  double predicted_seconds = 0;   ///< from now until the last chunk is decoded (wait included)
  double mean_quality_loss = 0;   ///< mean over chunks of the planned options' loss
  uint32_t recompute_chunks = 0;  ///< chunks the plan would send as text
  double link_bits_per_second = 0;  ///< the share of the link the prediction assumed
  std::vector<ChunkDecision> plan;  ///< the planned decision per chunk (revised while fetching)
};

/// A submitted fetch.
class Ticket {
 public:
  virtual ~Ticket() = default;
  /// Waits until the fetch ended: ok when every chunk was delivered or reported for
  /// recompute; timed_out when its deadline passed (waiting or running); cancelled;
  /// otherwise the first chunk's failure.
  virtual Status wait() = 0;
  /// Cancels it, queued or running (the pipeline frees its buffers before wait returns).
  virtual void cancel() = 0;
  /// Whether it has left the queue.
  [[nodiscard]] virtual bool started() const = 0;
  /// Per-chunk timings once ended (empty when it never started).
  [[nodiscard]] virtual std::vector<ChunkTimings> timings() const = 0;
  /// The admission computed when it was submitted.
  [[nodiscard]] virtual const Admission& admission() const = 0;
  /// Once ended, with FetchRequest::keep_bytes: Fetch::take_kept_bytes of its fetch.
  virtual std::vector<std::vector<uint8_t>> take_kept_bytes() = 0;
};

/// Runs fetches through one pipeline and one storage client (one peer).
class Scheduler {
 public:
  virtual ~Scheduler() = default;
  /// `pipeline` and `client` must outlive the scheduler; `plan` names the chooser, the
  /// shared estimators, the peer and the per-level quality and decode costs
  /// (plan.chunk_tokens is taken from each ScheduledFetch instead). Errors:
  /// invalid_argument (no chooser or estimators, max_running 0).
  static Result<std::unique_ptr<Scheduler>> create(Pipeline& pipeline, storage::Client& client, AdaptivePlan plan,
                                                   const SchedulerConfig& config = {});
  /// Predicts the fetch without starting it: the stored sizes (one stat call), the
  /// peer's current throughput estimate shared with the fetches ahead of it, and the
  /// chooser's plan on that link (the link simulator with the estimate held constant:
  /// an honest forecast only while the link holds steady). The stat runs under the
  /// fetch's own deadline and cancel token. Errors: the stat's errors (timed_out when
  /// the budget ran out before the sizes came back: too late to fetch, recompute);
  /// unavailable when the peer has no estimate yet (give the estimators a prior).
  [[nodiscard]] virtual Result<Admission> predict(const ScheduledFetch& fetch) const = 0;
  /// Queues the fetch (predicting it as predict() does). Its destination must stay
  /// valid until the ticket ended (wait() returned) or the scheduler is destroyed
  /// (which cancels and waits for every fetch). Errors: those of predict, cancelled
  /// when the scheduler is shutting down.
  virtual Result<std::shared_ptr<Ticket>> submit(ScheduledFetch fetch) = 0;
  /// Fetches running and waiting now.
  [[nodiscard]] virtual uint32_t running() const = 0;
  [[nodiscard]] virtual uint32_t queued() const = 0;
};

}  // namespace kvstream::pipeline
