// kvstream-bench codec: rate/quality/speed of the kvstream codec and every baseline on
// genuine tinyllama KV caches, with the protocol of perf/README.md.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "codec/baselines/baseline.hpp"
#include "examples/tinyllama/eval_harness.hpp"
#include "kvstream/codec.hpp"
#include "perf/bench.hpp"

namespace kvstream::bench {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One method at one setting, as the benchmark drives it.
struct Method {
  std::string method, config, level;
  bool progressive = false;
  const codec::Profile* profile = nullptr;  // kvstream rows at a whole level: for the quality estimate
  uint32_t level_index = 0;
  // `context_tokens`: the chunk's context, which starts at position 0 (a kvstream
  // profile codes the context's recent tokens finer).
  std::function<Status(const KvView& chunk, uint64_t context_tokens, std::vector<uint8_t>& out)> encode;
  std::function<Status(std::span<const uint8_t> bytes, const KvView& out)> decode;
};

// The encode options of chunk `c` of a context of `context_tokens` that starts at position 0.
codec::EncodeOptions recent_options(const codec::Profile& prof, const KvView& c, uint64_t context_tokens) {
  return {codec::recent_tokens_of(prof, {c.first_position(), c.first_position() + c.tokens()}, context_tokens)};
}

struct Row {
  Method m;
  double bits = 0;
  double stored_bits = 0;  // the chunk as stored: every level (single-level), the whole stream (progressive)
  // Progressive rows: the KL per token the stored chunks predict (the profile's KL of
  // the level scaled by the test chunks' mean distortion against the profile's).
  double estimated_kl = -1;
  tinyllama::Quality q;
  double enc_1t = 0, dec_1t = 0, dec_mt = 0;
};

double memcpy_rate() {
  const size_t n = size_t(256) << 20;
  std::vector<uint8_t> a(n, 1), b(n, 0);  // touched first: page faults are not memcpy
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), n);
    best = std::max(best, double(n) / seconds_since(t0));
    a[i] = b[i + 1];
  }
  return best;
}

// Chunks of the context of each window, 128 tokens each (positions 0, 128, 256).
struct ChunkSet {
  std::vector<KvCache> caches;
  std::vector<KvView> chunks;
  uint64_t elements = 0;
};

Result<ChunkSet> context_chunks(const tinyllama::Model& m, const std::vector<std::vector<int>>& windows,
                                const tinyllama::EvalSetup& s) {
  ChunkSet cs;
  for (const auto& w : windows) {
    KVS_ASSIGN_OR_RETURN(KvCache kv, m.calculate_kv(std::span<const int>(w).first(size_t(s.context))));
    cs.caches.push_back(std::move(kv));
  }
  for (const KvCache& kv : cs.caches)
    for (int b = 0; b < s.context; b += s.chunk_tokens) {
      KVS_ASSIGN_OR_RETURN(KvView v, kv.view().slice({uint64_t(b), uint64_t(std::min(b + s.chunk_tokens, s.context))}));
      cs.chunks.push_back(v);
      cs.elements += v.tokens() * v.geometry().elements_per_token();
    }
  return cs;
}

// Sizes, quality and speed of one method.
Result<Row> measure(const Method& m, const tinyllama::EvalData& d, const std::vector<std::vector<int>>& windows,
                    const tinyllama::Reference& ref, const tinyllama::EvalSetup& s, const ChunkSet& test,
                    unsigned threads, bool speed, int repeats, bool quality) {
  Row row{m};
  // Encode every test chunk once (one thread, timed), keep the bytes for decoding.
  std::vector<std::vector<uint8_t>> coded(test.chunks.size());
  uint64_t bytes = 0;
  auto t0 = Clock::now();
  for (size_t i = 0; i < test.chunks.size(); ++i) {
    KVS_RETURN_IF_ERROR(m.encode(test.chunks[i], uint64_t(s.context), coded[i]));
    bytes += coded[i].size();
  }
  row.enc_1t = double(test.elements) / seconds_since(t0);
  row.bits = double(bytes) * 8.0 / double(test.elements);
  if (m.profile && m.profile->progressive() && m.profile->level(m.level_index).distortion > 0 &&
      m.profile->level(m.level_index).kl_nats >= 0) {
    double sum = 0, n = 0;
    for (size_t i = 0; i < coded.size(); ++i) {
      KVS_ASSIGN_OR_RETURN(const std::vector<codec::ChunkPrefix> ps, codec::chunk_prefixes(coded[i]));
      for (const codec::ChunkPrefix& p : ps)
        if (p.whole_layer && p.level == m.level_index) {
          const double w = double(test.chunks[i].tokens());
          sum += p.distortion * w, n += w;
        }
    }
    if (n > 0)
      row.estimated_kl = m.profile->level(m.level_index).kl_nats * (sum / n) / m.profile->level(m.level_index).distortion;
  }

  if (speed) {
    // Decode into fp16 runtime memory, as a GPU host holds KV.
    const KvGeometry g = test.chunks[0].geometry();
    std::vector<KvCache> outs;
    for (unsigned t = 0; t < std::max(1u, threads); ++t) {
      KVS_ASSIGN_OR_RETURN(KvCache o, KvCache::create(g, DType::f16, test.chunks[0].tokens()));
      outs.push_back(std::move(o));
    }
    auto decode_range = [&](size_t begin, size_t step, const KvCache& out) -> Status {
      for (size_t i = begin; i < coded.size(); i += step) KVS_RETURN_IF_ERROR(m.decode(coded[i], out.view()));
      return {};
    };
    KVS_RETURN_IF_ERROR(decode_range(0, 1, outs[0]));  // warm-up
    double best = 0;
    for (int rep = 0; rep < repeats; ++rep) {
      t0 = Clock::now();
      KVS_RETURN_IF_ERROR(decode_range(0, 1, outs[0]));
      best = std::max(best, double(test.elements) / seconds_since(t0));
    }
    row.dec_1t = best;
    best = 0;
    for (int rep = 0; rep < repeats; ++rep) {
      std::vector<Status> errs(threads);
      std::vector<std::thread> pool;
      t0 = Clock::now();
      for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back([&, t] { errs[t] = decode_range(t, threads, outs[t]); });
      for (auto& th : pool) th.join();
      best = std::max(best, double(test.elements) / seconds_since(t0));
      for (auto& e : errs) KVS_RETURN_IF_ERROR(e);
    }
    row.dec_mt = best;
  }

  // Quality: each window's context KV goes through the codec chunk by chunk and lands
  // in fp16 memory, which the model then reads.
  const tinyllama::KvTransform transform =
      tinyllama::chunked_fp16_transform(s.chunk_tokens, [&m](const KvView& src, const KvView& dst,
                                                             uint64_t context_tokens) -> Status {
        std::vector<uint8_t> buf;
        KVS_RETURN_IF_ERROR(m.encode(src, context_tokens, buf));
        return m.decode(buf, dst);
      });
  if (quality) {
    KVS_ASSIGN_OR_RETURN(row.q, tinyllama::evaluate(d.model, windows, ref, s, transform, threads));
  }
  return row;
}

// Bits per element at which a method's curve crosses `ppl_pct` (linear interpolation
// between its settings sorted by bits; the cheapest setting already within the bound
// if the curve starts inside it). Negative when no setting reaches it.
double bits_at_quality(std::vector<const Row*> rows, double bound, bool by_kl = false) {
  auto loss = [by_kl](const Row* r) { return by_kl ? r->q.kl_nats_per_token : r->q.ppl_increase_pct; };
  std::sort(rows.begin(), rows.end(), [](const Row* a, const Row* b) { return a->bits < b->bits; });
  // Pareto front: keep settings that improve quality as bits grow.
  std::vector<const Row*> front;
  for (const Row* r : rows) {
    while (!front.empty() && loss(front.back()) >= loss(r) && front.back()->bits >= r->bits) front.pop_back();
    if (front.empty() || loss(r) < loss(front.back())) front.push_back(r);
  }
  for (size_t i = 0; i < front.size(); ++i) {
    if (loss(front[i]) <= bound) {
      if (i == 0) return front[i]->bits;
      const Row *a = front[i - 1], *b = front[i];
      const double f = (loss(a) - bound) / (loss(a) - loss(b));
      return a->bits + f * (b->bits - a->bits);
    }
  }
  return -1;
}

}  // namespace

int run_codec_bench(const CodecBenchOptions& o) {
  auto fail = [](const Status& s) {
    fmt::print(stderr, "kvstream-bench codec: {}\n", s.to_string());
    return 1;
  };
  const unsigned threads = o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  auto d = tinyllama::load_eval_data(tinyllama::data_dir(o.data));
  if (!d.ok()) return fail(d.status());
  const tinyllama::EvalSetup setup;
  std::vector<int> drift_tokens;
  if (!o.text.empty()) {
    std::ifstream f(o.text, std::ios::binary);
    if (!f) return fail(make_status(StatusCode::not_found, "cannot read --text '{}'", o.text));
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    drift_tokens = d->tok.encode(text, false, false);
  }
  const auto test_windows = tinyllama::make_windows(o.text.empty() ? d->second_half : drift_tokens, setup, o.windows);
  const bool by_kl = o.kl_bound > 0 || !o.text.empty();
  const double bound = o.kl_bound > 0 ? o.kl_bound : (!o.text.empty() ? 0.009 : o.ppl_bound);
  if (test_windows.empty()) return fail(make_status(StatusCode::invalid_argument, "no test windows"));
  const auto train_windows = tinyllama::make_windows(d->first_half, setup, o.train_windows);
  fmt::print(stderr, "{} test windows ({}), {} training windows (first half)\n", test_windows.size(),
             o.text.empty() ? std::string("second half") : o.text, train_windows.size());

  std::vector<codec::Profile> profiles;
  std::vector<std::string> families;
  for (const std::string& path : o.profiles) {
    auto profile = codec::Profile::load_file(path);
    if (!profile.ok()) return fail(profile.status().with_context("load the profile (build it with kvstream-profile)"));
    std::string family = profile->progressive() ? "kvstream" : "kvstream-independent";
    if (std::find(families.begin(), families.end(), family) != families.end())
      family += "-" + std::filesystem::path(path).stem().string();
    profiles.push_back(std::move(profile).value());
    families.push_back(family);
  }
  auto train = context_chunks(d->model, train_windows, setup);
  if (!train.ok()) return fail(train.status());
  auto test = context_chunks(d->model, test_windows, setup);
  if (!test.ok()) return fail(test.status());
  auto ref = tinyllama::score_reference(d->model, test_windows, setup, threads);
  if (!ref.ok()) return fail(ref.status());
  const double memcpy_bps = memcpy_rate();

  std::vector<Method> methods;
  auto want = [&](const std::string& family) {
    return o.methods.empty() || std::find(o.methods.begin(), o.methods.end(), family) != o.methods.end();
  };
  for (size_t pi = 0; pi < profiles.size() && want("kvstream"); ++pi) {
    const codec::Profile& prof = profiles[pi];
    auto decode = [&prof](std::span<const uint8_t> b, const KvView& out) {
      thread_local codec::DecodeScratch scratch;
      return codec::decode_chunk(prof, b, out, &scratch);
    };
    for (uint32_t L = 0; L < prof.levels(); ++L)
      methods.push_back({families[pi], fmt::format("step{:.3g}", prof.level(L).step), std::to_string(L),
                         prof.progressive(), &prof, L,
                         [&prof, L](const KvView& c, uint64_t context, std::vector<uint8_t>& out) {
                           return codec::encode_chunk(prof, c, L, recent_options(prof, c, context), out);
                         },
                         decode});
    if (!prof.progressive()) continue;
    // Prefixes inside a layer (some groups of planes refined, the rest not): the
    // points a chooser may stop at between two levels, every one of them. Named after
    // the level they refine and how many of its groups they hold.
    for (uint32_t L = prof.levels() - 1; L > 0; --L)
      for (uint32_t part = 1; part <= 8; ++part)
        methods.push_back({families[pi], fmt::format("inside-step{:.3g}-{}", prof.level(L - 1).step, part),
                           fmt::format("{}+{}", L, part), true, nullptr, 0,
                           [&prof, L, part](const KvView& c, uint64_t context, std::vector<uint8_t>& out) -> Status {
                             // The part-th prefix that refines level L - 1 only in part.
                             std::vector<uint8_t> full;
                             KVS_RETURN_IF_ERROR(
                                 codec::encode_chunk(prof, c, 0, recent_options(prof, c, context), full));
                             KVS_ASSIGN_OR_RETURN(const std::vector<codec::ChunkPrefix> ps, codec::chunk_prefixes(full));
                             uint32_t seen = 0;
                             for (const codec::ChunkPrefix& pf : ps)
                               if (pf.level == L && !pf.whole_layer && ++seen == part) {
                                 out.assign(full.begin(), full.begin() + int64_t(pf.end));
                                 return {};
                               }
                             return make_status(StatusCode::not_found, "no prefix {} inside level {}", part, L - 1);
                           },
                           decode});
  }
  std::vector<std::unique_ptr<codec::baselines::BaselineCodec>> baselines =
      codec::baselines::make_all_baselines(d->model.geometry());
  for (auto& b : baselines) {
    if (!want(b->method())) continue;
    if (b->needs_training())
      if (auto s = b->train(train->chunks); !s.ok()) return fail(s.with_context(b->name()));
    const codec::baselines::BaselineCodec* bp = b.get();
    methods.push_back({b->method(), b->config(), "", false, nullptr, 0,
                       [bp](const KvView& c, uint64_t, std::vector<uint8_t>& out) -> Status {
                         KVS_ASSIGN_OR_RETURN(out, bp->encode(c));
                         return {};
                       },
                       [bp](std::span<const uint8_t> bytes, const KvView& out) { return bp->decode(bytes, out); }});
  }

  std::vector<Row> rows;
  fmt::print("{:<16} {:<22} {:>5} {:>7} {:>8} {:>8} {:>7} {:>9} {:>6} {:>9} {:>9} {:>9}\n", "method", "config", "level",
             "bits", "ppl", "incr%", "se", "KL", "top1", "enc M/s", "dec M/s", "dec mt");
  for (const Method& m : methods) {
    const bool speed =
        o.speed_all || m.method.rfind("kvstream", 0) == 0 || m.config == "int8" || m.config == "fp16";
    auto r = measure(m, *d, test_windows, *ref, setup, *test, threads, speed, o.speed_repeats, !o.speed_only);
    if (!r.ok() && r.status().code() == StatusCode::not_found) continue;  // a chunk with one group per layer
    if (!r.ok()) return fail(r.status().with_context(m.method + "/" + m.config));
    rows.push_back(std::move(r).value());
    const Row& w = rows.back();
    fmt::print("{:<16} {:<22} {:>5} {:>7.3f} {:>8.4f} {:>8.3f} {:>7.3f} {:>9.5f} {:>6.4f} {:>9.1f} {:>9.1f} {:>9.1f}\n",
               w.m.method, w.m.config, w.m.level, w.bits, w.q.ppl, w.q.ppl_increase_pct, w.q.ppl_increase_se,
               w.q.kl_nats_per_token, w.q.top1_agreement, w.enc_1t / 1e6, w.dec_1t / 1e6, w.dec_mt / 1e6);
    std::fflush(stdout);
  }

  // What a chunk costs stored: a single-level profile keeps every level, a
  // progressive one its whole stream (its level 0).
  std::map<std::string, double> stored;
  for (const Row& r : rows)
    if (r.m.method.rfind("kvstream", 0) == 0 && !r.m.level.empty() && r.m.level.find('+') == std::string::npos) {
      if (!r.m.progressive) stored[r.m.method] += r.bits;
      else if (r.m.level == "0") stored[r.m.method] = r.bits;
    }
  for (Row& r : rows)
    if (auto it = stored.find(r.m.method); it != stored.end()) r.stored_bits = it->second;
  for (const auto& [family, bits] : stored) fmt::print("{}: a chunk stored at every level: {:.3f} bits/element\n", family, bits);

  // Headline ratios at the quality bound.
  std::map<std::string, std::vector<const Row*>> by_method;
  for (const Row& r : rows) by_method[r.m.method].push_back(&r);
  if (o.speed_only) {
    fmt::print("memcpy one thread: {:.2f} GB/s\n", memcpy_bps / 1e9);
    return 0;
  }
  if (by_kl)
    fmt::print("\nbits per element at a mean KL of at most {:.4f} nats per token (interpolated along each method):\n",
               bound);
  else
    fmt::print("\nbits per element at a perplexity increase of at most {:.2f}% (interpolated along each method):\n",
               bound);
  double ours = -1, best_other = -1, int8 = -1;
  std::string best_name;
  for (auto& [name, rs] : by_method) {
    const double b = bits_at_quality(rs, bound, by_kl);
    fmt::print("  {:<16} {}\n", name, b < 0 ? std::string("does not reach it") : fmt::format("{:.3f}", b));
    if (!families.empty() && name == families[0]) ours = b;  // the first profile is the one measured
    else if (name.rfind("kvstream", 0) != 0 && b > 0 && (best_other < 0 || b < best_other))
      best_other = b, best_name = name;
  }
  for (const Row& r : rows)
    if (r.m.config == "int8") int8 = r.bits;
  if (ours > 0) {
    if (best_other > 0) fmt::print("kvstream vs best baseline ({}): {:.2f}x fewer bits\n", best_name, best_other / ours);
    if (int8 > 0) fmt::print("kvstream vs int-token int8: {:.2f}x fewer bits\n", int8 / ours);
    // The rate cost of being progressive, against every single-level profile of the run.
    for (auto& [name, rs] : by_method)
      if (profiles[0].progressive() && name.rfind("kvstream-independent", 0) == 0)
        if (const double b = bits_at_quality(rs, bound, by_kl); b > 0)
          fmt::print("kvstream (progressive) vs {}: {:.3f}x the bits at the bound\n", name, ours / b);
  }
  // How true each progressive level's quality estimate stayed on these windows.
  for (const Row& r : rows)
    if (r.estimated_kl >= 0 && r.q.kl_nats_per_token > 0)
      fmt::print("{} level {}: estimated KL {:.5f}, measured {:.5f} ({:.2f}x)\n", r.m.method, r.m.level, r.estimated_kl,
                 r.q.kl_nats_per_token, r.estimated_kl / r.q.kl_nats_per_token);
  fmt::print("memcpy one thread: {:.2f} GB/s\n", memcpy_bps / 1e9);

  if (!o.json.empty()) {
    nlohmann::json j;
    j["memcpy_bytes_per_s_1t"] = memcpy_bps;
    j["ppl_bound_pct"] = o.ppl_bound;
    j["headline_bound"] = {{"metric", by_kl ? "kl_nats_per_token" : "ppl_increase_pct"}, {"value", bound}};
    if (!o.text.empty()) j["text"] = o.text;
    j["test_windows"] = test_windows.size();
    j["rows"] = nlohmann::json::array();
    for (const Row& r : rows)
      j["rows"].push_back({{"method", r.m.method}, {"config", r.m.config}, {"level", r.m.level},
                           {"bits_per_element", r.bits}, {"stored_bits_per_element", r.stored_bits},
                           {"progressive", r.m.progressive}, {"estimated_kl_nats_per_token", r.estimated_kl},
                           {"ppl_exact", r.q.ppl_exact}, {"ppl", r.q.ppl},
                           {"ppl_increase_pct", r.q.ppl_increase_pct}, {"ppl_increase_se", r.q.ppl_increase_se},
                           {"kl_nats_per_token", r.q.kl_nats_per_token}, {"top1_agreement", r.q.top1_agreement},
                           {"encode_elems_per_s_1t", r.enc_1t}, {"decode_elems_per_s_1t", r.dec_1t},
                           {"decode_elems_per_s_mt", r.dec_mt}});
    std::ofstream f(o.json);
    f << j.dump(1) << "\n";
    if (!f) return fail(make_status(StatusCode::io_error, "cannot write {}", o.json));
  }
  if (!o.plot.empty()) {
    std::vector<PlotSeries> series;
    for (auto& [name, rs] : by_method) {
      PlotSeries ps{name, {}};
      for (const Row* r : rs) ps.points.push_back({r->bits, std::max(r->q.ppl_increase_pct, 1e-3)});
      std::sort(ps.points.begin(), ps.points.end());
      series.push_back(std::move(ps));
    }
    if (auto s = plot_xy(series, "bits per element", "perplexity increase (%)", true, o.plot); !s.ok()) return fail(s);
  }
  return 0;
}

}  // namespace kvstream::bench
