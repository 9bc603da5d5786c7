// The reference runtime against the numbers in the data README.
#include <gtest/gtest.h>

#include <filesystem>

#include "examples/tinyllama/tinyllama.hpp"

namespace {

struct Data {
  std::string dir;
  tinyllama::Model model;
  tinyllama::Tokenizer tok;
};

// Loads once; empty when the data is absent so each test can skip with a message.
const Data* data() {
  static const std::unique_ptr<Data> d = []() -> std::unique_ptr<Data> {
    const std::string dir = tinyllama::data_dir();
    if (!std::filesystem::exists(dir + "/stories260K.bin")) return nullptr;
    auto m = tinyllama::Model::load(dir + "/stories260K.bin");
    auto t = tinyllama::Tokenizer::load(dir + "/tok512.bin");
    if (!m.ok() || !t.ok()) return nullptr;
    return std::make_unique<Data>(Data{dir, std::move(m).value(), std::move(t).value()});
  }();
  return d.get();
}

#define NEED_DATA()                                                                                          \
  const Data* D = data();                                                                                    \
  if (!D) GTEST_SKIP() << "tinyllama data not found at '" << tinyllama::data_dir()                           \
                       << "' (set KVSTREAM_TINYLLAMA to the directory holding stories260K.bin and tok512.bin)"

constexpr const char* kReference =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a "
    "big, red ball. She wanted to play with it, but it was too high.\n"
    "Lily's mom said, \"Lily, let's go to the park.\" Lily was sad and didn't know what to do. She said, \"I want to "
    "play with your ball, but I can't find it.\"\n"
    "Lily was sad and didn't know what to do. She said, \"I'm sorry, Lily. I didn't know what to do.\"\n"
    "Lily didn't want to help her mom, so she said, \"I'm sorry, mom. I didn't know what to do.\" Her mom said, "
    "\"Don't worry, Lily. We can help you.";

}  // namespace

TEST(Tinyllama, TokenizerMatchesReferenceIds) {
  NEED_DATA();
  const std::vector<int> expect = {403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 13, 437,
                                   260, 336, 432, 313, 440, 417, 443, 436, 410, 475, 479, 472, 280, 412, 431, 485};
  EXPECT_EQ(D->tok.encode("Once upon a time, there was a little girl named Lily.\nShe said, \"Hi!\" 123 café", false,
                          false),
            expect);
  auto text = D->tok.decode_all(expect);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "Once upon a time, there was a little girl named Lily.\nShe said, \"Hi!\" 123 café");
  EXPECT_FALSE(D->tok.decode(1, 512).ok());
  EXPECT_FALSE(D->tok.decode(1, -1).ok());
}

TEST(Tinyllama, EvalTextTokenCount) {
  NEED_DATA();
  auto text = tinyllama::read_eval_text(D->dir + "/eval.txt");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->size(), 203596u);
  EXPECT_EQ(D->tok.encode(*text, false, false).size(), 98883u);
}

TEST(Tinyllama, GreedyFromBosMatchesReference) {
  NEED_DATA();
  const std::vector<int> bos = {tinyllama::kBos};
  auto out = D->model.generate(bos, 256);
  ASSERT_TRUE(out.ok());
  auto text = D->tok.decode_all(*out);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, kReference);
}

TEST(Tinyllama, PerplexityOfWholeEvalText) {
  NEED_DATA();
  auto text = tinyllama::read_eval_text(D->dir + "/eval.txt");
  ASSERT_TRUE(text.ok());
  const auto ids = D->tok.encode(*text, false, false);
  auto r = tinyllama::perplexity(D->model, ids, {});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->scored_tokens, 98883u);
  EXPECT_NEAR(r->ppl, 4.138, 0.005);
  EXPECT_NEAR(r->mean_nll, 1.4203, 0.0005);
  // The first 16 windows: 3.828 in the README.
  double nll = 0;
  uint64_t n = 0;
  for (int i = 0; i < 16; ++i) nll += r->windows[i].nll_sum, n += r->windows[i].scored;
  EXPECT_EQ(n, 8176u);
  EXPECT_NEAR(std::exp(nll / double(n)), 3.828, 0.005);
}

TEST(Tinyllama, GenerateWithKvEqualsGenerateWithout) {
  NEED_DATA();
  const auto prompt = D->tok.encode("Tom had a red kite. One windy day he", true, false);
  auto plain = D->model.generate(prompt, 40);
  ASSERT_TRUE(plain.ok());
  // A cache of the whole prompt, and of part of it, in f32 and in a paged-free f16 copy.
  for (size_t covered : {prompt.size(), prompt.size() - 3, size_t(1)}) {
    auto kv = D->model.calculate_kv(std::span<const int>(prompt).first(covered));
    ASSERT_TRUE(kv.ok());
    auto with = D->model.generate_with_kv(kv->view(), prompt, 40);
    ASSERT_TRUE(with.ok()) << with.status().to_string();
    EXPECT_EQ(*with, *plain) << "cache covering " << covered << " tokens";
  }
  // The K in the cache is after RoPE and the cache carries RoPE's parameters.
  auto kv = D->model.calculate_kv(prompt);
  EXPECT_TRUE(kv->rope().enabled);
  EXPECT_EQ(kv->geometry().kind, kvstream::AttentionKind::gqa);
  EXPECT_EQ(kv->geometry().channels(), 32u);
}

TEST(Tinyllama, ContextTransformIsApplied) {
  NEED_DATA();
  auto text = tinyllama::read_eval_text(D->dir + "/eval.txt");
  const auto ids = D->tok.encode(*text, false, false);
  tinyllama::PerplexityOptions opt;
  opt.context_tokens = 384;
  opt.max_windows = 4;
  auto exact = tinyllama::perplexity(D->model, ids, opt);
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ(exact->scored_tokens, 4u * 128u);
  // Zeroing V of the context must hurt; an identity transform must not change anything.
  opt.transform = [](kvstream::KvCache&) { return kvstream::Status{}; };
  auto same = tinyllama::perplexity(D->model, ids, opt);
  EXPECT_DOUBLE_EQ(same->mean_nll, exact->mean_nll);
  opt.transform = [](kvstream::KvCache& kv) {
    for (uint32_t l = 0; l < kv.geometry().layers; ++l)
      for (uint64_t t = 0; t < kv.tokens(); ++t)
        for (uint32_t c = 0; c < kv.geometry().channels(); ++c) kv.set(l, 1, t, c, 0.0f);
    return kvstream::Status{};
  };
  auto broken = tinyllama::perplexity(D->model, ids, opt);
  EXPECT_GT(broken->mean_nll, exact->mean_nll + 0.05);
  opt.transform = [](kvstream::KvCache&) { return kvstream::make_status(kvstream::StatusCode::corrupt_data, "x"); };
  EXPECT_EQ(tinyllama::perplexity(D->model, ids, opt).status().code(), kvstream::StatusCode::corrupt_data);
}

TEST(Tinyllama, BadInputsAreErrors) {
  NEED_DATA();
  tinyllama::State st(D->model);
  const std::vector<int> bad = {1, 600};
  EXPECT_EQ(D->model.forward(st, bad, {}).code(), kvstream::StatusCode::invalid_argument);
  EXPECT_FALSE(tinyllama::Model::load(D->dir + "/tok512.bin").ok());
  EXPECT_FALSE(tinyllama::Model::load("/nonexistent/model.bin").ok());
}
