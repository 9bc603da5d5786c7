// kvstream-profile: builds a codec profile offline from tinyllama KV caches of the
// first half of the eval text, with per-channel sensitivity from the model's weights
// scaled per (layer, plane) by a measured noise-injection experiment, then measures
// every level's quality on held-out windows of the same first half.
#include <atomic>
#include <mutex>
#include <cmath>
#include <fstream>
#include <random>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "examples/tinyllama/eval_harness.hpp"
#include "kvstream/codec.hpp"

using namespace kvstream;

namespace {

int fail(const Status& s) {
  fmt::print(stderr, "kvstream-profile: {}\n", s.to_string());
  return 1;
}

// Per-channel standard deviation of the sample caches.
std::vector<double> channel_sigma(const std::vector<KvCache>& caches) {
  const KvGeometry g = caches[0].geometry();
  const uint32_t C = g.channels();
  std::vector<double> sum(size_t(g.layers) * 2 * C), sq(sum.size());
  double n = 0;
  for (const KvCache& kv : caches) {
    for (uint32_t l = 0; l < g.layers; ++l)
      for (uint32_t p = 0; p < 2; ++p)
        for (uint64_t t = 0; t < kv.tokens(); ++t)
          for (uint32_t c = 0; c < C; ++c) {
            const double x = kv.at(l, p, t, c);
            sum[(l * 2 + p) * C + c] += x, sq[(l * 2 + p) * C + c] += x * x;
          }
    n += double(kv.tokens());
  }
  std::vector<double> s(sum.size());
  for (size_t i = 0; i < s.size(); ++i) s[i] = std::sqrt(std::max(sq[i] / n - (sum[i] / n) * (sum[i] / n), 1e-12));
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Build a kvstream codec profile from tinyllama KV caches (first half of the eval text)"};
  std::string data, out = "tinyllama.kvsprofile";
  // 72 quality windows: with 24 the per-level KL calibrating each chunk's stored estimate was
  // 0.64x of the test windows' (0.70-0.82x with 72, for 3 s more).
  int sample_windows = 48, quality_windows = 72, sens_windows = 8;
  unsigned threads = 0;
  bool no_sensitivity = false;
  std::string sensitivity_text;
  // No (layer, plane) is treated as less than this fraction as sensitive as the most
  // sensitive one. Measured on TinyStories, layer 0's V is 100x below layer 3's K, but
  // on other text it can be 150x more sensitive than there (GPL-3; perf/RESULTS.md,
  // "Codec: off distribution"): a step cut to the measured value there is what makes a
  // profile fail off its own text. 0.05 costs about 0.1 bits per element at 1% in
  // distribution and saves 0.4-0.9 off it (three texts unlike TinyStories).
  double sensitivity_floor = 0.05;
  std::vector<float> group_steps;
  uint32_t max_block = codec::ProfileOptions{}.max_transform_block;
  bool no_transform = false;
  uint32_t max_tables = codec::ProfileOptions{}.max_tables_per_level;
  double min_gain = codec::ProfileOptions{}.transform_min_gain;
  std::vector<float> steps = codec::ProfileOptions{}.level_steps;
  bool independent = false;
  float base_step = codec::ProfileOptions{}.progressive_base_step;
  uint32_t layers = codec::ProfileOptions{}.progressive_layers;
  uint32_t recent_tokens = codec::ProfileOptions{}.recent_tokens;
  uint32_t recent_layers = codec::ProfileOptions{}.recent_layers;
  bool recent_lead = codec::ProfileOptions{}.recent_lead;
  app.add_option("--data", data, "tinyllama data directory (default: $KVSTREAM_TINYLLAMA or ../shared/data/tinyllama)");
  app.add_option("--out", out, "profile file to write")->capture_default_str();
  app.add_option("--sample-windows", sample_windows, "windows whose context KV trains the tables")->capture_default_str();
  app.add_option("--quality-windows", quality_windows, "held-out first-half windows that measure each level")
      ->capture_default_str();
  app.add_option("--steps", steps, "with --independent: base quantization step per level, finest first");
  app.add_option("--threads", threads, "worker threads for the build and the model (0: all cores)");
  app.add_option("--layer-group-steps", group_steps,
                 "step multipliers for equal groups of layers, e.g. 0.5 1 1.5 (CacheGen's three groups)");
  app.add_option("--max-transform-block", max_block, "largest KLT block in channels")->capture_default_str();
  app.add_option("--max-tables", max_tables, "static entropy tables per level (1..256)")->capture_default_str();
  app.add_option("--transform-min-gain", min_gain, "bit saving a KLT must bring to be used (fraction)")
      ->capture_default_str();
  app.add_flag("--no-transform", no_transform, "never code in a KLT basis");
  app.add_flag("--independent", independent,
               "one stream per level at --steps (default: one progressive stream per chunk, levels are its prefixes)");
  app.add_option("--base-step", base_step, "progressive: the base layer's step (each further layer divides it by 3)")
      ->capture_default_str();
  app.add_option("--layers", layers, "progressive: layers, the base included")->capture_default_str();
  app.add_option("--recent-tokens", recent_tokens,
                 "progressive: a context's last tokens that the base layer codes finer (0: none)")
      ->capture_default_str();
  app.add_option("--recent-layers", recent_layers, "progressive: refinement layers those tokens carry in the base")
      ->capture_default_str();
  app.add_flag("--recent-lead,!--no-recent-lead", recent_lead,
               "progressive: those tokens stay that many layers ahead in every refinement layer too")
      ->capture_default_str();
  app.add_flag("--no-sensitivity", no_sensitivity, "plain per-channel normalisation instead of measured sensitivity");
  app.add_option("--sensitivity-floor", sensitivity_floor,
                 "least sensitivity of a (layer, plane), as a fraction of the largest measured (robustness off "
                 "the profile's text)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--sensitivity-text", sensitivity_text,
                 "measure the sensitivity on windows of this text file instead of held-out eval windows (fits the "
                 "weights to another kind of text)");
  CLI11_PARSE(app, argc, argv);

  auto d = tinyllama::load_eval_data(tinyllama::data_dir(data));
  if (!d.ok()) return fail(d.status());
  const tinyllama::EvalSetup setup;
  // Training windows first, then held-out quality windows, all from the first half.
  auto windows = tinyllama::make_windows(d->first_half, setup, sample_windows + quality_windows);
  if (int(windows.size()) < sample_windows + 1) return fail(make_status(StatusCode::invalid_argument, "too few windows"));
  std::vector<std::vector<int>> train(windows.begin(), windows.begin() + sample_windows);
  std::vector<std::vector<int>> held(windows.begin() + sample_windows, windows.end());

  std::vector<KvCache> caches;
  std::vector<KvView> samples;
  for (const auto& w : train) {
    auto kv = d->model.calculate_kv(std::span<const int>(w).first(size_t(setup.context)));
    if (!kv.ok()) return fail(kv.status());
    caches.push_back(std::move(kv).value());
  }
  for (const KvCache& kv : caches)
    for (int b = 0; b < setup.context; b += setup.chunk_tokens) {
      auto v = kv.view().slice({uint64_t(b), uint64_t(std::min(b + setup.chunk_tokens, setup.context))});
      if (!v.ok()) return fail(v.status());
      samples.push_back(*v);
    }

  codec::ProfileOptions opt;
  opt.level_steps = steps;
  opt.progressive = !independent;
  opt.progressive_base_step = base_step;
  opt.progressive_layers = layers;
  opt.recent_tokens = independent ? 0 : recent_tokens;
  opt.recent_layers = recent_layers;
  opt.recent_lead = recent_lead;
  opt.max_transform_block = max_block;
  opt.max_tables_per_level = max_tables;
  opt.transform_min_gain = min_gain;
  opt.threads = threads;
  opt.allow_transform = !no_transform;
  if (!group_steps.empty()) {
    const uint32_t L = d->model.geometry().layers;
    for (uint32_t l = 0; l < L; ++l)
      for (int p = 0; p < 2; ++p) opt.layer_plane_step.push_back(group_steps[l * group_steps.size() / L]);
  }
  if (!no_sensitivity) {
    // Weight proxy, normalised per (layer, plane) so that unit noise means "one
    // typical channel deviation"; then one noise experiment per (layer, plane) says
    // how much the model cares about that group as a whole.
    const std::vector<float> proxy = d->model.kv_sensitivity();
    const std::vector<double> sigma = channel_sigma(caches);
    const KvGeometry g = d->model.geometry();
    const uint32_t C = g.channels();
    std::vector<double> shape(proxy.size());
    for (uint32_t lp = 0; lp < g.layers * 2; ++lp) {
      double lr = 0;
      for (uint32_t c = 0; c < C; ++c) lr += std::log((1.0 / std::sqrt(proxy[lp * C + c])) / sigma[lp * C + c]);
      const double norm = std::exp(-lr / C);
      for (uint32_t c = 0; c < C; ++c) shape[lp * C + c] = norm / std::sqrt(proxy[lp * C + c]);  // noise std per unit
    }
    auto sens_w = std::vector<std::vector<int>>(held.begin(), held.begin() + std::min<size_t>(held.size(), sens_windows));
    if (!sensitivity_text.empty()) {
      std::ifstream f(sensitivity_text, std::ios::binary);
      if (!f) return fail(make_status(StatusCode::not_found, "cannot read --sensitivity-text '{}'", sensitivity_text));
      const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      sens_w = tinyllama::make_windows(d->tok.encode(text, false, false), setup, sens_windows);
      if (sens_w.empty())
        return fail(make_status(StatusCode::invalid_argument, "--sensitivity-text '{}' is shorter than one window",
                                sensitivity_text));
    }
    auto ref = tinyllama::score_reference(d->model, sens_w, setup, threads);
    if (!ref.ok()) return fail(ref.status());
    const double tau = 0.1;
    opt.channel_weights.resize(proxy.size());
    std::vector<double> lp_sens(g.layers * 2);
    for (uint32_t l = 0; l < g.layers; ++l)
      for (uint32_t p = 0; p < 2; ++p) {
        const uint32_t lp = l * 2 + p;
        tinyllama::KvTransform noise = [&, l, p, lp](KvCache& kv) -> Status {
          std::mt19937 rng(1234 + lp);
          std::normal_distribution<float> n01;
          for (uint64_t t = 0; t < kv.tokens(); ++t)
            for (uint32_t c = 0; c < C; ++c) kv.set(l, p, t, c, kv.at(l, p, t, c) + float(tau * shape[lp * C + c]) * n01(rng));
          return {};
        };
        auto q = tinyllama::evaluate(d->model, sens_w, *ref, setup, noise, threads);
        if (!q.ok()) return fail(q.status());
        lp_sens[lp] = std::max(q->kl_nats_per_token, 1e-9) / (tau * tau);
        fmt::print(stderr, "sensitivity layer {} {}: KL {:.5f} nats at noise {:.2f} sigma\n", l, p ? "V" : "K",
                   q->kl_nats_per_token, tau);
      }
    const double top = *std::max_element(lp_sens.begin(), lp_sens.end());
    for (uint32_t lp = 0; lp < g.layers * 2; ++lp) {
      const double s = std::max(lp_sens[lp], sensitivity_floor * top);
      for (uint32_t c = 0; c < C; ++c)
        opt.channel_weights[lp * C + c] = float(s / (shape[lp * C + c] * shape[lp * C + c]));
    }
  }
  auto profile = codec::ProfileBuilder::build(samples, d->model.rope(), opt);
  if (!profile.ok()) return fail(profile.status());

  // Quality of every level on held-out first-half windows.
  auto ref = tinyllama::score_reference(d->model, held, setup, threads);
  if (!ref.ok()) return fail(ref.status());
  // "held-out bits": the windows' contexts as coded there, their recent tokens included.
  fmt::print("{:>5} {:>8} {:>10} {:>12} {:>12} {:>10}\n", "level", "step", "bits/elem", "held-out bits", "ppl incr %",
             "KL nats");
  for (uint32_t L = 0; L < profile->levels(); ++L) {
    const codec::Profile& prof = *profile;
    std::atomic<uint64_t> coded_bytes{0}, coded_elements{0};
    // The chunks' own distortion at this level, weighted by elements (progressive):
    // what calibrates a stored chunk's distortion against the quality measured here.
    std::mutex distortion_mu;
    double distortion_sum = 0;
    const tinyllama::KvTransform codec_rt = tinyllama::chunked_fp16_transform(
        setup.chunk_tokens, [&](const KvView& src, const KvView& dst, uint64_t context) -> Status {
          std::vector<uint8_t> bytes;
          const TokenRange r{src.first_position(), src.first_position() + src.tokens()};
          KVS_RETURN_IF_ERROR(codec::encode_chunk(prof, src, L, {codec::recent_tokens_of(prof, r, context)}, bytes));
          coded_bytes += bytes.size();
          const uint64_t elements = src.tokens() * src.geometry().elements_per_token();
          coded_elements += elements;
          if (prof.progressive()) {
            // (The header lists every prefix of the whole stream: this level's is its whole-layer one.)
            KVS_ASSIGN_OR_RETURN(const std::vector<codec::ChunkPrefix> ps, codec::chunk_prefixes(bytes));
            std::lock_guard lock(distortion_mu);
            for (const codec::ChunkPrefix& pf : ps)
              if (pf.whole_layer && pf.level == L) distortion_sum += pf.distortion * double(elements);
          }
          return codec::decode_chunk(prof, bytes, dst);
        });
    auto q = tinyllama::evaluate(d->model, held, *ref, setup, codec_rt, threads);
    if (!q.ok()) return fail(q.status());
    const double distortion = prof.progressive() ? distortion_sum / double(coded_elements) : -1.0;
    if (auto s = profile->set_level_quality(L, q->ppl_increase_pct, q->kl_nats_per_token, distortion); !s.ok())
      return fail(s);
    fmt::print("{:>5} {:>8.3f} {:>10.3f} {:>12.3f} {:>12.3f} {:>10.5f}\n", L, profile->level(L).step,
               profile->level(L).bits_per_element, 8.0 * double(coded_bytes) / double(coded_elements),
               q->ppl_increase_pct, q->kl_nats_per_token);
  }
  if (auto s = profile->save_file(out); !s.ok()) return fail(s);
  const auto pc = profile->predictor_counts();
  fmt::print("wrote {} (hash {:016x}; predictors: none {}, mean {}, anchor {})\n", out, profile->hash(), pc[0], pc[1],
             pc[2]);
  return 0;
}
