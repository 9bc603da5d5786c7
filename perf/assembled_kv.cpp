#include "perf/assembled_kv.hpp"

#include "examples/tinyllama/eval_harness.hpp"

#include <algorithm>
#include <xxhash.h>

namespace kvstream::bench {

Result<KvGeometry> named_geometry(const std::string& name) {
  if (name == "tinyllama") return KvGeometry{5, 4, 8, 8, AttentionKind::gqa};
  if (name == "llama-7b") return KvGeometry{32, 32, 128, 32, AttentionKind::mha};
  if (name == "mistral-7b") return KvGeometry{32, 8, 128, 32, AttentionKind::gqa};
  if (name == "llama-70b") return KvGeometry{80, 8, 128, 64, AttentionKind::gqa};
  return make_status(StatusCode::invalid_argument, "unknown geometry '{}' (tinyllama, llama-7b, mistral-7b, llama-70b)",
                     name);
}

Result<KvSources> source_windows(const tinyllama::Model& m, const std::vector<int>& text, int count) {
  KvSources s;
  const size_t per = 511;
  for (int w = 0; w < count && (size_t(w) + 1) * per <= text.size(); ++w) {
    std::vector<int> win{tinyllama::kBos};
    win.insert(win.end(), text.begin() + size_t(w) * per, text.begin() + size_t(w + 1) * per);
    KVS_ASSIGN_OR_RETURN(KvCache kv, m.calculate_kv(win));
    s.windows.push_back(std::move(kv));
  }
  if (s.windows.empty()) return make_status(StatusCode::invalid_argument, "no source windows");
  return s;
}

Result<KvCache> assemble_kv(const KvGeometry& g, uint64_t tokens, const KvSources& src, uint64_t seed) {
  KVS_ASSIGN_OR_RETURN(KvCache out, KvCache::create(g, DType::f16, tokens));
  const KvGeometry& sg = src.windows[0].geometry();
  const uint64_t run = 64;  // tokens taken from one window before moving to another
  const uint32_t C = g.channels();
  std::vector<float> row(C);
  auto pick = [&](uint64_t a, uint64_t b, uint64_t c) {
    const uint64_t key[4] = {seed, a, b, c};
    return XXH3_64bits(key, sizeof key);
  };
  const size_t src_tokens = src.windows[0].tokens();
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < g.planes(); ++p) {
      // Each target channel follows one source channel of the same plane; layers map
      // proportionally (early to early, late to late) to keep per-layer statistics.
      const uint32_t sl = uint32_t(uint64_t(l) * sg.layers / g.layers);
      std::vector<uint32_t> sc(C);
      for (uint32_t c = 0; c < C; ++c) sc[c] = uint32_t(pick(l, p, c) % sg.channels());
      for (uint64_t t = 0; t < tokens; ++t) {
        const uint64_t r = t / run;
        const KvCache& w = src.windows[pick(l, r, 0x5eed) % src.windows.size()];
        const uint64_t st = (t % run + pick(l, r, 1) % (src_tokens - run)) % src_tokens;
        for (uint32_t c = 0; c < C; ++c) row[c] = w.at(sl, p, st, sc[c]);
        out.view().store_row(l, p, t, row.data());
      }
    }
  return out;
}

Result<AssembledSetup> assemble_setup(const std::string& geometry, uint64_t tokens, const std::string& data_dir_option,
                                      uint64_t profile_tokens, const codec::Profile* like) {
  KVS_ASSIGN_OR_RETURN(KvGeometry g, named_geometry(geometry));
  KVS_ASSIGN_OR_RETURN(auto d, tinyllama::load_eval_data(tinyllama::data_dir(data_dir_option)));
  KVS_ASSIGN_OR_RETURN(auto train_src, source_windows(d.model, d.first_half, 48));
  KVS_ASSIGN_OR_RETURN(auto test_src, source_windows(d.model, d.second_half, 48));
  KVS_ASSIGN_OR_RETURN(KvCache train, assemble_kv(g, profile_tokens, train_src, 1));
  KVS_ASSIGN_OR_RETURN(KvCache ctx, assemble_kv(g, tokens, test_src, 1));
  std::vector<KvView> samples;
  for (const auto& r : codec::chunk_ranges(train.tokens(), 512)) samples.push_back(*train.view().slice(r));
  codec::ProfileOptions po;
  po.max_transform_block = 32;
  if (like && like->progressive()) {
    po.progressive = true;
    po.progressive_base_step = like->level(like->levels() - 1).step;
    po.progressive_layers = like->levels();
    po.recent_tokens = like->recent_tokens();
    po.recent_layers = std::max(1u, like->recent_layers());
  } else if (like) {
    po.level_steps.clear();
    for (uint32_t l = 0; l < like->levels(); ++l) po.level_steps.push_back(like->level(l).step);
  }
  KVS_ASSIGN_OR_RETURN(codec::Profile profile, codec::ProfileBuilder::build(samples, RopeParams{}, po));
  return AssembledSetup{g, std::move(profile), std::move(ctx)};
}

}  // namespace kvstream::bench
