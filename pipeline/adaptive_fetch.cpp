#include "kvstream/adaptive_fetch.hpp"

#include <algorithm>

#include "core/log.hpp"

namespace kvstream::pipeline {

Clock::time_point WireClock::transfer_start(Clock::time_point requested, Clock::time_point landed) {
  std::lock_guard lk(mu_);
  const Clock::time_point start = last_landed_ > requested && last_landed_ < landed ? last_landed_ : requested;
  last_landed_ = std::max(last_landed_, landed);
  return start;
}

Result<FetchCallbacks> adaptive_callbacks(const AdaptivePlan& plan, std::vector<std::vector<uint64_t>> level_bytes,
                                          transport::Deadline deadline,
                                          std::function<void(const ChunkTimings&)> on_chunk) {
  if (!plan.chooser || !plan.estimators)
    return make_status(StatusCode::invalid_argument, "adaptive fetch needs a chooser and an estimator set");
  auto costs = std::make_shared<policy::ContextCosts>();
  costs->level_bytes = std::move(level_bytes);
  costs->level_quality_loss = plan.level_quality_loss;
  if (!plan.decode_seconds_per_byte.empty()) {
    for (const auto& sizes : costs->level_bytes) {
      std::vector<double> d(sizes.size(), 0.0);
      for (size_t l = 0; l < sizes.size() && l < plan.decode_seconds_per_byte.size(); ++l)
        d[l] = double(sizes[l]) * plan.decode_seconds_per_byte[l];
      costs->decode_seconds.push_back(std::move(d));
    }
  }
  if (plan.recompute_tokens_per_second > 0 && !plan.chunk_tokens.empty()) {
    costs->tokens = plan.chunk_tokens;
    costs->recompute_tokens_per_second = plan.recompute_tokens_per_second;
  }
  KVS_RETURN_IF_ERROR(costs->validate());
  const double deadline_s = policy::to_seconds(deadline);
  // When the decode stage (which, in the chooser's model, also recomputes text) is
  // next free, from the decisions made so far: each text chunk occupies it for its
  // recompute, each fetched chunk for its decode. Without it a chooser would see an
  // idle stage before every chunk and could pile up more text than the deadline holds.
  auto stage_free_s = std::make_shared<double>(0.0);
  FetchCallbacks cb;
  cb.decide = [plan, costs, deadline_s, stage_free_s](uint32_t chunk, std::span<const uint64_t>) {
    policy::ChooseState st;
    st.chunk = chunk;
    st.now_s = policy::to_seconds(Clock::now());
    st.time_left_s = deadline_s - st.now_s;
    st.decode_backlog_s = std::max(0.0, *stage_free_s - st.now_s);
    auto book = [&](double busy_s) { *stage_free_s = std::max(*stage_free_s, st.now_s) + busy_s; };
    Result<policy::Choice> choice = make_status(StatusCode::internal, "no choice");
    const Status s = plan.estimators->with(
        plan.peer, [&](policy::Estimator& e) { choice = plan.chooser->choose(*costs, st, e); });
    if (!s.ok() || !choice.ok()) {
      // No usable decision: the smallest level keeps the fetch going; say why once.
      KVS_LOG_WARN("chunk {}: chooser failed ({}); fetching the smallest level", chunk,
                   (s.ok() ? choice.status() : s).to_string());
      return ChunkDecision{ChunkDecision::Action::fetch, uint32_t(costs->levels() - 1)};
    }
    if (choice->recompute()) {
      book(double(costs->tokens[chunk]) / costs->recompute_tokens_per_second);
      return ChunkDecision{ChunkDecision::Action::recompute, 0};
    }
    book(costs->decode_seconds.empty() ? 0.0 : costs->decode_seconds[chunk][choice->level]);
    return ChunkDecision{ChunkDecision::Action::fetch, choice->level};
  };
  auto wire = std::make_shared<WireClock>();
  cb.on_chunk = [plan, wire, on_chunk = std::move(on_chunk)](const ChunkTimings& t) {
    if (t.status.ok() && t.bytes > 0 && t.wire_end > t.wire_start)
      (void)plan.estimators->observe(plan.peer, t.bytes,
                                     policy::to_seconds(wire->transfer_start(t.wire_start, t.wire_end)),
                                     policy::to_seconds(t.wire_end));
    if (on_chunk) on_chunk(t);
  };
  return cb;
}

}  // namespace kvstream::pipeline
