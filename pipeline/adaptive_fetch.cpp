#include "kvstream/adaptive_fetch.hpp"

#include <algorithm>
#include <map>
#include <mutex>

#include "core/log.hpp"

namespace kvstream::pipeline {

Clock::time_point WireClock::transfer_start(Clock::time_point requested, Clock::time_point landed) {
  std::lock_guard lk(mu_);
  const Clock::time_point start = last_landed_ > requested && last_landed_ < landed ? last_landed_ : requested;
  last_landed_ = std::max(last_landed_, landed);
  return start;
}

std::vector<double> decode_costs(std::span<const uint64_t> level_bytes, std::span<const double> seconds_per_byte) {
  std::vector<double> d(level_bytes.size(), 0.0);
  for (size_t l = 0; l < level_bytes.size() && l < seconds_per_byte.size(); ++l)
    d[l] = double(level_bytes[l]) * seconds_per_byte[l];
  return d;
}

policy::ContextCosts plan_costs(const AdaptivePlan& plan, std::vector<std::vector<uint64_t>> level_bytes,
                                std::vector<std::vector<double>> chunk_loss, std::span<const uint64_t> chunk_tokens) {
  policy::ContextCosts c;
  c.level_bytes = std::move(level_bytes);
  c.level_quality_loss = plan.level_quality_loss;
  c.chunk_level_quality_loss = std::move(chunk_loss);
  if (!plan.decode_seconds_per_byte.empty())
    for (const auto& sizes : c.level_bytes) c.decode_seconds.push_back(decode_costs(sizes, plan.decode_seconds_per_byte));
  c.decode_workers = plan.decode_workers;
  if (plan.recompute_tokens_per_second > 0 && !chunk_tokens.empty()) {
    c.tokens.assign(chunk_tokens.begin(), chunk_tokens.end());
    c.recompute_tokens_per_second = plan.recompute_tokens_per_second;
  }
  return c;
}

Result<FetchCallbacks> adaptive_callbacks(const AdaptivePlan& plan, std::vector<std::vector<uint64_t>> level_bytes,
                                          transport::Deadline deadline,
                                          std::function<void(const ChunkTimings&)> on_chunk) {
  if (!plan.chooser || !plan.estimators)
    return make_status(StatusCode::invalid_argument, "adaptive fetch needs a chooser and an estimator set");
  auto costs = std::make_shared<policy::ContextCosts>(
      plan_costs(plan, std::move(level_bytes), plan.chunk_level_quality_loss, plan.chunk_tokens));
  KVS_RETURN_IF_ERROR(costs->validate());
  const double deadline_s = policy::to_seconds(deadline);
  // When each lane of the chooser's model is next free (absolute seconds), booked from
  // the decisions made so far and corrected as chunks land. The pipeline decides a
  // chunk while earlier ones are still on the wire or in the decoder; without this the
  // chooser would see an idle link and an idle decoder before every chunk.
  struct Booking {
    std::mutex mu;
    double wire_free = 0, decode_free = 0, text_free = 0;  // decode_free: every fetched chunk decoded
    std::vector<double> worker_free;                       // each decode worker
    std::map<uint32_t, double> predicted_landing;          // fetched chunks not landed yet
  };
  auto book = std::make_shared<Booking>();
  book->worker_free.assign(costs->decode_workers, 0.0);
  FetchCallbacks cb;
  cb.decide = [plan, costs, deadline_s, book](uint32_t chunk, std::span<const uint64_t> sizes) {
    std::lock_guard lk(book->mu);
    // The pipeline's sizes are those of the chunk it will fetch for this range (after
    // stored_contexts and stored_chunks): they win over the table given at creation,
    // which a caller may have indexed by stored chunk instead of by range.
    if (chunk < costs->level_bytes.size() && !sizes.empty() &&
        !std::equal(sizes.begin(), sizes.end(), costs->level_bytes[chunk].begin(), costs->level_bytes[chunk].end())) {
      costs->level_bytes[chunk].assign(sizes.begin(), sizes.end());
      if (!costs->decode_seconds.empty()) costs->decode_seconds[chunk] = decode_costs(sizes, plan.decode_seconds_per_byte);
      if (Status v = costs->validate(); !v.ok())
        KVS_LOG_WARN("chunk {}: the stored sizes do not fit the plan: {}", chunk, v.to_string());
    }
    policy::ChooseState st;
    st.chunk = chunk;
    st.now_s = policy::to_seconds(plan.now ? plan.now() : Clock::now());
    st.time_left_s = deadline_s - st.now_s;
    st.wire_backlog_s = std::max(0.0, book->wire_free - st.now_s);
    st.decode_backlog_s = std::max(0.0, book->decode_free - st.now_s);
    for (double w : book->worker_free) st.decode_worker_backlog_s.push_back(std::max(0.0, w - st.now_s));
    st.recompute_backlog_s = std::max(0.0, book->text_free - st.now_s);
    // A placeholder the chooser overwrites: built without make_status, which would log it.
    Result<policy::Choice> choice = Status(StatusCode::internal, "no choice");
    double wire_s = 0;
    const Status s = plan.estimators->with(plan.peer, [&](policy::Estimator& e) {
      choice = plan.chooser->choose(*costs, st, e);
      if (choice.ok() && !choice->recompute()) {
        auto p = e.predict_at(costs->level_bytes[chunk][choice->level], st.now_s + st.wire_backlog_s);
        if (p.ok()) wire_s = p->seconds;
      }
    });
    if (s.ok() && choice.ok())
      KVS_LOG_DEBUG("chunk {}: {} (level {}, {}); left {:.3f} s, backlogs wire {:.3f} decode {:.3f} text {:.3f}; "
                    "predicted done {:.3f} total {:.3f}",
                    chunk, choice->recompute() ? "text" : "fetch", choice->level, choice->note, st.time_left_s,
                    st.wire_backlog_s, st.decode_backlog_s, st.recompute_backlog_s, choice->predicted_seconds,
                    choice->predicted_total_seconds);
    uint32_t level = uint32_t(costs->levels() - 1);
    if (!s.ok() || !choice.ok()) {
      // No usable decision: the smallest level keeps the fetch going; say why once.
      KVS_LOG_WARN("chunk {}: chooser failed ({}); fetching the smallest level", chunk,
                   (s.ok() ? choice.status() : s).to_string());
    } else if (choice->recompute()) {
      // The runtime recomputes it once every earlier chunk is in memory.
      book->text_free = std::max({book->text_free, book->decode_free, st.now_s}) +
                        double(costs->tokens[chunk]) / costs->recompute_tokens_per_second;
      return ChunkDecision{ChunkDecision::Action::recompute, 0};
    } else {
      level = choice->level;
    }
    book->wire_free = std::max(book->wire_free, st.now_s) + wire_s;
    book->predicted_landing[chunk] = book->wire_free;
    auto worker = std::min_element(book->worker_free.begin(), book->worker_free.end());
    *worker = std::max(*worker, book->wire_free) +
              (costs->decode_seconds.empty() ? 0.0 : costs->decode_seconds[chunk][level]);
    book->decode_free = std::max(book->decode_free, *worker);
    return ChunkDecision{ChunkDecision::Action::fetch, level};
  };
  auto wire = std::make_shared<WireClock>();
  cb.on_chunk = [plan, wire, book, on_chunk = std::move(on_chunk)](const ChunkTimings& t) {
    if (t.status.ok() && t.bytes > 0 && t.wire_end > t.wire_start)
      (void)plan.estimators->observe(plan.peer, t.bytes,
                                     policy::to_seconds(wire->transfer_start(t.wire_start, t.wire_end)),
                                     policy::to_seconds(t.wire_end));
    {
      // Chunks booked behind this one land (and decode) as much later, or earlier, as it did.
      std::lock_guard lk(book->mu);
      if (auto it = book->predicted_landing.find(t.chunk); it != book->predicted_landing.end()) {
        if (t.status.ok() && t.bytes > 0) {
          const double delta = policy::to_seconds(t.wire_end) - it->second;
          book->wire_free = std::max(book->wire_free + delta, policy::to_seconds(t.wire_end));
          book->decode_free = std::max(book->decode_free + delta, policy::to_seconds(t.decode_end));
          for (double& w : book->worker_free) w = std::max(0.0, w + delta);
        }
        book->predicted_landing.erase(it);
      }
    }
    if (on_chunk) on_chunk(t);
  };
  return cb;
}

}  // namespace kvstream::pipeline
