// kvstream-codec-demo: the codec on a real story. The tinyllama runtime computes the
// KV cache of a prompt; kvstream encodes it at every level of the profile, decodes it
// into fp16 memory, and the model continues the story from the decoded cache, next to
// the continuation from the exact cache.
#include <chrono>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "examples/tinyllama/tinyllama.hpp"
#include "kvstream/codec.hpp"

using namespace kvstream;

namespace {
int fail(const Status& s) {
  fmt::print(stderr, "kvstream-codec-demo: {}\n", s.to_string());
  return 1;
}
constexpr const char* kPrompt =
    "Once upon a time, there was a little boy named Tim. Tim had a big red ball. He loved to play with his ball in "
    "the park. One day, Tim saw a small dog near the trees. The dog looked sad and alone. Tim said, \"Hi, dog! Do you "
    "want to play with me?\" The dog wagged its tail and";
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Encode a real KV cache at every level, decode it, and continue the story from it"};
  std::string data, profile_path = "build/tinyllama.kvsprofile", prompt = kPrompt;
  int steps = 40, chunk = 64;
  app.add_option("--data", data, "tinyllama data directory (default: $KVSTREAM_TINYLLAMA or ../shared/data/tinyllama)");
  app.add_option("--profile", profile_path, "codec profile (kvstream-profile)")->capture_default_str();
  app.add_option("--prompt", prompt, "story prompt");
  app.add_option("--steps", steps, "tokens to generate")->capture_default_str();
  app.add_option("--chunk", chunk, "tokens per chunk")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const std::string dir = tinyllama::data_dir(data);
  auto model = tinyllama::Model::load(dir + "/stories260K.bin");
  if (!model.ok()) return fail(model.status());
  auto tok = tinyllama::Tokenizer::load(dir + "/tok512.bin");
  if (!tok.ok()) return fail(tok.status());
  auto profile = codec::Profile::load_file(profile_path);
  if (!profile.ok()) return fail(profile.status());

  const std::vector<int> ids = tok->encode(prompt, true, false);
  auto exact = model->calculate_kv(ids);
  if (!exact.ok()) return fail(exact.status());
  const KvGeometry g = exact->geometry();
  const uint64_t elems = exact->tokens() * g.elements_per_token();
  fmt::print("context: {} tokens, {} layers x {} planes x {} channels = {} KV elements ({} bytes as fp16)\n\n",
             ids.size(), g.layers, g.planes(), g.channels(), elems, elems * 2);

  auto reference = model->generate_with_kv(exact->view(), ids, steps);
  if (!reference.ok()) return fail(reference.status());
  // The finest level whose profile-measured perplexity increase is above 1% marks
  // the end of the "within 1%" range; show the story from the coarsest level within it.
  uint32_t shown = 0;
  for (uint32_t L = 0; L < profile->levels(); ++L)
    if (profile->level(L).ppl_increase_pct >= 0 && profile->level(L).ppl_increase_pct <= 1.0) shown = L;
  std::vector<int> shown_tokens;

  fmt::print("{:>5} {:>10} {:>10} {:>9} {:>10} {:>12} {:>22}\n", "level", "bytes", "bits/elem", "vs fp16", "decode us",
             "ppl incr %", "tokens as with exact");
  codec::DecodeScratch scratch;
  for (uint32_t L = 0; L < profile->levels(); ++L) {
    auto decoded = KvCache::create(g, DType::f16, exact->tokens());
    if (!decoded.ok()) return fail(decoded.status());
    size_t bytes = 0;
    double decode_s = 0;
    std::vector<uint8_t> buf;
    for (uint64_t b = 0; b < exact->tokens(); b += uint64_t(chunk)) {
      const TokenRange r{b, std::min<uint64_t>(exact->tokens(), b + uint64_t(chunk))};
      auto src = exact->view().slice(r);
      auto dst = decoded->view().slice(r);
      buf.clear();
      if (auto s = codec::encode_chunk(*profile, *src, L, buf); !s.ok()) return fail(s);
      bytes += buf.size();
      const auto t0 = std::chrono::steady_clock::now();
      if (auto s = codec::decode_chunk(*profile, buf, *dst, &scratch); !s.ok()) return fail(s);
      decode_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    auto out = model->generate_with_kv(decoded->view(), ids, steps);
    if (!out.ok()) return fail(out.status());
    size_t same = 0;
    while (same < out->size() && same < reference->size() && (*out)[same] == (*reference)[same]) ++same;
    if (L == shown) shown_tokens = *out;
    fmt::print("{:>5} {:>10} {:>10.3f} {:>8.1f}x {:>10.1f} {:>12.3f} {:>15} of {:>3}\n", L, bytes,
               double(bytes) * 8 / double(elems), double(elems * 2) / double(bytes), decode_s * 1e6,
               profile->level(L).ppl_increase_pct, same, reference->size());
  }
  auto ref_text = tok->decode_all(*reference);
  auto shown_text = tok->decode_all(shown_tokens);
  if (!ref_text.ok() || !shown_text.ok()) return fail(ref_text.ok() ? shown_text.status() : ref_text.status());
  fmt::print("\nprompt: {}\n", prompt);
  fmt::print("\nfrom the exact KV cache:\n  {}\n", *ref_text);
  fmt::print("\nfrom level {} ({:.2f} bits per element, {:.1f}x smaller than fp16):\n  {}\n", shown,
             profile->level(shown).bits_per_element, 16.0 / profile->level(shown).bits_per_element, *shown_text);
  return 0;
}
