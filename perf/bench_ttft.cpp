// kvstream-bench ttft: time to first token of a long context whose KV cache sits on a
// storage node, against recomputing it from text, fetching it as raw fp16 and as 8-bit
// (CacheGen's baseline), per geometry, context length and link rate.
//
// The link is paced by the library (storage::make_paced_client over loopback: bytes
// really move, completions are released at the link's rate), so the run needs no root.
// Each geometry's context is made of real stored chunks of 1536 tokens (CacheGen's
// chunk size) assembled from genuine tinyllama KV: a few distinct ones, repeated to
// reach the longer contexts (bytes, decode work and statistics are real; the content
// repeats), plus one shorter chunk where a context ends mid-chunk.
//
// kvstream: the pipeline with the "deadline" chooser held to a quality floor (the codec
// benchmark's 1% perplexity bound), asked for the soonest finish: each chunk takes the
// fastest level within the floor (KV only; text recompute is its own row). Text recompute is computed from the documented prefill rate of each
// model (perf/README.md); nothing here runs a 7B or 70B model.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvstream/adaptive_fetch.hpp"
#include "kvstream/paced_client.hpp"
#include "kvstream/pipeline.hpp"
#include "perf/assembled_kv.hpp"
#include "perf/bench.hpp"
#include "perf/int8_kv.hpp"

namespace kvstream::bench {

using namespace std::chrono_literals;
using transport::Clock;
using transport::deadline_in;

namespace {

constexpr uint32_t kChunk = 1536;
constexpr uint32_t kDistinct = 2;  // distinct full chunks stored per geometry

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
int fail(const Status& s) {
  fmt::print(stderr, "kvstream-bench ttft: {}\n", s.to_string());
  return 1;
}

// Which stored chunk fills each 1536-token range of a context of `tokens` tokens:
// the distinct full chunks in turn, the short one (id kDistinct) at a partial end.
struct Layout {
  std::vector<TokenRange> ranges;
  std::vector<uint32_t> stored;
};
Layout layout_for(uint64_t tokens, uint64_t short_tokens) {
  Layout l;
  l.ranges = codec::chunk_ranges(tokens, kChunk);
  for (size_t i = 0; i < l.ranges.size(); ++i)
    l.stored.push_back(l.ranges[i].size() == kChunk ? uint32_t(i % kDistinct) : kDistinct);
  (void)short_tokens;
  return l;
}

// Fetches objects `stored[i]` of `context` in order, `depth` in flight, through
// `client`; `on_land(i, bytes)` runs as each lands (the next ones are on the wire).
Status fetch_objects(storage::Client& client, const std::string& context, const std::vector<uint32_t>& stored,
                     const transport::MemoryRegion& mr, uint64_t slot, uint32_t depth,
                     const std::function<Status(uint32_t, std::span<const std::byte>)>& on_land) {
  std::vector<std::future<Result<size_t>>> inflight(depth);
  const auto n = uint32_t(stored.size());
  auto land = [&](uint32_t i) -> Status {
    KVS_ASSIGN_OR_RETURN(size_t got, inflight[i % depth].get());
    return on_land(i, mr.span((i % depth) * slot, got));
  };
  for (uint32_t i = 0; i < n; ++i) {
    if (i >= depth) KVS_RETURN_IF_ERROR(land(i - depth));
    inflight[i % depth] =
        client.get_future(context, stored[i], 0, mr, (i % depth) * slot, slot, deadline_in(600s));
  }
  for (uint32_t i = n > depth ? n - depth : 0; i < n; ++i) KVS_RETURN_IF_ERROR(land(i));
  return {};
}

}  // namespace

int run_ttft_bench(const TtftBenchOptions& o) {
  auto qprof = codec::Profile::load_file(o.quality_profile);
  if (!qprof.ok())
    return fail(qprof.status().with_context(
        fmt::format("quality profile '{}' (make demo or kvstream-profile writes it)", o.quality_profile)));
  const uint64_t max_tokens = *std::max_element(o.contexts.begin(), o.contexts.end());
  nlohmann::json rows = nlohmann::json::array();
  std::vector<PlotSeries> plot;
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("kvstream-ttft-{}", ::getpid());
  struct Cleanup {
    std::filesystem::path d;
    ~Cleanup() { std::filesystem::remove_all(d); }
  } cleanup{dir};

  for (const auto& gname : o.geometries) {
    const double prefill = gname == "llama-70b" ? o.prefill_70b : o.prefill_7b;
    // Real chunks: kDistinct full ones and a short one (the remainder of the contexts
    // that end mid-chunk; all of them share one remainder or the run says so).
    uint64_t short_tokens = 0;
    for (uint64_t t : o.contexts)
      if (t % kChunk) {
        if (short_tokens && short_tokens != t % kChunk)
          return fail(make_status(StatusCode::invalid_argument, "contexts must share one remainder mod {}", kChunk));
        short_tokens = t % kChunk;
      }
    const uint64_t asm_tokens = uint64_t(kDistinct) * kChunk + (short_tokens ? short_tokens : kChunk);
    const auto t_setup = Clock::now();
    auto setup = assemble_setup(gname, asm_tokens, o.data);
    if (!setup.ok()) return fail(setup.status());
    const codec::Profile& profile = setup->profile;
    const uint32_t levels = profile.levels();
    std::vector<double> quality(levels);
    for (uint32_t L = 0; L < levels; ++L) quality[L] = L < qprof->levels() ? std::max(0.0, qprof->level(L).ppl_increase_pct) : 100.0;

    // A node with every stored chunk at every level, as fp16 and as 8-bit.
    auto node = open_bench_node("", "tcp", o.secret, (dir / gname).string(), uint64_t(1) << 30);
    if (!node.ok()) return fail(node.status());
    auto& server = node->server;
    const storage::ClientConfig cc = node->client;
    auto loader = storage::Client::connect(cc, deadline_in(10s));
    if (!loader.ok()) return fail(loader.status());
    const auto stored_ranges = codec::chunk_ranges(asm_tokens, kChunk);
    uint64_t max_level_bytes = 0, max_int8 = 0, max_fp16 = 0;
    std::vector<double> decode_spb(levels, 0.0);
    const KvGeometry& g = setup->geometry;
    auto scratch_out = KvCache::create(g, DType::f16, kChunk);
    if (!scratch_out.ok()) return fail(scratch_out.status());
    for (uint32_t s = 0; s < stored_ranges.size(); ++s) {
      const KvView src = *setup->context.view().slice(stored_ranges[s]);
      for (uint32_t L = 0; L < levels; ++L) {
        std::vector<uint8_t> bytes;
        if (Status st = codec::encode_chunk(profile, src, L, bytes); !st.ok()) return fail(st);
        if (s == 0) {  // decode cost per level, best of two
          double best = 1e300;
          for (int rep = 0; rep < 2; ++rep) {
            const auto t0 = Clock::now();
            if (Status st = codec::decode_chunk(profile, bytes, scratch_out->view()); !st.ok()) return fail(st);
            best = std::min(best, since(t0));
          }
          decode_spb[L] = best / double(bytes.size());
        }
        max_level_bytes = std::max<uint64_t>(max_level_bytes, bytes.size());
        if (Status st = (*loader)->put("kv", s, L, std::as_bytes(std::span(bytes)), deadline_in(300s)); !st.ok())
          return fail(st);
      }
      auto q8 = quantize_int8(src);
      max_int8 = std::max<uint64_t>(max_int8, q8.size());
      if (Status st = (*loader)->put("int8", s, 0, std::as_bytes(std::span(q8)), deadline_in(300s)); !st.ok())
        return fail(st);
      auto f16 = KvCache::create(g, DType::f16, src.tokens());
      if (!f16.ok()) return fail(f16.status());
      if (Status st = copy_kv(src, f16->view()); !st.ok()) return fail(st);
      max_fp16 = std::max<uint64_t>(max_fp16, f16->bytes().size());
      if (Status st = (*loader)->put("fp16", s, 0, f16->bytes(), deadline_in(300s)); !st.ok()) return fail(st);
    }
    auto stats = (*loader)->stat("kv", deadline_in(10s));
    if (!stats.ok()) return fail(stats.status());
    std::map<uint32_t, std::vector<uint64_t>> stored_level_bytes;
    for (const auto& st : *stats) stored_level_bytes[st.chunk] = st.level_bytes;
    loader->reset();
    fmt::print(stderr, "{}: {} stored chunks ready in {:.0f} s (level bytes per full chunk {}..{}, fp16 {})\n", gname,
               stored_ranges.size(), since(t_setup), stored_level_bytes[0].back(), stored_level_bytes[0].front(),
               max_fp16);
    auto dest = KvCache::create(g, DType::f16, max_tokens);
    if (!dest.ok()) return fail(dest.status());
    std::memset(dest->bytes().data(), 0, dest->bytes().size());  // first-touch page faults before timing

    fmt::print("\n{} (prefill for text: {:.0f} tokens/s)\n", gname, prefill);
    fmt::print("{:>10} {:>8} {:>22} {:>10} {:>14} {:>10} {:>9}\n", "link", "tokens", "method", "TTFT s", "bytes",
               "quality %", "speed-up");
    for (double rate : o.links) {
      auto inner = storage::Client::connect(cc, deadline_in(10s));
      if (!inner.ok()) return fail(inner.status());
      auto client = storage::make_paced_client(std::move(inner).value(), rate);
      if (!client) return fail(make_status(StatusCode::internal, "paced client"));
      pipeline::PipelineConfig pc;
      pc.depth = o.depth;
      pc.max_chunk_bytes = max_level_bytes;
      pc.decode_threads = o.decode_threads;
      auto pipe = pipeline::Pipeline::create(*client, profile, pc);
      if (!pipe.ok()) return fail(pipe.status());
      const uint64_t slot = std::max(max_int8, max_fp16);
      std::vector<std::byte> landing(slot * o.depth);
      auto mr = client->register_memory(landing.data(), landing.size());
      if (!mr.ok()) return fail(mr.status());
      PlotSeries series{fmt::format("{} {:.0f} Gbit/s", gname, rate / 1e9), {}};
      PlotSeries fp_series{fmt::format("{} {:.0f} Gbit/s fp16", gname, rate / 1e9), {}};
      PlotSeries q8_series{fmt::format("{} {:.0f} Gbit/s 8-bit", gname, rate / 1e9), {}};
      for (uint64_t tokens : o.contexts) {
        const Layout lay = layout_for(tokens, short_tokens);
        struct Row {
          std::string method;
          double ttft = 0;
          uint64_t bytes = 0;
          double quality = 0;
        };
        std::vector<Row> out;
        out.push_back({"text recompute", double(tokens) / prefill, 0, 0.0});
        // Raw fp16: the bytes land in the runtime's memory as they are.
        uint64_t fp_bytes = 0;
        auto t0 = Clock::now();
        Status st = fetch_objects(*client, "fp16", lay.stored, *mr, slot, o.depth,
                                  [&](uint32_t, std::span<const std::byte> b) -> Status {
                                    fp_bytes += b.size();
                                    return {};
                                  });
        if (!st.ok()) return fail(st);
        out.push_back({"raw fp16", since(t0), fp_bytes, 0.0});
        // 8-bit: each chunk dequantized into the runtime's memory as it lands.
        uint64_t q8_bytes = 0;
        t0 = Clock::now();
        st = fetch_objects(*client, "int8", lay.stored, *mr, slot, o.depth,
                           [&](uint32_t i, std::span<const std::byte> b) -> Status {
                             q8_bytes += b.size();
                             return dequantize_int8(b, *dest->view().slice(lay.ranges[i]));
                           });
        if (!st.ok()) return fail(st);
        out.push_back({"8-bit (CacheGen's)", since(t0), q8_bytes, o.int8_quality});
        // kvstream: fastest option per chunk within the quality floor.
        pipeline::AdaptivePlan plan;
        policy::ChooserOptions co;
        co.max_quality_loss = o.quality_bound;
        plan.chooser = std::shared_ptr<const policy::Chooser>(policy::make_chooser("deadline", co).value());
        policy::EstimatorOptions eo;
        eo.prior_bits_per_second = rate;  // the runtime knows its link's nominal rate
        plan.estimators = std::shared_ptr<policy::EstimatorSet>(policy::EstimatorSet::create("ewma", eo).value());
        plan.peer = cc.address;
        plan.level_quality_loss = quality;
        // The chooser models one decode stage; `decode_threads` decoders drain it that
        // much faster.
        for (double spb : decode_spb) plan.decode_seconds_per_byte.push_back(spb / double(std::max(1u, o.decode_threads)));
        // KV only: text recompute is its own row. (The chooser would model a text chunk
        // on the decode stage, while the runtime prefills it on the GPU beside the fetch.)
        std::vector<std::vector<uint64_t>> lb;
        for (uint32_t s : lay.stored) lb.push_back(stored_level_bytes[s]);
        pipeline::FetchRequest req;
        req.context = "kv";
        req.destination = dest->view();
        req.chunks = lay.ranges;
        req.stored_chunks = lay.stored;
        req.deadline = deadline_in(600s);
        t0 = Clock::now();
        auto cb = pipeline::adaptive_callbacks(plan, lb, t0);  // deadline now: the soonest finish
        if (!cb.ok()) return fail(cb.status());
        auto f = (*pipe)->fetch(req, *cb);
        if (!f.ok()) return fail(f.status());
        if (Status s = (*f)->wait(); !s.ok()) return fail(s);
        const double fetch_s = since(t0);
        uint64_t kv_bytes = 0, text_tokens = 0;
        double q = 0;
        std::map<int, int> picks;
        for (const auto& t : (*f)->timings()) {
          if (t.decision.action == pipeline::ChunkDecision::Action::recompute) {
            text_tokens += lay.ranges[t.chunk].size();
            ++picks[-1];
          } else {
            kv_bytes += t.bytes;
            q += quality[t.decision.level];
            ++picks[int(t.decision.level)];
          }
        }
        std::string how;
        for (auto& [lv, n] : picks) how += fmt::format("{}{}x{}", how.empty() ? "" : " ", lv < 0 ? "text" : fmt::format("L{}", lv), n);
        out.push_back({fmt::format("kvstream ({})", how), std::max(fetch_s, double(text_tokens) / prefill), kv_bytes,
                       q / double(lay.ranges.size())});
        const double q8_ttft = out[2].ttft, fp_ttft = out[1].ttft;
        for (const auto& r : out) {
          fmt::print("{:>7.0f} Gb {:>8} {:>22} {:>10.3f} {:>14} {:>10.3f} {:>8.2f}x\n", rate / 1e9, tokens,
                     r.method.substr(0, 22), r.ttft, r.bytes, r.quality, q8_ttft / r.ttft);
          rows.push_back({{"geometry", gname}, {"link_bits_per_s", rate}, {"tokens", tokens}, {"method", r.method},
                          {"ttft_s", r.ttft}, {"bytes", r.bytes}, {"quality_loss_pct", r.quality},
                          {"vs_8bit", q8_ttft / r.ttft}, {"vs_fp16", fp_ttft / r.ttft}, {"paced", true}});
        }
        series.points.emplace_back(double(tokens), out.back().ttft);
        fp_series.points.emplace_back(double(tokens), fp_ttft);
        q8_series.points.emplace_back(double(tokens), q8_ttft);
      }
      plot.push_back(series);
      plot.push_back(q8_series);
      plot.push_back(fp_series);
    }
    server->stop();
  }
  if (!o.json.empty()) {
    nlohmann::json j = {{"chunk_tokens", kChunk}, {"prefill_tokens_per_s_7b", o.prefill_7b},
                        {"prefill_tokens_per_s_70b", o.prefill_70b}, {"quality_bound_pct", o.quality_bound},
                        {"link", "paced by kvstream::storage::make_paced_client over loopback"}, {"rows", rows}};
    std::ofstream(o.json) << j.dump(1) << "\n";
  }
  if (!o.plot.empty())
    if (Status s = plot_xy(plot, "context tokens", "time to first token (s)", true, o.plot);
        !s.ok())
      return fail(s);
  return 0;
}

}  // namespace kvstream::bench
