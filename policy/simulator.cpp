// Deterministic trace-driven link simulator running a real estimator and chooser.
#include <algorithm>
#include <cmath>

#include "kvstream/policy.hpp"

namespace kvstream::policy {

Result<SimResult> simulate(const SimConfig& config, Estimator& estimator, const Chooser& chooser) {
  KVS_RETURN_IF_ERROR(config.trace.validate().with_context("simulate"));
  KVS_RETURN_IF_ERROR(config.costs.validate().with_context("simulate"));
  if (!std::isfinite(config.start_s) || config.start_s < 0)
    return make_status(StatusCode::invalid_argument, "simulate: start {} s is not a finite time >= 0", config.start_s);
  if (!std::isfinite(config.deadline_s) || !(config.deadline_s > 0))
    return make_status(StatusCode::invalid_argument, "simulate: deadline {} s is not a finite value > 0",
                       config.deadline_s);
  const ContextCosts& costs = config.costs;
  const double deadline_abs = config.start_s + config.deadline_s;
  SimResult out;
  // The lanes: the wire, the decode workers, the runtime's recompute of text chunks.
  // stage_free: every fetched chunk so far is decoded.
  double wire_free = config.start_s, stage_free = config.start_s, text_free = config.start_s;
  std::vector<double> worker_free(costs.decode_workers, config.start_s);
  double loss_sum = 0;
  for (uint32_t c = 0; c < costs.chunks(); ++c) {
    const double now = wire_free;
    ChooseState st;
    st.chunk = c;
    st.now_s = now;
    st.time_left_s = deadline_abs - now;
    st.decode_backlog_s = std::max(0.0, stage_free - now);
    for (double w : worker_free) st.decode_worker_backlog_s.push_back(std::max(0.0, w - now));
    st.recompute_backlog_s = std::max(0.0, text_free - now);  // wire_backlog_s: 0, requests go one at a time
    auto choice = chooser.choose(costs, st, estimator);
    if (!choice.ok()) return choice.status().with_context(fmt::format("simulate: chunk {}", c));
    SimChunk sc;
    sc.choice = std::move(choice).value();
    if (sc.choice.recompute()) {
      sc.wire_start_s = sc.wire_end_s = now;
      // Its attention needs every earlier chunk: fetched ones decoded, text ones recomputed.
      sc.decode_start_s = std::max({now, stage_free, text_free});
      sc.decode_end_s = sc.decode_start_s + double(costs.tokens[c]) / costs.recompute_tokens_per_second;
      text_free = sc.decode_end_s;
      ++out.recomputed;
    } else {
      const uint32_t l = sc.choice.level;
      if (l >= costs.levels())
        return make_status(StatusCode::internal, "simulate: chunk {}: chooser picked level {} of {}", c, l,
                           costs.levels());
      sc.bytes = costs.level_bytes[c][l];
      KVS_ASSIGN_OR_RETURN(double end, config.trace.transfer_end(now, sc.bytes));
      sc.wire_start_s = now;
      sc.wire_end_s = end;
      KVS_RETURN_IF_ERROR(estimator.observe(sc.bytes, now, end).with_context(fmt::format("simulate: chunk {}", c)));
      auto worker = std::min_element(worker_free.begin(), worker_free.end());
      sc.decode_start_s = std::max(end, *worker);
      sc.decode_end_s = sc.decode_start_s + (costs.decode_seconds.empty() ? 0.0 : costs.decode_seconds[c][l]);
      wire_free = end;
      *worker = sc.decode_end_s;
      stage_free = std::max(stage_free, sc.decode_end_s);
    }
    if (!sc.choice.fits) ++out.fallbacks;
    loss_sum += sc.choice.quality_loss;
    out.chunks.push_back(std::move(sc));
  }
  out.finish_s = costs.chunks() ? std::max(stage_free, text_free) - config.start_s : 0.0;
  out.violated = out.finish_s > config.deadline_s;
  out.mean_quality_loss = costs.chunks() ? loss_sum / double(costs.chunks()) : 0.0;
  return out;
}

}  // namespace kvstream::policy
