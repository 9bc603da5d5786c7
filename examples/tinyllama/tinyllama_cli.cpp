// kvstream-tinyllama: generate text, score perplexity, dump KV caches, tokenize and
// print reference logits with the tinyllama reference runtime.
#include <cstdio>
#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "examples/tinyllama/tinyllama.hpp"

namespace {

int fail(const kvstream::Status& s) {
  fmt::print(stderr, "kvstream-tinyllama: {}\n", s.to_string());
  return 1;
}

struct Loaded {
  tinyllama::Model model;
  tinyllama::Tokenizer tok;
};

kvstream::Result<Loaded> load(const std::string& dir_opt) {
  const std::string dir = tinyllama::data_dir(dir_opt);
  KVS_ASSIGN_OR_RETURN(auto model, tinyllama::Model::load(dir + "/stories260K.bin"));
  KVS_ASSIGN_OR_RETURN(auto tok, tinyllama::Tokenizer::load(dir + "/tok512.bin"));
  return Loaded{std::move(model), std::move(tok)};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tinyllama reference runtime (stories260K) for kvstream"};
  app.require_subcommand(1);
  std::string data;
  app.add_option("--data", data, "tinyllama data directory (default: $KVSTREAM_TINYLLAMA or ../shared/data/tinyllama)");

  auto* gen = app.add_subcommand("generate", "greedy generation from BOS + prompt");
  int steps = 256;
  std::string prompt;
  gen->add_option("--steps", steps, "positions to run, BOS included, as llama2.c counts them")->check(CLI::Range(1, 512));
  gen->add_option("--prompt", prompt, "prompt text (default: none)");

  auto* ppl = app.add_subcommand("ppl", "perplexity of the eval text in non-overlapping [BOS]+511 windows");
  int window = 512, max_windows = 0;
  unsigned threads = 0;
  std::string text_path;
  ppl->add_option("--window", window, "tokens per window including BOS")->check(CLI::Range(2, 512));
  ppl->add_option("--max-windows", max_windows, "score only the first N windows (0: all)");
  ppl->add_option("--threads", threads, "worker threads (0: all cores)");
  ppl->add_option("--text", text_path, "text file (default: <data>/eval.txt)");

  auto* dump = app.add_subcommand("dump-kv", "compute the KV cache of a prompt and write it as raw packed floats");
  std::string out_path, dtype_name = "f32";
  dump->add_option("--prompt", prompt, "prompt text")->required();
  dump->add_option("--out", out_path, "output file: [layer][K|V][token][channel] raw elements")->required();
  dump->add_option("--dtype", dtype_name, "f32, f16 or bf16");

  auto* enc = app.add_subcommand("encode", "print the token ids of a text (no BOS)");
  std::string enc_text;
  enc->add_option("text", enc_text, "text to encode")->required();

  auto* lg = app.add_subcommand("logits",
                                 "print JSON {tokens, logits, generated}: the ids of BOS + prompt, the logits of the last "
                                 "prompt position and the greedy continuation of --steps new tokens");
  int new_steps = 0;
  lg->add_option("--prompt", prompt, "prompt text (default: none, BOS only)");
  lg->add_option("--steps", new_steps, "new tokens to generate greedily (stops early at BOS)")->check(CLI::Range(0, 512));

  CLI11_PARSE(app, argc, argv);

  auto loaded = load(data);
  if (!loaded.ok()) return fail(loaded.status());
  const tinyllama::Model& model = loaded->model;
  const tinyllama::Tokenizer& tok = loaded->tok;

  if (*gen) {
    std::vector<int> tokens = tok.encode(prompt, true, false);
    if (int(tokens.size()) > steps) tokens.resize(size_t(steps));
    // llama2.c counts steps as positions: prompt positions, then one new token per position.
    const int new_tokens = steps - int(tokens.size()) + 1;
    auto out = model.generate(tokens, new_tokens);
    if (!out.ok()) return fail(out.status());
    std::vector<int> all(tokens.begin() + 1, tokens.end());
    all.insert(all.end(), out->begin(), out->end());
    auto text = tok.decode_all(all);
    if (!text.ok()) return fail(text.status());
    fmt::print("{}\n", *text);
    return 0;
  }
  if (*ppl) {
    auto text = tinyllama::read_eval_text(text_path.empty() ? tinyllama::data_dir(data) + "/eval.txt" : text_path);
    if (!text.ok()) return fail(text.status());
    std::vector<int> ids = tok.encode(*text, false, false);
    tinyllama::PerplexityOptions opt;
    opt.window = window;
    opt.threads = threads;
    opt.max_windows = max_windows;
    auto r = tinyllama::perplexity(model, ids, opt);
    if (!r.ok()) return fail(r.status());
    fmt::print(stderr, "scored {} tokens in {} windows, mean NLL {:.4f} nats\n", r->scored_tokens, r->windows.size(),
               r->mean_nll);
    fmt::print("ppl {:.4f}\n", r->ppl);
    return 0;
  }
  if (*dump) {
    auto dt = kvstream::parse_dtype(dtype_name);
    if (!dt.ok()) return fail(dt.status());
    std::vector<int> tokens = tok.encode(prompt, true, false);
    auto kv = model.calculate_kv(tokens);
    if (!kv.ok()) return fail(kv.status());
    auto conv = kvstream::KvCache::create(kv->geometry(), *dt, kv->tokens());
    if (!conv.ok()) return fail(conv.status());
    if (auto s = kvstream::copy_kv(kv->view(), conv->view()); !s.ok()) return fail(s);
    std::ofstream f(out_path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(conv->bytes().data()), std::streamsize(conv->bytes().size()));
    if (!f) return fail(kvstream::make_status(kvstream::StatusCode::io_error, "cannot write '{}'", out_path));
    const auto g = kv->geometry();
    fmt::print("wrote {} tokens x {} layers x 2 x {} channels ({}, {} bytes) to {}\n", kv->tokens(), g.layers,
               g.channels(), kvstream::dtype_name(*dt), conv->bytes().size(), out_path);
    return 0;
  }
  if (*lg) {
    const std::vector<int> tokens = tok.encode(prompt, true, false);
    tinyllama::State st(model);
    std::vector<float> logits(size_t(model.config().vocab_size));
    if (auto s = model.forward(st, tokens, logits); !s.ok()) return fail(s);
    std::vector<int> generated;
    if (new_steps > 0) {
      auto out = model.generate(tokens, new_steps);
      if (!out.ok()) return fail(out.status());
      generated = std::move(*out);
    }
    // fmt's "{}" prints the shortest decimal that reads back as the same float.
    fmt::print("{{\"tokens\":[{}],\"logits\":[{}],\"generated\":[{}]}}\n", fmt::join(tokens, ","),
               fmt::join(logits, ","), fmt::join(generated, ","));
    return 0;
  }
  if (*enc) {
    std::vector<int> ids = tok.encode(enc_text, false, false);
    fmt::print("{}\n", fmt::join(ids, " "));
    return 0;
  }
  return 0;
}
