// A fetch from the store: the stored prefix of a prompt stat'ed and planned
// (KvStore::plan), fetched at one level or adaptively through the scheduler
// (KvStore::fetch), waited for with its report, and refined after the first token
// (StoreFetch::refine, refine_within).
#include <algorithm>
#include <future>
#include <optional>
#include <system_error>

#include <fmt/format.h>

#include "core/log.hpp"
#include "kvstream/kv_store.hpp"
#include "kvstream/policy.hpp"
#include "store/kv_store_impl.hpp"

namespace kvstream {

struct StoreFetch::State {
  std::shared_ptr<KvStore::Impl> store;  // keeps the pipeline alive while this runs
  std::shared_ptr<pipeline::Fetch> fetch;     // a fixed-level fetch
  std::shared_ptr<pipeline::Ticket> ticket;   // an adaptive one, through the scheduler
  std::vector<TokenRange> ranges;
  transport::CancelToken cancel;
  // FetchOptions::keep_for_refinement: the request (without its sizes) and, after
  // wait(), the bytes of each chunk.
  std::optional<pipeline::FetchRequest> refinable;
  std::vector<std::vector<double>> chunk_loss;  // each chunk's own loss per level (empty: the profile's)
  std::vector<std::vector<uint8_t>> kept;
  bool waited = false;
  // The fetch's chunks being marked used (KvStore::Impl::mark_used), beside the
  // transfer; its destructor waits for it (bounded by the fetch's deadline).
  std::future<void> marking;
  // A placeholder until wait() sets it: built without make_status, which would log an
  // internal error for every fetch.
  Result<FetchReport> result = Status(StatusCode::internal, "not waited");
};

StoreFetch::StoreFetch(std::shared_ptr<State> s) : s_(std::move(s)) {}
StoreFetch::StoreFetch(StoreFetch&&) noexcept = default;
StoreFetch& StoreFetch::operator=(StoreFetch&&) noexcept = default;
StoreFetch::~StoreFetch() {
  if (s_ && !s_->waited) {
    cancel();
    (void)wait();
  }
}

uint64_t StoreFetch::tokens() const noexcept { return s_ && !s_->ranges.empty() ? s_->ranges.back().end : 0; }

void StoreFetch::cancel() {
  if (!s_) return;
  s_->cancel.cancel();
  if (s_->ticket) s_->ticket->cancel();
  if (s_->fetch) s_->fetch->cancel();
}

Result<FetchReport> StoreFetch::wait() {
  if (!s_) return make_status(StatusCode::invalid_argument, "wait on an empty fetch handle");
  State& s = *s_;
  if (s.waited) return s.result;
  const Status st = s.ticket ? s.ticket->wait() : s.fetch->wait();
  if (s.refinable) s.kept = s.ticket ? s.ticket->take_kept_bytes() : s.fetch->take_kept_bytes();
  FetchReport r;
  r.chunks = s.ticket ? s.ticket->timings() : s.fetch->timings();
  uint32_t fetched = 0;
  for (const auto& t : r.chunks) {
    if (t.chunk >= s.ranges.size()) continue;
    const TokenRange range = s.ranges[t.chunk];
    if (t.decision.action == pipeline::ChunkDecision::Action::recompute) {
      if (!r.recompute.empty() && r.recompute.back().end == range.begin)
        r.recompute.back().end = range.end;
      else
        r.recompute.push_back(range);
      continue;
    }
    r.bytes += t.bytes;
    const double loss = t.chunk < s.chunk_loss.size() && t.decision.level < s.chunk_loss[t.chunk].size()
                            ? s.chunk_loss[t.chunk][t.decision.level]
                            : s.store->level_loss(t.decision.level);
    r.mean_quality_loss_pct += loss;
    r.max_quality_loss_pct = std::max(r.max_quality_loss_pct, loss);
    ++fetched;
  }
  if (fetched) r.mean_quality_loss_pct /= fetched;
  r.tokens = s.ranges.empty() ? 0 : s.ranges.back().end;
  s.waited = true;
  s.result = st.ok() ? Result<FetchReport>(std::move(r)) : Result<FetchReport>(st);
  return s.result;
}

namespace {

// The request for the stored prefix (at most max_tokens) of `keys`.
struct Prepared {
  pipeline::FetchRequest request;
  std::vector<uint64_t> chunk_tokens;
  std::vector<std::vector<double>> chunk_loss;  // per chunk and level (empty: the profile's)
};

}  // namespace

static Result<Prepared> prepare(KvStore::Impl& m, std::span<const Token> tokens, transport::Deadline deadline,
                                const FetchOptions& o) {
  auto keys = m.keyer.keys(tokens);
  const uint32_t ct = m.keyer.chunk_tokens();
  if (o.max_tokens > 0 && keys.size() > o.max_tokens / ct) keys.resize(o.max_tokens / ct);
  KVS_ASSIGN_OR_RETURN(auto sizes, m.stat_chunks(keys, false, deadline, o.cancel, /*reuse=*/true));
  if (sizes.empty()) return make_status(StatusCode::not_found, "no chunk of these tokens is stored");
  Prepared p;
  pipeline::FetchRequest& req = p.request;
  req.context = keys[0];  // names the fetch in messages
  for (size_t c = 0; c < sizes.size(); ++c) {
    req.chunks.push_back({uint64_t(c) * ct, uint64_t(c + 1) * ct});
    req.stored_contexts.push_back(keys[c]);
    req.stored_chunks.push_back(store::kLevelsChunk);
    p.chunk_tokens.push_back(ct);
  }
  req.level_bytes = std::move(sizes);
  req.deadline = deadline;
  req.cancel = o.cancel;
  keys.resize(req.chunks.size());
  p.chunk_loss = m.chunk_losses(keys);
  return p;
}

Result<FetchPlan> KvStore::plan(std::span<const Token> tokens, transport::Deadline deadline,
                                const FetchOptions& options) {
  KVS_ASSIGN_OR_RETURN(Prepared p, prepare(*impl_, tokens, deadline, options));
  pipeline::ScheduledFetch sf;
  sf.request = std::move(p.request);
  sf.priority = options.priority;
  if (impl_->plan.recompute_tokens_per_second > 0) sf.chunk_tokens = p.chunk_tokens;
  sf.chunk_level_quality_loss = std::move(p.chunk_loss);
  KVS_ASSIGN_OR_RETURN(pipeline::Admission a, impl_->scheduler->predict(sf));
  FetchPlan out;
  out.tokens = sf.request.chunks.back().end;
  out.fits = a.fits;
  out.predicted_seconds = a.predicted_seconds;
  out.mean_quality_loss_pct = a.mean_quality_loss;
  out.recompute_chunks = a.recompute_chunks;
  out.decisions = std::move(a.plan);
  return out;
}

Result<StoreFetch> KvStore::fetch(std::span<const Token> tokens, const FetchDestination& destination,
                                  transport::Deadline deadline, FetchOptions options) {
  Impl& m = *impl_;
  KVS_ASSIGN_OR_RETURN(Prepared p, prepare(m, tokens, deadline, options));
  pipeline::FetchRequest& req = p.request;
  std::vector<std::string> marked = req.stored_contexts;  // the stored prefix, from its first chunk
  req.deadline = deadline + options.grace;
  const uint64_t n = req.chunks.back().end;
  // Checked here, not only by the pipeline: an adaptive fetch starts from the
  // scheduler's thread, where a refusal would reach the caller only at wait().
  const bool on_device = destination.device_view.tokens() > 0;
  if (int(destination.host.tokens() > 0) + int(on_device) + int(!destination.device.empty()) > 1)
    return make_status(StatusCode::invalid_argument, "fetch: give one destination (host, device_view or device)");
  auto needs_gpu = [&]() -> Status {
    if (m.pipe->decodes_on() != pipeline::DecodeOn::gpu)
      return make_status(StatusCode::invalid_argument,
                         "fetch: device memory needs a store that decodes on the GPU (pipeline.decode gpu or auto "
                         "with a usable GPU); this one decodes on the CPU");
    return {};
  };
  if (destination.device.empty()) {
    const KvView& view = on_device ? destination.device_view : destination.host;
    if (on_device) KVS_RETURN_IF_ERROR(needs_gpu());
    if (!(view.geometry() == m.profile.geometry()))
      return make_status(StatusCode::invalid_argument, "fetch: the destination's geometry is not the profile's");
    if (view.tokens() < n)
      return make_status(StatusCode::invalid_argument, "fetch: {} stored tokens, the destination holds {}", n,
                         view.tokens());
    if (view.first_position() != 0)
      return make_status(StatusCode::invalid_argument, "fetch: the destination must start at position 0");
    req.destination = view;
    req.destination_memory = on_device ? transport::MemoryType::cuda : transport::MemoryType::host;
  } else {
    KVS_RETURN_IF_ERROR(needs_gpu());
    if (destination.device.chunks.size() < req.chunks.size())
      return make_status(StatusCode::invalid_argument, "fetch: {} chunks stored, {} device pointers given",
                         req.chunks.size(), destination.device.chunks.size());
    req.device = destination.device;
    req.device.chunks.resize(req.chunks.size());
  }
  auto s = std::make_shared<StoreFetch::State>();
  s->store = impl_;
  s->ranges = req.chunks;
  s->cancel = options.cancel;
  s->chunk_loss = p.chunk_loss;
  if (options.keep_for_refinement) {
    req.keep_bytes = true;
    s->refinable = req;
    s->refinable->level_bytes.clear();
  }
  if (options.level) {
    const uint32_t level = *options.level;
    if (level >= m.profile.levels())
      return make_status(StatusCode::invalid_argument, "fetch: level {} (the profile has {})", level,
                         m.profile.levels());
    pipeline::FetchCallbacks cb;
    cb.decide = [level](uint32_t, std::span<const uint64_t>) {
      return pipeline::ChunkDecision{pipeline::ChunkDecision::Action::fetch, level};
    };
    cb.on_chunk = std::move(options.on_chunk);
    KVS_ASSIGN_OR_RETURN(s->fetch, m.pipe->fetch(std::move(req), std::move(cb)));
  } else {
    pipeline::ScheduledFetch sf;
    sf.request = std::move(req);
    sf.priority = options.priority;
    sf.target = deadline;
    if (m.plan.recompute_tokens_per_second > 0) sf.chunk_tokens = std::move(p.chunk_tokens);
    sf.chunk_level_quality_loss = std::move(p.chunk_loss);
    sf.on_chunk = std::move(options.on_chunk);
    KVS_ASSIGN_OR_RETURN(s->ticket, m.scheduler->submit(std::move(sf)));
  }
  // Off the caller's path: the mark is one small request, and the runtime waits for
  // the chunks, not for it. Cancelling the fetch ends it too. A storage known to keep
  // no marks costs no thread.
  if (!m.marks_unsupported.load(std::memory_order_relaxed)) {
    try {
      s->marking = std::async(std::launch::async, [store = impl_, keys = std::move(marked), deadline,
                                                   cancel = options.cancel] { store->mark_used(keys, deadline, cancel); });
    } catch (const std::system_error&) {
      KVS_LOG_DEBUG("kvstore: no thread to mark a fetch's chunks used; they keep their older marks");
    }
  }
  return StoreFetch(std::move(s));
}

static Result<pipeline::RefineReport> refine_to(StoreFetch::State& s, uint32_t level, std::vector<uint32_t> levels,
                                                transport::Deadline deadline) {
  pipeline::RefineRequest rq;
  rq.fetch = *s.refinable;
  rq.fetch.deadline = deadline;
  rq.fetch.cancel = s.cancel;
  rq.kept = std::move(s.kept);
  rq.kept.resize(rq.fetch.chunks.size());
  rq.level = level;
  rq.levels = std::move(levels);
  rq.decode_threads = s.store->cfg.pipeline.decode_threads;
  rq.gpu_device = s.store->cfg.pipeline.gpu_device;
  auto report = pipeline::refine_fetch(*s.store->client, s.store->profile, rq);
  s.kept = std::move(rq.kept);  // grown by what landed, for a later refinement
  return report;
}

static Status check_refinable(const std::shared_ptr<StoreFetch::State>& s) {
  if (!s || !s->waited || !s->result.ok())
    return make_status(StatusCode::invalid_argument, "refine: the fetch has not been waited for, or failed");
  if (!s->refinable) return make_status(StatusCode::invalid_argument, "refine: fetched without keep_for_refinement");
  return {};
}

Result<pipeline::RefineReport> StoreFetch::refine(uint32_t level, transport::Deadline deadline) {
  KVS_RETURN_IF_ERROR(check_refinable(s_));
  return refine_to(*s_, level, {}, deadline);
}

Result<pipeline::RefineReport> StoreFetch::refine_within(std::chrono::duration<double> budget,
                                                         transport::Deadline deadline) {
  KVS_RETURN_IF_ERROR(check_refinable(s_));
  State& s = *s_;
  KvStore::Impl& m = *s.store;
  if (!m.profile.progressive()) return make_status(StatusCode::invalid_argument, "refine: the profile is not progressive");
  // Each chunk's levels as stored, its own losses, and the level its kept prefix is at.
  KVS_ASSIGN_OR_RETURN(const auto sizes, pipeline::range_level_bytes(*m.client, *s.refinable, true));
  // The fetch's costs without text: a recomputed chunk is not refined.
  const policy::ContextCosts costs = pipeline::plan_costs(m.plan, sizes, s.chunk_loss, {});
  std::vector<uint32_t> current(sizes.size(), policy::kNotFetched);
  for (size_t c = 0; c < sizes.size() && c < s.kept.size(); ++c)
    for (uint32_t l = 0; l < sizes[c].size(); ++l)
      if (!s.kept[c].empty() && sizes[c][l] == s.kept[c].size()) current[c] = l;
  Result<policy::RefinementPlan> plan = Status(StatusCode::internal, "refinement not planned");  // set below
  KVS_RETURN_IF_ERROR(m.plan.estimators->with(m.plan.peer, [&](policy::Estimator& e) {
    plan = policy::plan_refinement(costs, current, e, budget.count());
  }));
  if (!plan.ok()) return plan.status().with_context("refine_within");
  return refine_to(s, 0, std::move(plan->level), deadline);
}

}  // namespace kvstream
