// The refinement planner: which chunks of a fetched context move to which finer level
// (prefix) after the first token, within a time budget. Greedy by quality gained per
// second, re-costed on the chooser's lanes after every move.
#include <cmath>
#include <limits>

#include "kvstream/policy.hpp"
#include "policy/lanes.hpp"

namespace kvstream::policy {

namespace {

// When every chunk that `plan` moves off `current` is decoded again, from now; false
// with the estimator's error in `error`.
bool plan_seconds(const ContextCosts& costs, std::span<const uint32_t> current, const std::vector<uint32_t>& plan,
                  const Estimator& estimator, double k, double& seconds, Status& error) {
  Lanes lanes;
  lanes.workers = costs.decode_workers;
  for (uint32_t c = 0; c < costs.chunks(); ++c) {
    if (plan[c] == current[c]) continue;
    const uint64_t bytes = costs.level_bytes[c][plan[c]] - costs.level_bytes[c][current[c]];
    auto p = estimator.predict(bytes);
    if (!p.ok()) {
      error = p.status();
      return false;
    }
    lanes.wire += p->seconds + k * p->uncertainty_seconds;
    lanes.decode_chunk(lanes.wire, decode_of(costs, c, plan[c]));
  }
  seconds = lanes.decode;
  return true;
}

double mean_loss(const ContextCosts& costs, const std::vector<uint32_t>& plan) {
  double sum = 0;
  uint32_t n = 0;
  for (uint32_t c = 0; c < costs.chunks(); ++c)
    if (plan[c] != kNotFetched) sum += costs.loss(c, plan[c]), ++n;
  return n ? sum / n : 0.0;
}

}  // namespace

Result<RefinementPlan> plan_refinement(const ContextCosts& costs, std::span<const uint32_t> current,
                                       const Estimator& estimator, double budget_s, double k) {
  KVS_RETURN_IF_ERROR(costs.validate());
  const uint32_t n = costs.chunks(), L = costs.levels();
  if (current.size() != n)
    return make_status(StatusCode::invalid_argument, "refinement plan: {} current levels for {} chunks",
                       current.size(), n);
  for (uint32_t c = 0; c < n; ++c)
    if (current[c] != kNotFetched && current[c] >= L)
      return make_status(StatusCode::invalid_argument, "refinement plan: chunk {} at level {} of {}", c, current[c], L);
  if (!std::isfinite(budget_s) || budget_s < 0)
    return make_status(StatusCode::invalid_argument, "refinement plan: budget {} s is invalid", budget_s);
  if (!std::isfinite(k) || k < 0)
    return make_status(StatusCode::invalid_argument, "refinement plan: k = {} is not a finite value >= 0", k);

  std::vector<uint32_t> plan(current.begin(), current.end());
  Status error;
  double now_s = 0;
  for (;;) {
    // Every move of one chunk to a finer level (a longer prefix with a lower loss),
    // costed with the rest of the plan; the best gain per added second that fits.
    uint32_t best_c = 0, best_l = 0;
    double best_ratio = -1, best_gain = 0, best_s = 0;
    for (uint32_t c = 0; c < n; ++c) {
      if (plan[c] == kNotFetched) continue;
      const uint32_t at = plan[c];
      for (uint32_t l = 0; l < L; ++l) {
        const double gain = costs.loss(c, at) - costs.loss(c, l);
        if (!(gain > 0) || costs.level_bytes[c][l] <= costs.level_bytes[c][at]) continue;
        plan[c] = l;
        double s = 0;
        const bool ok = plan_seconds(costs, current, plan, estimator, k, s, error);
        plan[c] = at;
        if (!ok) return error;
        if (s > budget_s) continue;
        const double ratio = gain / std::max(s - now_s, 1e-12);
        if (ratio > best_ratio || (ratio == best_ratio && gain > best_gain))
          best_ratio = ratio, best_gain = gain, best_c = c, best_l = l, best_s = s;
      }
    }
    if (best_ratio < 0) break;
    plan[best_c] = best_l;
    now_s = best_s;
  }

  RefinementPlan out;
  out.level = plan;
  for (uint32_t c = 0; c < n; ++c)
    if (plan[c] != current[c]) {
      ++out.chunks_refined;
      out.bytes += costs.level_bytes[c][plan[c]] - costs.level_bytes[c][current[c]];
    }
  out.predicted_seconds = now_s;
  out.quality_loss_before = mean_loss(costs, std::vector<uint32_t>(current.begin(), current.end()));
  out.quality_loss_after = mean_loss(costs, plan);
  return out;
}

}  // namespace kvstream::policy
