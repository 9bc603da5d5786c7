// The policy layer: how fast is the link to each storage node, and which compression
// level (or text, i.e. recompute) to fetch for each chunk so that a context's KV cache
// is in GPU memory before its deadline at the best quality that allows.
//
// Three parts, all independent of the pipeline and the transport:
//
//  * Throughput estimators (Estimator) behind one small interface, made by name from a
//    registry that a runtime can extend (EstimatorRegistry, register_estimator,
//    make_estimator). Built in: "last", "ewma", "harmonic", "percentile", "oracle".
//    EstimatorSet keeps one estimator per peer and is safe to share between
//    concurrent fetches.
//  * Level choosers (Chooser): "deadline" (ours, see DeadlineChooser for the
//    algorithm) and "paper" (CacheGen's equal-share rule, for comparison).
//  * A deterministic, trace-driven link simulator (simulate) that runs a real
//    estimator and chooser over a context's chunks, for tests and scale studies.
//
// Times are seconds as double on any monotonic epoch (to_seconds() converts a
// steady_clock time point); rates in traces are bits per second; sizes are bytes.
// No exception crosses this API: failures are Status / Result<T>.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvstream/status.hpp"

namespace kvstream::policy {

/// Seconds since the steady clock's epoch: the time base estimators expect when a
/// caller measures transfers with std::chrono::steady_clock.
inline double to_seconds(std::chrono::steady_clock::time_point t) noexcept {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

// ---- Link traces ------------------------------------------------------------------

/// From `start_s` on (until the next segment starts) the link carries `bits_per_second`.
struct RateSegment {
  double start_s = 0;
  double bits_per_second = 0;
};

/// A link as rate over time (piecewise constant) plus a fixed latency per transfer.
/// The first segment starts at 0, starts strictly increase, the last segment lasts
/// forever. A rate may be 0 (an outage) except in the last segment.
struct LinkTrace {
  std::vector<RateSegment> segments;
  double latency_s = 0;

  /// invalid_argument naming the first problem (empty, unordered, negative or
  /// non-finite values, last rate 0), or ok.
  [[nodiscard]] Status validate() const;
  /// Rate in bits/s at time t (t >= 0). Requires a valid trace.
  [[nodiscard]] double rate_at(double t) const noexcept;
  /// When a transfer of `bytes` requested at `start_s` completes: the request takes
  /// latency_s, then the bytes flow at the trace's rate. Errors: invalid_argument for
  /// an invalid trace, a negative or non-finite start, or zero bytes.
  [[nodiscard]] Result<double> transfer_end(double start_s, uint64_t bytes) const;
};

/// Parses a trace from text: one segment per line, "<start_s> <bits_per_second>",
/// optionally a line "latency <seconds>"; '#' starts a comment; blank lines are
/// skipped. The result is validated. Errors: invalid_argument with the line number.
Result<LinkTrace> parse_trace(std::string_view text);

// ---- Throughput estimators ---------------------------------------------------------

/// What an estimator expects a transfer of some bytes to take.
struct Prediction {
  double seconds = 0;              ///< best estimate
  double uncertainty_seconds = 0;  ///< one standard deviation (0 when unknown)
};

/// Settings every built-in estimator reads (each uses the fields it needs).
struct EstimatorOptions {
  /// Used before the first observation, in bits/s; 0: predict() fails with
  /// `unavailable` until something was observed.
  double prior_bits_per_second = 0;
  /// Samples kept for "harmonic", "percentile" and for every estimator's uncertainty.
  uint32_t window = 8;
  /// "ewma": weight of the newest sample, in (0, 1].
  double alpha = 0.5;
  /// "percentile": which low percentile of the window's throughputs, in [0, 1]
  /// (0.1 = p10; 0 = the slowest sample).
  double percentile = 0.1;
  /// "oracle": the link's true trace (required for "oracle", ignored by the others).
  std::shared_ptr<const LinkTrace> trace;

  /// invalid_argument for out-of-range fields, or ok.
  [[nodiscard]] Status validate() const;
};

/// Predicts transfer times from finished transfers. One instance is not thread-safe;
/// share estimates between threads through EstimatorSet.
///
/// Built-in estimators predict seconds = bytes x (estimated seconds per byte) and
/// uncertainty = bytes x (standard deviation of the seconds per byte of the last
/// `window` samples; 0 with fewer than two). Observed times include the link's
/// latency, so predictions do too.
class Estimator {
 public:
  virtual ~Estimator() = default;

  /// Records a finished transfer of `bytes` that started at `start_s` and ended at
  /// `end_s`. Errors (the estimator is unchanged): invalid_argument for zero bytes,
  /// negative or non-finite times, or end_s <= start_s.
  virtual Status observe(uint64_t bytes, double start_s, double end_s) = 0;

  /// Predicts a transfer of `bytes` starting at `start_s` (only time-aware estimators
  /// such as "oracle" use the start; a negative start means "right after the last
  /// observed transfer"). Errors: invalid_argument for zero bytes; unavailable when
  /// nothing was observed and there is no prior.
  [[nodiscard]] virtual Result<Prediction> predict_at(uint64_t bytes, double start_s) const = 0;

  /// predict_at(bytes, -1): the next transfer, whenever it starts.
  [[nodiscard]] Result<Prediction> predict(uint64_t bytes) const { return predict_at(bytes, -1.0); }

  /// The name it was registered under ("last", "ewma", ...).
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  /// Transfers observed so far.
  [[nodiscard]] virtual uint64_t observations() const noexcept = 0;
};

/// Makes an estimator from options; returns an error for options it cannot use.
using EstimatorFactory = std::function<Result<std::unique_ptr<Estimator>>(const EstimatorOptions&)>;

/// Estimators by name. Thread-safe. A new registry holds the built-ins:
///  "last"       the last transfer's throughput (CacheGen's estimator);
///  "ewma"       exponentially weighted moving average of seconds per byte (the
///               inverse throughput: follows drops faster than an average of
///               throughputs and errs on the slow side), weight `alpha`;
///  "harmonic"   harmonic mean of the last `window` throughputs;
///  "percentile" the `percentile` low percentile of the last `window` throughputs
///               (linear interpolation; conservative);
///  "oracle"     the true transfer time read from `trace` (evaluation only; needs
///               options.trace; uncertainty 0).
class EstimatorRegistry {
 public:
  EstimatorRegistry();  ///< with the built-ins registered
  EstimatorRegistry(const EstimatorRegistry&) = delete;
  EstimatorRegistry& operator=(const EstimatorRegistry&) = delete;

  /// The process-wide registry used by the free functions below.
  static EstimatorRegistry& global();

  /// Adds `factory` under `name`. Errors: invalid_argument for an empty name or an
  /// empty factory; already_exists when the name is taken (built-ins included).
  Status add(std::string name, EstimatorFactory factory);
  /// Makes the estimator registered as `name`. Errors: not_found (the message lists
  /// the known names); the factory's own errors (e.g. invalid_argument for options).
  [[nodiscard]] Result<std::unique_ptr<Estimator>> make(std::string_view name,
                                                        const EstimatorOptions& options = {}) const;
  /// Whether `name` is registered.
  [[nodiscard]] bool contains(std::string_view name) const;
  /// Registered names, sorted.
  [[nodiscard]] std::vector<std::string> names() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

/// EstimatorRegistry::global().add(name, factory).
Status register_estimator(std::string name, EstimatorFactory factory);
/// EstimatorRegistry::global().make(name, options).
Result<std::unique_ptr<Estimator>> make_estimator(std::string_view name, const EstimatorOptions& options = {});

/// One estimator per peer (storage node), made on first use from one registered name
/// and options, shared by every fetch from that peer. All calls are thread-safe.
class EstimatorSet {
 public:
  /// Checks once that `name` makes an estimator with `options` (errors as
  /// EstimatorRegistry::make). The registry must outlive the set.
  static Result<std::unique_ptr<EstimatorSet>> create(std::string name, EstimatorOptions options = {},
                                                      const EstimatorRegistry& registry = EstimatorRegistry::global());
  ~EstimatorSet();

  /// Estimator::observe on `peer`'s estimator (made if new). Errors as observe(), and
  /// invalid_argument for an empty peer name.
  Status observe(std::string_view peer, uint64_t bytes, double start_s, double end_s);
  /// Estimator::predict_at on `peer`'s estimator; a peer never observed gets a fresh
  /// estimator's answer (the prior, or unavailable).
  [[nodiscard]] Result<Prediction> predict_at(std::string_view peer, uint64_t bytes, double start_s) const;
  /// predict_at(peer, bytes, -1).
  [[nodiscard]] Result<Prediction> predict(std::string_view peer, uint64_t bytes) const {
    return predict_at(peer, bytes, -1.0);
  }
  /// Calls `fn` with `peer`'s estimator under that peer's lock (e.g. to run a chooser
  /// on a consistent estimate). Do not keep the reference. Errors: invalid_argument for
  /// an empty peer name; the factory's errors.
  Status with(std::string_view peer, const std::function<void(Estimator&)>& fn);
  /// Peers seen so far, sorted.
  [[nodiscard]] std::vector<std::string> peers() const;
  /// The estimator name every peer uses.
  [[nodiscard]] const std::string& estimator_name() const noexcept;

 private:
  struct Impl;
  explicit EstimatorSet(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---- Level choosers -----------------------------------------------------------------

/// What the chooser knows of a context before fetching it.
/// Most decode workers a ContextCosts may declare.
inline constexpr uint32_t kMaxDecodeWorkers = 16;

struct ContextCosts {
  /// level_bytes[c][l]: stored size of level l of chunk c. Every chunk has the same
  /// number of levels (>= 1) and every size is > 0. A "level" is any option a chunk
  /// can be fetched at: a progressive chunk may offer every prefix of its stream
  /// (hundreds: each refinement group's end), finest first, each with its own loss
  /// in chunk_level_quality_loss.
  std::vector<std::vector<uint64_t>> level_bytes;
  /// decode_seconds[c][l]: measured decode time of level l of chunk c. Empty: 0
  /// everywhere; otherwise the same shape as level_bytes, values >= 0.
  std::vector<std::vector<double>> decode_seconds;
  /// level_quality_loss[l]: quality lost by level l (lower is better, e.g. perplexity
  /// increase in %). One per level, finite.
  std::vector<double> level_quality_loss;
  /// chunk_level_quality_loss[c][l]: chunk c's own quality loss at level l, where the
  /// store knows it (a progressive chunk's measured distortion, scaled by the
  /// profile's calibration); overrides level_quality_loss for that chunk. Empty: the
  /// profile's for every chunk; otherwise one row per chunk, each of levels() finite
  /// values.
  std::vector<std::vector<double>> chunk_level_quality_loss;
  /// tokens[c]: tokens of chunk c, for recompute. Empty when recompute is off.
  std::vector<uint64_t> tokens;
  /// The runtime's prefill rate for text chunks (tokens/s); 0: text is not an option.
  double recompute_tokens_per_second = 0;
  /// Quality lost by a recomputed chunk (normally 0: it is exact).
  double text_quality_loss = 0;
  /// Decoders working side by side (the pipeline's decode threads), 1..kMaxDecodeWorkers.
  /// Each chunk decodes on one of them; decode_seconds is a chunk's time while the
  /// others are busy too. A single chunk then takes its whole decode time, however
  /// many workers there are, while a long context is drained `decode_workers` times
  /// faster: one serial stage with the time divided would get the first case wrong.
  uint32_t decode_workers = 1;

  [[nodiscard]] uint32_t chunks() const noexcept { return uint32_t(level_bytes.size()); }
  [[nodiscard]] uint32_t levels() const noexcept { return uint32_t(level_quality_loss.size()); }
  [[nodiscard]] bool text_allowed() const noexcept { return recompute_tokens_per_second > 0; }
  /// Quality lost by chunk c at level l (its own, else the profile's).
  [[nodiscard]] double loss(uint32_t c, uint32_t l) const {
    return chunk_level_quality_loss.empty() ? level_quality_loss[l] : chunk_level_quality_loss[c][l];
  }
  /// invalid_argument naming the first inconsistency, or ok.
  [[nodiscard]] Status validate() const;
};

/// Where the fetch stands when chunk `chunk` is about to be requested.
struct ChooseState {
  uint32_t chunk = 0;            ///< index of the chunk to decide
  double now_s = -1;             ///< when its transfer would start (for time-aware estimators; <0: unknown)
  double time_left_s = 0;        ///< from now to the deadline (may be <= 0: already late)
  double decode_backlog_s = 0;   ///< from now until the decode stage is free (>= 0)
  /// With several decode workers: from now until each is free (each >= 0; its size
  /// is decode_workers). Empty: every worker is free after decode_backlog_s.
  std::vector<double> decode_worker_backlog_s;
  /// From now until the transfers already requested have landed (>= 0): the pipeline
  /// decides a chunk while earlier ones are still on the wire, and this chunk's bytes
  /// flow only after theirs.
  double wire_backlog_s = 0;
  /// From now until the runtime's recompute lane (its prefill of text chunks) is free (>= 0).
  double recompute_backlog_s = 0;
};

/// A chooser's answer for one chunk.
struct Choice {
  enum class Action : uint8_t { fetch, recompute } action = Action::fetch;
  uint32_t level = 0;               ///< the level to fetch (meaningless for recompute)
  /// True when the choice (with the reserve for the remaining chunks, for "deadline";
  /// within the equal share, for "paper") is predicted to meet the deadline. False:
  /// nothing fits and this is the fastest option (see `note`).
  bool fits = true;
  double quality_loss = 0;          ///< the chosen option's quality loss
  double predicted_seconds = 0;     ///< predicted time from now until this chunk is decoded
  double predicted_total_seconds = 0;  ///< ... until every chunk is ("deadline"); = predicted_seconds for "paper"
  std::string note;                 ///< why, in a few words ("best fit", "nothing fits: fastest", ...)

  [[nodiscard]] bool recompute() const noexcept { return action == Action::recompute; }
};

/// Settings of the built-in choosers.
struct ChooserOptions {
  /// "deadline": conservative time = seconds + k x uncertainty_seconds (k >= 0).
  double k = 1.0;
  /// Never choose an option whose quality loss exceeds this, even when late.
  std::optional<double> max_quality_loss;
  /// "deadline": the reserve's transfer times are multiplied by this (>= 1), a hedge
  /// against the link slowing down before the remaining chunks are fetched (1: trust
  /// the prediction). Default 2: in the mini-study (tests/policy) it cut violations
  /// and, by recomputing more chunks in parallel with the wire, also quality loss.
  double reserve_factor = 2.0;
  /// "deadline": how much of the slack (time left minus the cheapest completion) the
  /// current chunk may spend above its own cheapest option: 0 = an equal share,
  /// slack / chunks left (this one included); 1 = all of it (greedy); in between, that
  /// fraction.
  double slack_share = 0.0;
  /// "deadline", when nothing fits (the deadline is already lost, or is "now": a fetch
  /// that wants its first token soonest): false = the option that puts chunk c in
  /// memory soonest; true = the option whose plan (this chunk, then the reserve)
  /// completes the whole context soonest, ties: text (it then runs as a prefix, beside
  /// the link, not after a fetched chunk it would wait for), then the chunk in memory
  /// sooner, then the lower loss. The first token needs every chunk, so this is the rule for time to
  /// first token: chunk by chunk "soonest in memory" recomputes one text chunk at most
  /// (the second would land after a fetched one), where the soonest plan recomputes as
  /// long a prefix as the fetched suffix takes.
  bool late_completes_context = false;
};

/// Picks the level (or recompute) of the next chunk.
class Chooser {
 public:
  virtual ~Chooser() = default;
  /// Decides chunk `state.chunk` of `costs` using `estimator`'s predictions. Errors:
  /// invalid_argument (inconsistent costs, chunk out of range, negative backlog,
  /// non-finite times); invalid_argument when the quality floor rules out every option;
  /// the estimator's errors other than `unavailable` (with no estimate at all, the
  /// chooser picks the smallest option and says so: fits = false).
  [[nodiscard]] virtual Result<Choice> choose(const ContextCosts& costs, const ChooseState& state,
                                              const Estimator& estimator) const = 0;
  /// "deadline" or "paper".
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
};

/// Our chooser. For the chunk c to decide, each option o (every level, and text when
/// allowed; options worse than max_quality_loss are dropped) is costed on three lanes
/// that model the fetch, all relative to now:
///   wire:   transfers one after another, free at wire_backlog_s;
///   decode: chunk i decodes while i+1 transfers, free at decode_backlog_s;
///   text:   the runtime's prefill of text chunks, one after another, free at
///           recompute_backlog_s. It runs beside the wire and the decoder (the
///           runtime's GPU), but a text chunk's recompute attends to the KV of every
///           chunk before it, so it starts only once those are in memory.
/// For a level l:  wire_end += conservative transfer time of level_bytes[c][l]
///                             (= seconds + k x uncertainty_seconds),
///                 decode_free = max(wire_end, decode_free) + decode_seconds[c][l].
/// For text:       text_free = max(text_free, decode_free) + tokens[c] / recompute rate.
/// The context is complete at max(decode_free, text_free). Then the reserve for the
/// later chunks: the split that completes the context soonest (ties: the one that
/// leaves less work on the lanes) of "chunks c+1 .. s-1 recomputed, s .. n-1 fetched,
/// each at the allowed level that frees the decoder soonest", its transfer times scaled
/// by ChooserOptions::reserve_factor. Text goes first in the reserve because a text
/// chunk after a fetched one would wait for its decode. Option o fits when that
/// completion is <= time_left_s. The chooser returns the fitting option with the
/// lowest quality loss (ties: the earliest completion), among those that also spend at
/// most the allowed part of the slack (see ChooserOptions::slack_share: the slack is
/// time_left_s minus the cheapest completion; an option spends its completion minus
/// the cheapest completion). When nothing fits with the hedged reserve it chooses the
/// same way with the reserve unhedged (the link keeps its predicted rate). When nothing
/// fits either way it returns the option that puts chunk c in memory soonest (or, with
/// ChooserOptions::late_completes_context, the one that completes the context
/// soonest), with fits = false.
/// The reserve considers, per later chunk, only the levels no other allowed level
/// beats on both bytes and decode time: with an estimator whose predictions grow with
/// the bytes (every built-in's do) that is the same reserve, and a chunk with hundreds
/// of prefixes costs what one with a few levels does.
/// With slack_share = 1 all slack may go to the current chunk; the default (0, an
/// equal share per remaining chunk) keeps slack for later chunks, which is what keeps
/// the deadline when the link slows down mid-fetch. Estimates are refreshed after
/// every transfer, so later chunks use the slack that was left.
class DeadlineChooser final : public Chooser {
 public:
  explicit DeadlineChooser(ChooserOptions options = {}) : options_(std::move(options)) {}
  [[nodiscard]] Result<Choice> choose(const ContextCosts& costs, const ChooseState& state,
                                      const Estimator& estimator) const override;
  [[nodiscard]] std::string_view name() const noexcept override { return "deadline"; }

 private:
  ChooserOptions options_;
};

/// CacheGen's chooser, for comparison: with n chunks left (this one included), the
/// share is time_left_s / n; it picks the best-quality level whose predicted transfer
/// (estimator seconds, no uncertainty, no decode time; with the "last" estimator this
/// is size / last throughput) fits the share. When no level fits: text if recompute is
/// faster than the smallest level, else the smallest level, with fits = false.
/// Honours max_quality_loss like DeadlineChooser; ignores k.
class PaperChooser final : public Chooser {
 public:
  explicit PaperChooser(ChooserOptions options = {}) : options_(std::move(options)) {}
  [[nodiscard]] Result<Choice> choose(const ContextCosts& costs, const ChooseState& state,
                                      const Estimator& estimator) const override;
  [[nodiscard]] std::string_view name() const noexcept override { return "paper"; }

 private:
  ChooserOptions options_;
};

/// Makes "deadline" or "paper". Errors: not_found for another name; invalid_argument
/// for options out of range (k < 0 or non-finite, non-finite quality floor).
Result<std::unique_ptr<Chooser>> make_chooser(std::string_view name, const ChooserOptions& options = {});

// ---- Refinement after the first token -------------------------------------------------

/// A chunk that was recomputed from text (or not fetched): never refined.
inline constexpr uint32_t kNotFetched = UINT32_MAX;

/// Which finer level each chunk of a fetched context moves to, and what that costs.
struct RefinementPlan {
  /// Per chunk: the level to refine to; its current level (or kNotFetched) when the
  /// plan leaves it.
  std::vector<uint32_t> level;
  uint32_t chunks_refined = 0;
  /// Bytes the plan moves: per refined chunk, level_bytes of the target minus those of
  /// the current level (a progressive chunk's levels are prefixes of one stream).
  uint64_t bytes = 0;
  /// Predicted time from now until every refined chunk is decoded again: transfers one
  /// after another (conservative, as the deadline chooser's: seconds + k x
  /// uncertainty), each chunk re-decoded at its target level on the first free decode
  /// worker once its bytes have landed.
  double predicted_seconds = 0;
  /// Mean quality loss over the fetched chunks, before and after.
  double quality_loss_before = 0, quality_loss_after = 0;
};

/// Plans a refinement of a context whose chunk c was fetched at level `current[c]`
/// (kNotFetched: recomputed): the upgrades that lower the context's quality loss the
/// most per second of transfer and decode, while the whole plan is predicted to take
/// at most `budget_s` (e.g. the time a runtime spends generating its first tokens, or
/// until a deadline for the refined KV). Greedy over each chunk's finer levels (any
/// prefix of a progressive chunk: every level of `costs` is one): it repeatedly takes
/// the move with the largest loss reduction per added second that still fits, so the
/// chunks that code worst are refined first. `k` weighs the predictions' uncertainty
/// as ChooserOptions::k does. Errors: invalid_argument (inconsistent costs, `current`
/// of the wrong size or naming a level out of range, budget negative or not finite, k
/// < 0); the estimator's errors (unavailable: nothing observed yet, no prior).
Result<RefinementPlan> plan_refinement(const ContextCosts& costs, std::span<const uint32_t> current,
                                       const Estimator& estimator, double budget_s, double k = 1.0);

// ---- Link simulator -----------------------------------------------------------------

/// One simulated fetch of a context over a traced link.
struct SimConfig {
  LinkTrace trace;
  ContextCosts costs;
  double start_s = 0;      ///< when the fetch starts (trace time)
  double deadline_s = 1;   ///< relative to start_s: every chunk decoded by start_s + deadline_s
};

/// What happened to one chunk (absolute trace times; for recompute, wire_start ==
/// wire_end == when it was decided and the decode times are its recompute).
struct SimChunk {
  Choice choice;
  uint64_t bytes = 0;                 ///< bytes transferred (0 for recompute)
  double wire_start_s = 0, wire_end_s = 0;
  double decode_start_s = 0, decode_end_s = 0;
};

/// The outcome of a simulated fetch.
struct SimResult {
  std::vector<SimChunk> chunks;
  double finish_s = 0;             ///< when the last chunk was in memory (decoded or recomputed), relative to start_s
  bool violated = false;           ///< finish_s > deadline_s
  double mean_quality_loss = 0;    ///< mean over chunks of the chosen option's loss
  uint32_t recomputed = 0;         ///< chunks sent as text
  uint32_t fallbacks = 0;          ///< chunks where the chooser said nothing fits
};

/// Deterministic simulation: chunks are requested one after another (chunk i+1's
/// request goes out when chunk i's bytes have landed; transfer times from the trace,
/// latency included); chunk i decodes on one decode stage while later chunks
/// transfer; a text chunk is recomputed on the runtime's recompute lane, one after
/// another, each starting once it is decided and every earlier chunk is in memory
/// (decoded or recomputed). finish_s is when the last chunk is in memory, on either
/// lane. Before each chunk the chooser decides with the real
/// `estimator`, which observes every finished transfer. Errors: invalid_argument for
/// an invalid trace or costs, negative/non-finite start or deadline <= 0; the
/// chooser's errors (with the chunk index).
Result<SimResult> simulate(const SimConfig& config, Estimator& estimator, const Chooser& chooser);

}  // namespace kvstream::policy
