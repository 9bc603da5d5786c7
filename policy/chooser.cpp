// Level choosers: "deadline" (ours) and "paper" (CacheGen's equal share).
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <tuple>

#include "kvstream/policy.hpp"
#include "policy/lanes.hpp"

namespace kvstream::policy {

Status ContextCosts::validate() const {
  const size_t n = level_bytes.size();
  const size_t L = level_quality_loss.size();
  if (L == 0) return make_status(StatusCode::invalid_argument, "costs: no levels (level_quality_loss is empty)");
  for (size_t l = 0; l < L; ++l)
    if (!std::isfinite(level_quality_loss[l]))
      return make_status(StatusCode::invalid_argument, "costs: quality loss of level {} is not finite", l);
  if (!chunk_level_quality_loss.empty()) {
    if (chunk_level_quality_loss.size() != n)
      return make_status(StatusCode::invalid_argument, "costs: quality per chunk for {} chunks, expected {}",
                         chunk_level_quality_loss.size(), n);
    for (size_t c = 0; c < n; ++c) {
      if (chunk_level_quality_loss[c].size() != L)
        return make_status(StatusCode::invalid_argument, "costs: chunk {} has {} quality values, expected {}", c,
                           chunk_level_quality_loss[c].size(), L);
      for (double q : chunk_level_quality_loss[c])
        if (!std::isfinite(q))
          return make_status(StatusCode::invalid_argument, "costs: chunk {} has a quality loss that is not finite", c);
    }
  }
  for (size_t c = 0; c < n; ++c) {
    if (level_bytes[c].size() != L)
      return make_status(StatusCode::invalid_argument, "costs: chunk {} has {} level sizes, expected {}", c,
                         level_bytes[c].size(), L);
    for (size_t l = 0; l < L; ++l)
      if (level_bytes[c][l] == 0)
        return make_status(StatusCode::invalid_argument, "costs: chunk {} level {} has zero bytes", c, l);
  }
  if (!decode_seconds.empty()) {
    if (decode_seconds.size() != n)
      return make_status(StatusCode::invalid_argument, "costs: decode_seconds has {} chunks, expected {}",
                         decode_seconds.size(), n);
    for (size_t c = 0; c < n; ++c) {
      if (decode_seconds[c].size() != L)
        return make_status(StatusCode::invalid_argument, "costs: chunk {} has {} decode times, expected {}", c,
                           decode_seconds[c].size(), L);
      for (size_t l = 0; l < L; ++l)
        if (!std::isfinite(decode_seconds[c][l]) || decode_seconds[c][l] < 0)
          return make_status(StatusCode::invalid_argument, "costs: chunk {} level {} decode time {} s is invalid", c,
                             l, decode_seconds[c][l]);
    }
  }
  if (decode_workers < 1 || decode_workers > kMaxDecodeWorkers)
    return make_status(StatusCode::invalid_argument, "costs: {} decode workers, expected 1..{}", decode_workers,
                       kMaxDecodeWorkers);
  if (!std::isfinite(recompute_tokens_per_second) || recompute_tokens_per_second < 0)
    return make_status(StatusCode::invalid_argument, "costs: recompute rate {} tokens/s is invalid",
                       recompute_tokens_per_second);
  if (!std::isfinite(text_quality_loss))
    return make_status(StatusCode::invalid_argument, "costs: text quality loss is not finite");
  if (text_allowed()) {
    if (tokens.size() != n)
      return make_status(StatusCode::invalid_argument, "costs: recompute is on but tokens has {} chunks, expected {}",
                         tokens.size(), n);
    for (size_t c = 0; c < n; ++c)
      if (tokens[c] == 0) return make_status(StatusCode::invalid_argument, "costs: chunk {} has zero tokens", c);
  }
  return {};
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Status check_state(const ContextCosts& costs, const ChooseState& s) {
  KVS_RETURN_IF_ERROR(costs.validate());
  if (s.chunk >= costs.chunks())
    return make_status(StatusCode::invalid_argument, "choose: chunk {} out of range ({} chunks)", s.chunk,
                       costs.chunks());
  if (!std::isfinite(s.now_s) || !std::isfinite(s.time_left_s))
    return make_status(StatusCode::invalid_argument, "choose: non-finite time (now {} s, left {} s)", s.now_s,
                       s.time_left_s);
  if (!std::isfinite(s.decode_backlog_s) || s.decode_backlog_s < 0)
    return make_status(StatusCode::invalid_argument, "choose: decode backlog {} s is invalid", s.decode_backlog_s);
  if (!std::isfinite(s.wire_backlog_s) || s.wire_backlog_s < 0)
    return make_status(StatusCode::invalid_argument, "choose: wire backlog {} s is invalid", s.wire_backlog_s);
  if (!s.decode_worker_backlog_s.empty()) {
    if (s.decode_worker_backlog_s.size() != costs.decode_workers)
      return make_status(StatusCode::invalid_argument, "choose: {} decode worker backlogs for {} workers",
                         s.decode_worker_backlog_s.size(), costs.decode_workers);
    for (double b : s.decode_worker_backlog_s)
      if (!std::isfinite(b) || b < 0)
        return make_status(StatusCode::invalid_argument, "choose: decode worker backlog {} s is invalid", b);
  }
  if (!std::isfinite(s.recompute_backlog_s) || s.recompute_backlog_s < 0)
    return make_status(StatusCode::invalid_argument, "choose: recompute backlog {} s is invalid",
                       s.recompute_backlog_s);
  return {};
}

Status check_options(const ChooserOptions& o) {
  if (!std::isfinite(o.k) || o.k < 0)
    return make_status(StatusCode::invalid_argument, "chooser: k = {} is not a finite value >= 0", o.k);
  if (o.max_quality_loss && !std::isfinite(*o.max_quality_loss))
    return make_status(StatusCode::invalid_argument, "chooser: quality floor is not finite");
  if (!std::isfinite(o.reserve_factor) || o.reserve_factor < 1)
    return make_status(StatusCode::invalid_argument, "chooser: reserve_factor {} is not a finite value >= 1",
                       o.reserve_factor);
  if (!(o.slack_share >= 0 && o.slack_share <= 1))
    return make_status(StatusCode::invalid_argument, "chooser: slack_share {} is not in [0, 1]", o.slack_share);
  return {};
}

bool allowed(const ChooserOptions& o, double loss) { return !o.max_quality_loss || loss <= *o.max_quality_loss; }

double recompute_of(const ContextCosts& c, uint32_t chunk) {
  return double(c.tokens[chunk]) / c.recompute_tokens_per_second;
}

// Smallest allowed level of a chunk by bytes; -1 if none allowed.
int smallest_level(const ContextCosts& c, const ChooserOptions& o, uint32_t chunk) {
  int best = -1;
  for (uint32_t l = 0; l < c.levels(); ++l) {
    if (!allowed(o, c.loss(chunk, l))) continue;
    if (best < 0 || c.level_bytes[chunk][l] < c.level_bytes[chunk][size_t(best)]) best = int(l);
  }
  return best;
}

Choice make_choice(bool text, uint32_t level, const ContextCosts& c, uint32_t chunk) {
  Choice ch;
  ch.action = text ? Choice::Action::recompute : Choice::Action::fetch;
  ch.level = text ? 0 : level;
  ch.quality_loss = text ? c.text_quality_loss : c.loss(chunk, level);
  return ch;
}

// With no estimate at all: the smallest allowed option (text if no level is allowed).
Result<Choice> no_estimate_choice(const ContextCosts& c, const ChooserOptions& o, uint32_t chunk) {
  const int l = smallest_level(c, o, chunk);
  Choice ch;
  if (l >= 0) {
    ch = make_choice(false, uint32_t(l), c, chunk);
    ch.predicted_seconds = ch.predicted_total_seconds = decode_of(c, chunk, uint32_t(l));
  } else if (c.text_allowed() && allowed(o, c.text_quality_loss)) {
    ch = make_choice(true, 0, c, chunk);
    ch.predicted_seconds = ch.predicted_total_seconds = recompute_of(c, chunk);
  } else {
    return make_status(StatusCode::invalid_argument, "choose: the quality floor rules out every option of chunk {}",
                       chunk);
  }
  ch.fits = false;
  ch.note = "no throughput estimate yet: smallest option";
  return ch;
}

struct Option {
  bool text = false;
  uint32_t level = 0;
  double loss = 0;
};

Lanes lanes_now(const ContextCosts& costs, const ChooseState& s) {
  Lanes l{s.wire_backlog_s, s.decode_backlog_s, s.recompute_backlog_s, costs.decode_workers, {}};
  for (uint32_t w = 0; w < l.workers; ++w) {
    l.free[w] = s.decode_worker_backlog_s.empty() ? s.decode_backlog_s : s.decode_worker_backlog_s[w];
    l.decode = std::max(l.decode, l.free[w]);
  }
  return l;
}

}  // namespace

Result<Choice> DeadlineChooser::choose(const ContextCosts& costs, const ChooseState& state,
                                       const Estimator& estimator) const {
  KVS_RETURN_IF_ERROR(check_options(options_));
  KVS_RETURN_IF_ERROR(check_state(costs, state));
  const uint32_t c0 = state.chunk, n = costs.chunks(), L = costs.levels();
  const bool text_ok = costs.text_allowed() && allowed(options_, costs.text_quality_loss);

  // Appends one chunk with option o to the lanes; false when the estimator could not
  // predict (no_estimate or est_error say why). `chunk_done` is when it is in memory.
  bool no_estimate = false;
  Status est_error;
  auto append = [&](uint32_t chunk, const Option& o, Lanes& lanes, double& chunk_done, double factor) -> bool {
    if (o.text) {
      // Causal attention: the recompute needs every earlier chunk's KV in memory.
      lanes.text = std::max(lanes.text, lanes.decode) + recompute_of(costs, chunk);
      chunk_done = lanes.text;
      return true;
    }
    const double start = state.now_s < 0 ? -1.0 : state.now_s + lanes.wire;
    auto p = estimator.predict_at(costs.level_bytes[chunk][o.level], start);
    if (!p.ok()) {
      if (p.status().code() == StatusCode::unavailable) no_estimate = true;
      else est_error = p.status();
      return false;
    }
    lanes.wire += (p->seconds + options_.k * p->uncertainty_seconds) * factor;
    chunk_done = lanes.decode_chunk(lanes.wire, decode_of(costs, chunk, o.level));
    return true;
  };

  std::vector<Option> opts;
  for (uint32_t l = 0; l < L; ++l)
    if (allowed(options_, costs.loss(c0, l))) opts.push_back({false, l, costs.loss(c0, l)});
  if (text_ok) opts.push_back({true, 0, costs.text_quality_loss});
  if (opts.empty())
    return make_status(StatusCode::invalid_argument, "choose: the quality floor rules out every option of chunk {}",
                       c0);

  // The reserve's candidates per later chunk: its allowed levels that no other allowed
  // level beats on both stored bytes and decode time. With predictions that grow with
  // the bytes (every built-in estimator's do) a dominated level never frees the decoder
  // sooner, so this is the same reserve; a progressive chunk's many prefixes (every
  // one an option) reduce to the shortest, and the reserve costs what it did with a
  // few levels.
  std::vector<std::vector<uint32_t>> reserve_levels(n);
  {
    std::vector<uint32_t> order;
    for (const Option& o : opts)
      if (!o.text) order.push_back(o.level);
    for (uint32_t j = c0 + 1; j < n; ++j) {
      auto key = [&](uint32_t l) { return std::make_tuple(costs.level_bytes[j][l], decode_of(costs, j, l), l); };
      std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return key(a) < key(b); });
      double fastest = kInf;
      for (uint32_t l : order)
        if (decode_of(costs, j, l) < fastest) reserve_levels[j].push_back(l), fastest = decode_of(costs, j, l);
      std::sort(reserve_levels[j].begin(), reserve_levels[j].end());  // level order, as ties were broken
    }
  }

  struct Costed {
    Option o;
    double done = kInf, total = kInf;
  };
  const Option text_option{true, 0, costs.text_quality_loss};
  const Lanes now = lanes_now(costs, state);
  // Every option followed by the reserve, the reserve's transfers scaled by `hedge`.
  auto cost_all = [&](double hedge, std::vector<Costed>& costed) -> bool {
    costed.clear();
    for (const Option& o : opts) {
      Costed k{o};
      Lanes lanes = now;
      if (!append(c0, o, lanes, k.done, 1.0)) return false;
      // Reserve: the later chunks with their fastest options. Text goes first (a text
      // chunk after a fetched one would wait for its decode), so the reserve is the
      // best split: chunks c0+1 .. s-1 recomputed, s .. n-1 fetched, each at its
      // fastest level. Every lane only grows as chunks are appended, so a split whose
      // text prefix, or whose decode lane part-way through the fetched suffix, is
      // already later than the best completion so far cannot win: the text prefix of
      // every later split is longer still, and the rest of this suffix only adds.
      Lanes best, prefix = lanes;
      bool have = false;
      double unused = 0;
      const uint32_t last_split = text_ok ? n : c0 + 1;
      for (uint32_t split = c0 + 1; split <= last_split; ++split) {
        if (split > c0 + 1) append(split - 1, text_option, prefix, unused, hedge);
        if (have && prefix.text > best.complete()) break;
        Lanes cand = prefix;
        bool valid = true;
        for (uint32_t j = split; j < n && valid; ++j) {
          Lanes fastest;
          bool any = false;
          for (uint32_t level : reserve_levels[j]) {
            const Option r{false, level, 0.0};
            Lanes f = cand;
            if (!append(j, r, f, unused, hedge)) return false;
            if (!any || f.decode < fastest.decode || (f.decode == fastest.decode && f.wire < fastest.wire))
              fastest = f, any = true;
          }
          cand = fastest;
          // No level allowed: only the all-text split is a plan. Already too late: dropped.
          valid = any && !(have && cand.decode > best.complete());
        }
        if (!valid) continue;
        if (!have || cand.complete() < best.complete() ||
            (cand.complete() == best.complete() && cand.work() < best.work()))
          best = cand, have = true;
      }
      lanes = best;
      k.total = lanes.complete();
      costed.push_back(k);
    }
    return true;
  };
  // The best-quality option that meets the deadline and spends at most its part of the slack.
  auto best_fit = [&](const std::vector<Costed>& costed) -> const Costed* {
    double cheapest = kInf;
    for (const Costed& k : costed) cheapest = std::min(cheapest, k.total);
    const double share = options_.slack_share > 0 ? options_.slack_share : 1.0 / double(n - c0);
    const double spend = (state.time_left_s - cheapest) * share;
    const Costed* best = nullptr;
    for (const Costed& k : costed) {
      if (!(k.total <= state.time_left_s) || !(k.total - cheapest <= spend * (1 + 1e-12))) continue;
      if (!best || k.o.loss < best->o.loss || (k.o.loss == best->o.loss && k.total < best->total)) best = &k;
    }
    return best;
  };

  // cost_all stops at the first prediction that fails: an error, or no estimate yet.
  auto prediction_failed = [&]() -> Result<Choice> {
    if (!est_error.ok()) return est_error;
    return no_estimate_choice(costs, options_, c0);
  };
  std::vector<Costed> hedged, plain;
  if (!cost_all(options_.reserve_factor, hedged)) return prediction_failed();
  const Costed* best = best_fit(hedged);
  const char* why = "best fit";
  if (!best && options_.reserve_factor > 1) {
    // Nothing fits with the hedge: what fits if the link keeps its predicted rate.
    if (!cost_all(1.0, plain)) return prediction_failed();
    best = best_fit(plain);
    why = "fits without the reserve's hedge";
  }
  const bool fits = best != nullptr;
  if (!fits) {
    // Late whatever it picks: finish this chunk soonest and decide the rest with fresh
    // estimates, or (late_completes_context) follow the plan that completes the context
    // soonest. Plans often tie (a text chunk now or a fetched one now and that text
    // chunk after it), and its ties go to text: a text chunk decided now runs on the
    // runtime's GPU whatever the link does, where text placed after a fetched chunk
    // waits for its transfer. Then to the sooner chunk, not to quality: when the text
    // lane decides the completion every level ties, and the fastest keeps the margin.
    auto sooner = [&](const Costed& a, const Costed& b) {
      if (options_.late_completes_context) {
        if (std::abs(a.total - b.total) > 1e-9 * std::max(1.0, std::abs(b.total))) return a.total < b.total;
        if (a.o.text != b.o.text) return a.o.text;
      }
      return a.done < b.done || (a.done == b.done && a.o.loss < b.o.loss);
    };
    for (const Costed& k : plain.empty() ? hedged : plain)
      if (!best || sooner(k, *best)) best = &k;
  }
  Choice ch = make_choice(best->o.text, best->o.level, costs, c0);
  ch.fits = fits;
  ch.predicted_seconds = best->done;
  ch.predicted_total_seconds = best->total;
  ch.note = fits ? fmt::format("{}{}", why, best->o.text ? ": recompute" : "")
                 : (best->o.text ? "nothing fits: fastest is recompute" : "nothing fits: fastest level");
  return ch;
}

Result<Choice> PaperChooser::choose(const ContextCosts& costs, const ChooseState& state,
                                    const Estimator& estimator) const {
  KVS_RETURN_IF_ERROR(check_options(options_));
  KVS_RETURN_IF_ERROR(check_state(costs, state));
  const uint32_t c = state.chunk;
  const double share = state.time_left_s / double(costs.chunks() - c);
  const bool text_ok = costs.text_allowed() && allowed(options_, costs.text_quality_loss);

  int best = -1;
  double best_secs = kInf;
  std::vector<double> secs(costs.levels(), kInf);
  for (uint32_t l = 0; l < costs.levels(); ++l) {
    if (!allowed(options_, costs.loss(c, l))) continue;
    auto p = estimator.predict_at(costs.level_bytes[c][l], state.now_s);
    if (!p.ok()) {
      if (p.status().code() == StatusCode::unavailable) return no_estimate_choice(costs, options_, c);
      return p.status();
    }
    secs[l] = p->seconds;
    if (p->seconds <= share &&
        (best < 0 || costs.loss(c, l) < costs.loss(c, uint32_t(best)))) {
      best = int(l);
      best_secs = p->seconds;
    }
  }
  if (best >= 0) {
    Choice ch = make_choice(false, uint32_t(best), costs, c);
    ch.predicted_seconds = ch.predicted_total_seconds = best_secs;
    ch.note = "best fit in equal share";
    return ch;
  }
  const int small = smallest_level(costs, options_, c);
  if (small < 0 && !text_ok)
    return make_status(StatusCode::invalid_argument, "choose: the quality floor rules out every option of chunk {}",
                       c);
  Choice ch;
  if (text_ok && (small < 0 || recompute_of(costs, c) < secs[size_t(small)])) {
    ch = make_choice(true, 0, costs, c);
    ch.predicted_seconds = recompute_of(costs, c);
    ch.note = "nothing fits: fastest is recompute";
  } else {
    ch = make_choice(false, uint32_t(small), costs, c);
    ch.predicted_seconds = secs[size_t(small)];
    ch.note = "nothing fits: smallest level";
  }
  ch.predicted_total_seconds = ch.predicted_seconds;
  ch.fits = false;
  return ch;
}

Result<std::unique_ptr<Chooser>> make_chooser(std::string_view name, const ChooserOptions& options) {
  KVS_RETURN_IF_ERROR(check_options(options));
  if (name == "deadline") return std::unique_ptr<Chooser>(std::make_unique<DeadlineChooser>(options));
  if (name == "paper") return std::unique_ptr<Chooser>(std::make_unique<PaperChooser>(options));
  return make_status(StatusCode::not_found, "no chooser named '{}' (known: deadline, paper)", name);
}

}  // namespace kvstream::policy
