// fullput: what a put costs when the store is full and eviction.when_full makes room,
// against the same put into a store with room (the anchor), alternated.
// A node in-process on loopback (tcp); the tinyllama profile; KV of the profile's
// geometry filled with synthetic values (the codec's work is the same for both).
// Usage: fullput PROFILE PROMPTS ROUNDS [FRACTION]   (PROMPTS stored prompts of 4
// chunks each; FRACTION: eviction.when_full_fraction, default the library's)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>

#include "kvstream/kvstream.hpp"
#include "tests/codec/synthetic_kv.hpp"

using namespace kvstream;
using Clk = std::chrono::steady_clock;

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) return std::fprintf(stderr, "usage: fullput PROFILE PROMPTS ROUNDS [FRACTION]\n"), 2;
  const std::string profile_path = argv[1];
  const int prompts = std::atoi(argv[2]), rounds = std::atoi(argv[3]);
  set_log_level(LogLevel::warn);
  const auto dir = std::filesystem::temp_directory_path() / ("fullput-" + std::to_string(::getpid()));
  storage::ServerConfig sc;
  sc.address = "127.0.0.1:0";
  sc.directory = (dir / "node").string();
  sc.secrets = {{"ns", "fullput-secret-0123456"}};
  auto node = storage::Server::start(sc);
  if (!node.ok()) return std::fprintf(stderr, "%s\n", node.status().to_string().c_str()), 1;
  StoreConfig c;
  c.storage.address = (*node)->address();
  c.storage.name_space = "ns";
  c.storage.secret = "fullput-secret-0123456";
  c.codec.profile_path = profile_path;
  c.codec.model_id = "bench";
  c.eviction.when_full = true;
  if (argc == 5) c.eviction.when_full_fraction = std::atof(argv[4]);
  auto store = KvStore::open(c);
  if (!store.ok()) return std::fprintf(stderr, "%s\n", store.status().to_string().c_str()), 1;
  const uint32_t ct = store->chunk_tokens(), tokens = 4 * ct;
  auto kv = KvCache::create(store->geometry(), DType::f16, tokens).value();
  test_util::fill_synthetic(kv, RopeParams{}, 7);
  uint32_t seed = 1;
  auto fresh = [&] {
    std::vector<Token> t(tokens);
    std::mt19937 rng(seed++);
    for (auto& x : t) x = Token(rng() % 512);
    return t;
  };
  auto deadline = [] { return transport::deadline_in(std::chrono::seconds(60)); };
  for (int i = 0; i < prompts; ++i)
    if (auto p = store->put(fresh(), kv.view(), deadline()); !p.ok())
      return std::fprintf(stderr, "%s\n", p.status().to_string().c_str()), 1;
  const uint64_t full = store->evict(0, std::chrono::seconds(0), deadline())->bytes_kept;
  std::vector<double> roomy, evicting;
  uint64_t evicted = 0;
  for (int r = 0; r < rounds; ++r) {
    (*node)->set_namespace_quotas(0, {});  // room
    auto t = fresh();
    auto t0 = Clk::now();
    auto p = store->put(t, kv.view(), deadline());
    roomy.push_back(std::chrono::duration<double, std::milli>(Clk::now() - t0).count());
    if (!p.ok() || p->evicted_chunks) return std::fprintf(stderr, "anchor put: %s\n", p.status().to_string().c_str()), 1;
    (void)store->remove(t, deadline());
    (*node)->set_namespace_quotas(full, {});  // full: this put must evict
    t0 = Clk::now();
    p = store->put(fresh(), kv.view(), deadline());
    evicting.push_back(std::chrono::duration<double, std::milli>(Clk::now() - t0).count());
    if (!p.ok()) return std::fprintf(stderr, "full put: %s\n", p.status().to_string().c_str()), 1;
    evicted += p->evicted_chunks;
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s / double(v.size());
  };
  std::printf("%d prompts (%d chunks, %.1f MB); a put of 4 chunks, with room / full: median %.2f / %.2f ms (%.2fx), "
              "mean %.2f / %.2f ms (%.2fx), slowest %.2f / %.2f ms; %.1f chunks evicted per put\n",
              prompts, prompts * 4, full / 1e6, median(roomy), median(evicting), median(evicting) / median(roomy),
              mean(roomy), mean(evicting), mean(evicting) / mean(roomy), *std::max_element(roomy.begin(), roomy.end()),
              *std::max_element(evicting.begin(), evicting.end()), double(evicted) / rounds);
  store = Status(StatusCode::cancelled, "done");
  node->reset();
  std::filesystem::remove_all(dir);
  return 0;
}
