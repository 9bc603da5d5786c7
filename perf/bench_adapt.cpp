// kvstream-bench adapt: the level chooser on a real link whose rate changes (perf/adapt/
// run.sh shapes it with tc tbf and drives the rate from a trace). Every configuration
// (each fixed level, text only, 8-bit quantized KV, the paper's last-chunk estimator
// with the paper's chooser, ours with each estimator) fetches the same context in
// turn, round after round, so all of them see the same link over the run. Reported
// per configuration and deadline: deadline violations, mean quality loss, mean and
// p99 time to first token.
//
// Time to first token of a request = when its last chunk is in memory: fetched and
// decoded, or recomputed by the runtime (prefill at --prefill-tokens-per-s on the GPU,
// beside the fetch, one text chunk after another, each once it is decided and every
// earlier chunk is in memory, since its attention needs their KV). A request still running at
// --cap times its deadline is cancelled and counted at the cap (a violation).
// Every finished transfer, of any configuration, feeds every estimator: a runtime's
// estimator sees all traffic to its peer.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <numeric>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "examples/tinyllama/eval_harness.hpp"
#include "kvstream/adaptive_fetch.hpp"
#include "kvstream/pipeline.hpp"
#include "perf/assembled_kv.hpp"
#include "perf/bench.hpp"
#include "perf/int8_kv.hpp"

namespace kvstream::bench {

using namespace std::chrono_literals;
using transport::Clock;
using transport::deadline_in;

namespace {

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Config {
  std::string name;
  enum class Kind { fixed, text, int8, adaptive } kind = Kind::fixed;
  uint32_t level = 0;
  std::string chooser, estimator;
  // Adaptive over every prefix of a progressive chunk (not only whole levels).
  bool prefixes = false;
};

struct Outcome {
  double start_wall = 0;   // realtime, for lining up with the rate trace
  double ttft_s = 0;
  bool violated = false;
  bool capped = false;
  double quality_loss = 0;  // mean over chunks
  uint64_t bytes = 0;
  uint32_t text_chunks = 0;
  double delivered_bps = 0;  // bytes over the wire time of this request
  std::vector<int> levels;   // per chunk, -1 = text
  std::string error;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double idx = p * double(v.size() - 1);
  const auto lo = size_t(std::floor(idx)), hi = size_t(std::ceil(idx));
  return v[lo] + (v[hi] - v[lo]) * (idx - double(lo));
}

}  // namespace

int run_adapt_bench(const AdaptBenchOptions& o) {
  const Fail fail{"adapt"};
  // Quality per level: the perplexity increase tinyllama measured at the same level
  // steps (the assembled cache has no model to score it; the levels share steps).
  auto qprof = codec::Profile::load_file(o.quality_profile);
  if (!qprof.ok())
    return fail(qprof.status().with_context(
        fmt::format("quality profile '{}' (make demo or kvstream-profile writes it)", o.quality_profile)));
  auto setup = assemble_setup(o.geometry, o.tokens, o.data, 1024, &*qprof);
  if (!setup.ok()) return fail(setup.status());
  const codec::Profile* profile = &setup->profile;
  KvCache* ctx = &setup->context;
  const uint32_t levels = profile->levels();
  std::vector<double> quality(levels, 0.0);
  for (uint32_t L = 0; L < levels; ++L) {
    if (L >= qprof->levels() || qprof->level(L).kl_nats < 0)  // KL >= 0 whenever measured
      return fail(make_status(StatusCode::invalid_argument, "quality profile has no measured quality for level {}", L));
    quality[L] = std::max(0.0, qprof->level(L).ppl_increase_pct);
  }

  // Encode every level of every chunk, and the 8-bit baseline.
  const auto ranges = codec::chunk_ranges(o.tokens, o.chunk_tokens);
  const auto nchunks = uint32_t(ranges.size());
  std::vector<std::vector<std::vector<uint8_t>>> enc(nchunks, std::vector<std::vector<uint8_t>>(levels));
  std::vector<std::vector<uint8_t>> int8(nchunks);
  uint64_t max_chunk = 0, int8_max = 0;
  for (uint32_t i = 0; i < nchunks; ++i) {
    for (uint32_t L = 0; L < levels; ++L) {
      if (profile->progressive() && L > 0) {
        // A progressive level is a prefix of level 0's stream: cut, not encoded again.
        auto ps = codec::chunk_prefixes(enc[i][0]);
        if (!ps.ok()) return fail(ps.status());
        for (const codec::ChunkPrefix& p : *ps)
          if (p.whole_layer && p.level == L) enc[i][L].assign(enc[i][0].begin(), enc[i][0].begin() + int64_t(p.end));
      } else if (Status s = codec::encode_chunk(*profile, *ctx->view().slice(ranges[i]), L,
                                                {codec::recent_tokens_of(*profile, ranges[i], o.tokens)}, enc[i][L]);
                 !s.ok()) {
        return fail(s);
      }
      max_chunk = std::max<uint64_t>(max_chunk, enc[i][L].size());
    }
    int8[i] = quantize_int8(*ctx->view().slice(ranges[i]));
    int8_max = std::max<uint64_t>(int8_max, int8[i].size());
  }
  // Decode cost per level, measured (seconds per encoded byte).
  auto dest = KvCache::create(setup->geometry, DType::f16, o.tokens);
  if (!dest.ok()) return fail(dest.status());
  std::vector<double> decode_spb(levels);
  codec::DecodeScratch scratch;
  for (uint32_t L = 0; L < levels; ++L) {
    double best = 1e300;
    for (int rep = 0; rep < 3; ++rep) {  // best of three: first-use allocations are not a decode cost
      const auto t0 = Clock::now();
      if (Status s = codec::decode_chunk(*profile, enc[0][L], *dest->view().slice(ranges[0]), &scratch); !s.ok())
        return fail(s);
      best = std::min(best, since(t0));
    }
    decode_spb[L] = best / double(enc[0][L].size());
  }
  fmt::print(stderr, "{} x {} tokens: {} chunks; level bytes per chunk {}..{}; int8 {} bytes per chunk; decode "
             "{:.3f}..{:.3f} s per chunk\n",
             o.geometry, o.tokens, nchunks, enc[0][levels - 1].size(), enc[0][0].size(), int8[0].size(),
             decode_spb[levels - 1] * double(enc[0][levels - 1].size()), decode_spb[0] * double(enc[0][0].size()));

  // The storage node (external: the far side of the shaped link).
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("kvstream-adapt-{}", ::getpid());
  auto node = open_bench_node(o.server, "tcp", o.secret, dir.string());
  if (!node.ok()) return fail(node.status());
  std::unique_ptr<storage::Server> server = std::move(node->server);
  const storage::ClientConfig cc = node->client;
  auto client = storage::Client::connect(cc, deadline_in(10s));
  if (!client.ok()) return fail(client.status());
  // Progressive: each chunk's every prefix (finest first) with its own quality loss,
  // the options of the "any prefix" configurations. A prefix's loss is its measured
  // distortion times the loss per unit of distortion of the whole levels around it
  // (interpolated in distortion; a whole level's own: the quality profile's loss of
  // the level over the profile's mean distortion there).
  std::vector<std::vector<uint64_t>> prefix_bytes(nchunks);
  std::vector<std::vector<double>> prefix_loss(nchunks), prefix_spb(nchunks);
  std::vector<std::vector<codec::ChunkPrefix>> prefixes(nchunks);  // coarsest first, as the header lists them
  for (uint32_t i = 0; i < nchunks && profile->progressive(); ++i) {
    auto ps = codec::chunk_prefixes(enc[i][0]);
    if (!ps.ok()) return fail(ps.status());
    prefixes[i] = std::move(ps).value();
    for (size_t j = prefixes[i].size(); j-- > 0;) {  // finest first
      const codec::ChunkPrefix& p = prefixes[i][j];
      // The context's last chunk alone has recent rows, and with them the prefixes that
      // refine those rows only: the chooser wants the same options for every chunk.
      if (p.recent_only) continue;
      const uint32_t toward = p.whole_layer ? p.level : p.level - 1;
      auto per_unit = [&](uint32_t L) {
        const double d = profile->level(L).distortion;
        return d > 0 ? quality[L] / d : 0.0;
      };
      double k = per_unit(toward);
      if (!p.whole_layer) {
        const double d0 = profile->level(p.level).distortion, d1 = profile->level(toward).distortion;
        const double w = d0 > d1 ? std::clamp((d0 - p.distortion) / (d0 - d1), 0.0, 1.0) : 1.0;
        k = (1 - w) * per_unit(p.level) + w * k;
      }
      prefix_bytes[i].push_back(p.end);
      prefix_loss[i].push_back(k * p.distortion);
      prefix_spb[i].push_back(decode_spb[toward]);  // that of the level it refines towards (conservative)
    }
  }
  for (uint32_t i = 0; i < nchunks; ++i) {
    if (profile->progressive()) {
      // One stream per chunk; its parts are every prefix when the table holds them
      // (KvStore stores the whole levels' ends only).
      std::vector<storage::ObjectPart> parts;
      const bool all = prefixes[i].size() <= storage::kMaxObjectParts;
      for (const codec::ChunkPrefix& p : prefixes[i])
        if (all || p.whole_layer) parts.push_back({p.end, p.distortion});
      if (Status s = (*client)->put_parts("adapt-ctx", i, 0, std::as_bytes(std::span(enc[i][0])), parts, 0,
                                          deadline_in(120s));
          !s.ok())
        return fail(s);
    }
    for (uint32_t L = 0; L < (profile->progressive() ? 0 : levels); ++L)
      if (Status s = (*client)->put("adapt-ctx", i, L, std::as_bytes(std::span(enc[i][L])), deadline_in(120s)); !s.ok())
        return fail(s);
    if (Status s = (*client)->put("adapt-int8", i, 0, std::as_bytes(std::span(int8[i])), deadline_in(120s)); !s.ok())
      return fail(s);
  }
  // Whole levels (every configuration but "any prefix"): as stored for single-level
  // profiles; a progressive chunk's whole-layer prefix ends, what a level-L fetch reads.
  std::vector<std::vector<uint64_t>> level_bytes(nchunks);
  if (profile->progressive()) {
    for (uint32_t i = 0; i < nchunks; ++i)
      for (uint32_t L = 0; L < levels; ++L) level_bytes[i].push_back(enc[i][L].size());
  } else {
    auto stats = (*client)->stat("adapt-ctx", deadline_in(10s));
    if (!stats.ok()) return fail(stats.status());
    for (const auto& st : *stats) level_bytes[st.chunk] = pipeline::stored_level_bytes(st, false);
  }

  pipeline::PipelineConfig pc;
  pc.depth = o.depth;
  pc.max_chunk_bytes = std::max(max_chunk, int8_max);
  pc.decode_threads = o.decode_threads;
  auto pipe = pipeline::Pipeline::create(**client, *profile, pc);
  if (!pipe.ok()) return fail(pipe.status());

  // Estimators, one set per kind, every one fed by every transfer.
  std::map<std::string, std::shared_ptr<policy::EstimatorSet>> estimators;
  for (const char* name : {"last", "ewma", "harmonic", "percentile"}) {
    policy::EstimatorOptions eo;
    eo.prior_bits_per_second = 1e9;
    auto set = policy::EstimatorSet::create(name, eo);
    if (!set.ok()) return fail(set.status());
    estimators[name] = std::shared_ptr<policy::EstimatorSet>(std::move(set).value());
  }
  const std::string peer = cc.address;
  auto observe_all = [&](uint64_t bytes, Clock::time_point a, Clock::time_point b) {
    if (bytes == 0 || b <= a) return;
    for (auto& [n, set] : estimators) (void)set->observe(peer, bytes, policy::to_seconds(a), policy::to_seconds(b));
  };

  std::vector<Config> configs;
  for (uint32_t L = 0; L < levels; ++L) configs.push_back({fmt::format("level {}", L), Config::Kind::fixed, L, "", ""});
  configs.push_back({"text only", Config::Kind::text, 0, "", ""});
  configs.push_back({"8-bit", Config::Kind::int8, 0, "", ""});
  configs.push_back({"paper + last", Config::Kind::adaptive, 0, "paper", "last"});
  for (const char* e : {"last", "ewma", "harmonic", "percentile"})
    configs.push_back({fmt::format("ours + {}", e), Config::Kind::adaptive, 0, "deadline", e});
  if (profile->progressive())
    for (const char* e : {"last", "ewma"})
      configs.push_back({fmt::format("ours + {}, any prefix", e), Config::Kind::adaptive, 0, "deadline", e, true});
  if (!o.configs.empty()) {
    std::vector<Config> keep;
    for (const auto& c : configs)
      if (std::find(o.configs.begin(), o.configs.end(), c.name) != o.configs.end()) keep.push_back(c);
    configs = std::move(keep);
    if (configs.empty()) return fail(make_status(StatusCode::invalid_argument, "no configuration matches --configs"));
  }
  std::map<std::string, std::shared_ptr<const policy::Chooser>> choosers;
  for (const char* n : {"paper", "deadline"}) {
    auto c = policy::make_chooser(n);
    if (!c.ok()) return fail(c.status());
    choosers[n] = std::shared_ptr<const policy::Chooser>(std::move(c).value());
  }
  std::vector<uint64_t> chunk_tokens;
  for (const auto& r : ranges) chunk_tokens.push_back(r.size());
  const double text_all_s = double(o.tokens) / o.prefill_tokens_per_s;

  std::vector<std::byte> landing(int8_max * o.depth);
  auto landing_mr = (*client)->register_memory(landing.data(), landing.size());
  if (!landing_mr.ok()) return fail(landing_mr.status());

  auto run_one = [&](const Config& c, double deadline_s) -> Outcome {
    Outcome out;
    out.start_wall = wall_now();
    const auto t0 = Clock::now();
    const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(deadline_s));
    const auto cap =
        t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(deadline_s * o.cap_factor));
    if (c.kind == Config::Kind::text) {
      out.ttft_s = text_all_s;  // prefill on the GPU; nothing on the wire
      out.text_chunks = nchunks;
      out.levels.assign(nchunks, -1);
    } else if (c.kind == Config::Kind::int8) {
      // The 8-bit cache: `depth` gets in flight, each chunk dequantized into the
      // runtime's fp16 memory as it lands.
      std::vector<std::future<Result<size_t>>> inflight;
      std::vector<Clock::time_point> started;
      transport::CancelToken cancel;
      Status err;
      Clock::time_point first_wire{}, last_wire{};
      auto land = [&](uint32_t i) {
        auto r = inflight[i % o.depth].get();
        const auto now = Clock::now();
        if (!r.ok()) {
          if (err.ok()) err = r.status();
          return;
        }
        observe_all(*r, last_wire > started[i] ? last_wire : started[i], now);
        out.bytes += *r;
        last_wire = now;
        if (Status s = dequantize_int8(std::span(landing).subspan((i % o.depth) * int8_max, *r),
                                       *dest->view().slice(ranges[i]));
            !s.ok() && err.ok())
          err = s;
      };
      inflight.resize(o.depth);
      started.resize(nchunks);
      first_wire = Clock::now();
      for (uint32_t i = 0; i < nchunks; ++i) {
        if (i >= o.depth) land(i - o.depth);
        started[i] = Clock::now();
        inflight[i % o.depth] = (*client)->get_future("adapt-int8", i, 0, *landing_mr, (i % o.depth) * int8_max,
                                                      int8_max, cap, cancel);
      }
      for (uint32_t i = nchunks > o.depth ? nchunks - o.depth : 0; i < nchunks; ++i) land(i);
      out.ttft_s = since(t0);
      if (!err.ok()) {
        out.capped = err.code() == StatusCode::timed_out;
        if (!out.capped) out.error = err.to_string();
        out.ttft_s = std::max(out.ttft_s, deadline_s * o.cap_factor);
      }
      if (last_wire > first_wire) out.delivered_bps = double(out.bytes) * 8 / std::chrono::duration<double>(last_wire - first_wire).count();
      out.quality_loss = -1;  // not measured on this context (see perf/RESULTS.md)
    } else {
      pipeline::FetchRequest req;
      req.context = "adapt-ctx";
      req.destination = dest->view();
      req.chunks = ranges;
      req.deadline = cap;
      req.level_bytes = c.prefixes ? prefix_bytes : level_bytes;
      pipeline::FetchCallbacks cb;
      pipeline::WireClock wire;  // as adaptive_callbacks counts transfers
      auto on_chunk = [&](const pipeline::ChunkTimings& t) {
        if (!t.status.ok() || t.bytes == 0) return;
        const Clock::time_point start = wire.transfer_start(t.wire_start, t.wire_end);
        if (c.kind == Config::Kind::fixed) observe_all(t.bytes, start, t.wire_end);
        if (c.kind == Config::Kind::adaptive)
          for (auto& [n, set] : estimators)  // the plan's own set is fed by adaptive_callbacks
            if (n != c.estimator)
              (void)set->observe(peer, t.bytes, policy::to_seconds(start), policy::to_seconds(t.wire_end));
      };
      if (c.kind == Config::Kind::fixed) {
        cb.decide = [lvl = c.level](uint32_t, std::span<const uint64_t>) {
          return pipeline::ChunkDecision{pipeline::ChunkDecision::Action::fetch, lvl};
        };
        cb.on_chunk = on_chunk;
      } else {
        pipeline::AdaptivePlan plan;
        plan.chooser = choosers[c.chooser];
        plan.estimators = estimators[c.estimator];
        plan.peer = peer;
        plan.level_quality_loss = quality;
        plan.decode_seconds_per_byte = decode_spb;
        if (c.prefixes) {
          // Options: every prefix (the same count per chunk: equal chunks), each chunk's own loss.
          plan.chunk_level_quality_loss = prefix_loss;
          plan.level_quality_loss = prefix_loss[0];
          plan.decode_seconds_per_byte = prefix_spb[0];
        }
        plan.chunk_tokens = chunk_tokens;
        plan.recompute_tokens_per_second = o.prefill_tokens_per_s;
        auto acb = pipeline::adaptive_callbacks(plan, c.prefixes ? prefix_bytes : level_bytes, deadline, on_chunk);
        if (!acb.ok()) {
          out.error = acb.status().to_string();
          return out;
        }
        cb = std::move(acb).value();
      }
      auto f = (*pipe)->fetch(req, cb);
      if (!f.ok()) {
        out.error = f.status().to_string();
        return out;
      }
      const Status s = (*f)->wait();
      double fetch_s = since(t0);
      // The runtime's recompute lane: a text chunk starts once it is decided, the lane
      // is free, and every earlier chunk is in memory (its attention needs their KV).
      double text_lane_s = 0, kv_ready_s = 0;
      auto rel = [&](Clock::time_point t) { return std::chrono::duration<double>(t - t0).count(); };
      double qsum = 0;
      Clock::time_point first_wire{}, last_wire{};
      for (const auto& t : (*f)->timings()) {  // in chunk order
        const bool text = t.decision.action == pipeline::ChunkDecision::Action::recompute;
        out.levels.push_back(text ? -1 : int(t.decision.level));
        if (text) {
          ++out.text_chunks;
          text_lane_s = std::max({text_lane_s, kv_ready_s, rel(t.queued)}) +
                        double(ranges[t.chunk].size()) / o.prefill_tokens_per_s;
          kv_ready_s = text_lane_s;
        } else {
          if (t.status.ok()) kv_ready_s = std::max(kv_ready_s, rel(t.decode_end));
          qsum += c.prefixes ? prefix_loss[t.chunk][t.decision.level] : quality[std::min(t.decision.level, levels - 1)];
          out.bytes += t.bytes;
          if (t.bytes) {
            if (first_wire == Clock::time_point{} || t.wire_start < first_wire) first_wire = t.wire_start;
            last_wire = std::max(last_wire, t.wire_end);
          }
        }
      }
      out.quality_loss = qsum / double(nchunks);
      if (last_wire > first_wire)
        out.delivered_bps = double(out.bytes) * 8 / std::chrono::duration<double>(last_wire - first_wire).count();
      if (!s.ok()) {
        out.capped = s.code() == StatusCode::timed_out;
        if (!out.capped) out.error = s.to_string();
        fetch_s = std::max(fetch_s, deadline_s * o.cap_factor);
      }
      out.ttft_s = std::max(fetch_s, text_lane_s);
    }
    out.violated = out.capped || !out.error.empty() || out.ttft_s > deadline_s;
    return out;
  };

  // Rounds: every configuration once per deadline, in a shuffled order.
  std::map<std::pair<double, std::string>, std::vector<Outcome>> results;
  std::mt19937 rng(12345);
  const auto t_run = Clock::now();
  nlohmann::json records = nlohmann::json::array();
  for (uint32_t r = 0; r < o.requests; ++r) {
    for (double dl : o.deadlines) {
      std::vector<size_t> order(configs.size());
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      for (size_t k : order) {
        Outcome out = run_one(configs[k], dl);
        if (!out.error.empty()) fmt::print(stderr, "{} @ {} s: {}\n", configs[k].name, dl, out.error);
        records.push_back({{"config", configs[k].name}, {"deadline_s", dl}, {"start_wall", out.start_wall},
                           {"ttft_s", out.ttft_s}, {"violated", out.violated}, {"quality_loss", out.quality_loss},
                           {"bytes", out.bytes}, {"text_chunks", out.text_chunks}, {"delivered_bps", out.delivered_bps},
                           {"levels", out.levels}});
        results[{dl, configs[k].name}].push_back(std::move(out));
      }
    }
    if ((r + 1) % 10 == 0 || r + 1 == o.requests)
      fmt::print(stderr, "round {}/{} after {:.0f} s\n", r + 1, o.requests, since(t_run));
  }

  nlohmann::json rows = nlohmann::json::array();
  for (double dl : o.deadlines) {
    fmt::print("\ndeadline {} s ({} {} tokens, {} chunks; text prefill {} tokens/s = {:.2f} s for all)\n", dl,
               o.geometry, o.tokens, nchunks, o.prefill_tokens_per_s, text_all_s);
    fmt::print("{:<24} {:>9} {:>11} {:>10} {:>10} {:>11} {:>10}\n", "configuration", "requests", "violations",
               "quality %", "TTFT mean", "TTFT p99", "text/req");
    for (const auto& c : configs) {
      const auto& v = results[{dl, c.name}];
      std::vector<double> ttft;
      double viol = 0, q = 0, text = 0;
      bool qknown = true;
      for (const auto& x : v) {
        ttft.push_back(x.ttft_s);
        viol += x.violated;
        if (x.quality_loss < 0) qknown = false;
        q += x.quality_loss;
        text += x.text_chunks;
      }
      const double n = std::max<double>(1, double(v.size()));
      const double mean = std::accumulate(ttft.begin(), ttft.end(), 0.0) / n;
      fmt::print("{:<24} {:>9} {:>10.1f}% {:>10} {:>9.3f}s {:>10.3f}s {:>10.1f}\n", c.name, v.size(), 100 * viol / n,
                 qknown ? fmt::format("{:.3f}", q / n) : std::string("n/a"), mean, percentile(ttft, 0.99), text / n);
      rows.push_back({{"config", c.name}, {"deadline_s", dl}, {"requests", v.size()}, {"violation_rate", viol / n},
                      {"mean_quality_loss", qknown ? nlohmann::json(q / n) : nlohmann::json(nullptr)},
                      {"ttft_mean_s", mean}, {"ttft_p99_s", percentile(ttft, 0.99)}, {"text_chunks_mean", text / n}});
    }
  }
  if (!o.json.empty()) {
    nlohmann::json j = {{"geometry", o.geometry}, {"tokens", o.tokens}, {"chunk_tokens", o.chunk_tokens},
                        {"prefill_tokens_per_s", o.prefill_tokens_per_s}, {"level_quality_loss", quality},
                        {"level_bytes_chunk0", level_bytes[0]}, {"rows", rows}, {"requests", records}};
    std::ofstream(o.json) << j.dump(1) << "\n";
  }
  client->reset();
  if (server) server->stop();
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace kvstream::bench
