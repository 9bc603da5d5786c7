// kvstream-bench eviction: a store bounded to a share of what its prompts take, under
// requests that reuse prompts with Zipf popularity (every prompt starting with one
// shared system prompt), as a runtime drives it: look the prompt up, fetch the stored
// prefix, compute and put the rest, evict down to the bound. The anchor is the order
// before use marks (eviction.by_use false: the deepest chunks first, the oldest stored
// among equally deep), run on the same request sequence in the same process; the
// figure is the share of requested tokens found stored. Then the cost of one eviction
// listing over a store of many chunks, both orders alternated rep by rep.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvstream/kv_store.hpp"
#include "perf/assembled_kv.hpp"
#include "perf/bench.hpp"
#include "store/chunk_record.hpp"

namespace kvstream::bench {

using namespace std::chrono_literals;
using transport::deadline_in;

namespace {

const std::string kSecret = "bench-secret-0123456789";

struct Workload {
  std::vector<std::vector<Token>> prompts;
  std::vector<uint32_t> sequence;  // the prompt of each request
};

// Prompt k: the shared system prompt, then tokens of its own. Popularity follows a
// shuffled rank, so a popular prompt is not necessarily one seen early.
Workload make_workload(const EvictionBenchOptions& o) {
  Workload w;
  std::mt19937_64 rng(o.seed);
  std::vector<Token> shared(size_t(o.shared_chunks) * o.chunk_tokens);
  for (auto& t : shared) t = Token(1 + rng() % 500);
  for (uint32_t k = 0; k < o.prompts; ++k) {
    std::vector<Token> p = shared;
    for (uint32_t i = 0; i < o.own_chunks * o.chunk_tokens; ++i) p.push_back(Token(1 + rng() % 500));
    w.prompts.push_back(std::move(p));
  }
  std::vector<double> weight(o.prompts);
  for (uint32_t k = 0; k < o.prompts; ++k) weight[k] = 1.0 / std::pow(double(k + 1), o.zipf);
  std::shuffle(weight.begin(), weight.end(), rng);
  std::discrete_distribution<uint32_t> pick(weight.begin(), weight.end());
  for (uint32_t r = 0; r < o.requests; ++r) w.sequence.push_back(pick(rng));
  return w;
}

// Where a run's store keeps its chunks: a node started here (on a directory of its
// own), or the Redis server at --redis under a namespace of its own.
struct Backing {
  BenchNode node;
  std::string redis, name_space;
  bool redis_cluster = false;
  // Requests the node served so far (0 on Redis: not counted there).
  [[nodiscard]] uint64_t requests() const { return node.server ? node.server->counters().requests : 0; }
};

Result<Backing> open_backing(const EvictionBenchOptions& o, const std::string& dir, const std::string& name) {
  Backing b;
  if (!o.redis.empty()) {
    b.redis = o.redis, b.redis_cluster = o.redis_cluster;
    b.name_space = fmt::format("bench-{}-{}-{}", ::getpid(), name, o.seed);
    return b;
  }
  KVS_ASSIGN_OR_RETURN(b.node, open_bench_node("", "tcp", kSecret, dir));
  return b;
}

StoreConfig store_config(const Backing& backing, const std::string& profile_path, uint32_t chunk_tokens, bool by_use) {
  StoreConfig sc;
  if (!backing.redis.empty()) {
    sc.storage.kind = backing.redis_cluster ? "redis-cluster" : "redis";
    sc.storage.address = backing.redis;
    sc.storage.name_space = backing.name_space;
  } else {
    sc.storage.address = backing.node.client.address;
    sc.storage.name_space = backing.node.client.name_space;
    sc.storage.secret = backing.node.client.secret;
  }
  sc.codec.profile_path = profile_path;
  sc.codec.model_id = "bench";
  sc.codec.chunk_tokens = chunk_tokens;
  sc.eviction.by_use = by_use;
  sc.log.level = "warn";
  return sc;
}

struct HitRun {
  uint64_t tokens_requested = 0, tokens_found = 0;
  uint32_t whole_hits = 0, puts = 0, evictions = 0;
  uint64_t chunks_evicted = 0;
  double evict_seconds = 0;
  uint64_t evict_requests = 0;  // requests the node served for the evictions
  [[nodiscard]] double hit_rate() const { return tokens_requested ? double(tokens_found) / double(tokens_requested) : 0; }
};

// One pass of the workload on a fresh node: bounded to `max_bytes`.
Result<HitRun> run_hits(const EvictionBenchOptions& o, const AssembledSetup& setup, const std::string& profile_path,
                        const Workload& w, bool by_use, uint64_t max_bytes, const std::string& dir) {
  KVS_ASSIGN_OR_RETURN(Backing node, open_backing(o, dir, by_use ? "hits-use" : "hits-depth"));
  KVS_ASSIGN_OR_RETURN(KvStore store, KvStore::open(store_config(node, profile_path, o.chunk_tokens, by_use)));
  KVS_ASSIGN_OR_RETURN(KvCache dest, KvCache::create(setup.geometry, DType::f16, setup.context.tokens()));
  FetchOptions fo;
  fo.level = setup.profile.levels() - 1;  // the coarsest: this measures what is found, not transfer
  HitRun r;
  for (uint32_t p : w.sequence) {
    const auto& tokens = w.prompts[p];
    KVS_ASSIGN_OR_RETURN(uint64_t found, store.lookup(tokens, deadline_in(30s)));
    r.tokens_requested += tokens.size(), r.tokens_found += found;
    r.whole_hits += found == tokens.size();
    if (found > 0) {
      KVS_ASSIGN_OR_RETURN(StoreFetch f, store.fetch(std::span(tokens).first(found), {.host = dest.view()},
                                                     deadline_in(30s), fo));
      KVS_RETURN_IF_ERROR(f.wait().status());
    }
    if (found == tokens.size()) continue;
    KVS_RETURN_IF_ERROR(store.put(tokens, setup.context.view(), deadline_in(60s)).status());
    ++r.puts;
    const uint64_t before = node.requests();
    const auto t0 = transport::Clock::now();
    KVS_ASSIGN_OR_RETURN(EvictReport ev, store.evict(max_bytes, 0s, deadline_in(60s)));
    r.evict_seconds += since(t0);
    r.evict_requests += node.requests() - before;
    ++r.evictions;
    r.chunks_evicted += ev.chunks_removed;
  }
  return r;
}

struct ScanCost {
  double seconds = 0;      // median of the reps
  uint64_t requests = 0;   // the node's, per listing
};

// `chunks` chunks in chains of five (each chunk a small object and its record, marked
// as a store marks a prompt), then evict(0) (which reads the listing and removes
// nothing) timed under both orders, alternated.
Result<std::pair<ScanCost, ScanCost>> scan_cost(const EvictionBenchOptions& o, const AssembledSetup& setup,
                                                const std::string& profile_path, const std::string& dir) {
  KVS_ASSIGN_OR_RETURN(Backing node, open_backing(o, dir, "scan"));
  KVS_ASSIGN_OR_RETURN(KvStore by_use, KvStore::open(store_config(node, profile_path, o.chunk_tokens, true)));
  KVS_ASSIGN_OR_RETURN(KvStore by_depth, KvStore::open(store_config(node, profile_path, o.chunk_tokens, false)));
  const uint32_t ct = o.chunk_tokens;
  std::mt19937_64 rng(o.seed + 7);
  std::vector<std::byte> level(2048);
  for (auto& b : level) b = std::byte(rng());
  for (uint32_t made = 0; made < o.scan_chunks; made += 5) {
    std::vector<Token> tokens(5 * ct);
    for (auto& t : tokens) t = Token(1 + rng() % 500);
    const auto keys = by_use.chunk_keys(tokens);
    std::vector<storage::ContextTouch> marks;
    for (uint32_t c = 0; c < keys.size(); ++c) {
      KVS_RETURN_IF_ERROR(by_use.client().put(keys[c], store::kLevelsChunk, 0, level, deadline_in(30s)));
      store::ChunkRecord rec{ct, uint64_t(c) * ct, 0, setup.profile.levels()};
      KVS_RETURN_IF_ERROR(by_use.client().put(keys[c], store::kRecordChunk, 0, store::serialize(rec), deadline_in(30s)));
      marks.push_back({keys[c], c});
    }
    KVS_RETURN_IF_ERROR(by_use.client().touch(marks, 0, deadline_in(30s)));
  }
  std::vector<double> use_s, depth_s;
  ScanCost use, depth;
  for (uint32_t rep = 0; rep < o.scan_reps; ++rep) {
    for (KvStore* s : {&by_depth, &by_use}) {
      const uint64_t before = node.requests();
      const auto t0 = transport::Clock::now();
      KVS_ASSIGN_OR_RETURN(EvictReport ev, s->evict(0, 0s, deadline_in(120s)));
      (s == &by_use ? use_s : depth_s).push_back(since(t0));
      (s == &by_use ? use : depth).requests = node.requests() - before;
      if (ev.chunks_removed != 0) return make_status(StatusCode::internal, "a listing removed chunks");
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  use.seconds = median(use_s), depth.seconds = median(depth_s);
  return std::pair{use, depth};
}

}  // namespace

int run_eviction_bench(const EvictionBenchOptions& o) {
  const Fail fail{"eviction"};
  if (o.prompts == 0 || o.own_chunks + o.shared_chunks == 0 || o.chunk_tokens == 0 || o.requests == 0 ||
      o.scan_reps == 0)
    return fail(make_status(StatusCode::invalid_argument, "prompts, chunks, chunk tokens, requests and reps must be > 0"));
  const uint64_t prompt_tokens = uint64_t(o.shared_chunks + o.own_chunks) * o.chunk_tokens;
  auto setup = assemble_setup("tinyllama", prompt_tokens, o.data);
  if (!setup.ok()) return fail(setup.status());
  const ScratchDir scratch("kvstream-bench-eviction");
  const auto& base = scratch.path;
  const std::string profile_path = (base / "bench.kvsprofile").string();
  if (Status s = setup->profile.save_file(profile_path); !s.ok()) return fail(s);
  const Workload w = make_workload(o);

  // The bytes of one prompt's own chunks and of the shared ones, from a store of one.
  uint64_t all_bytes = 0;
  {
    auto node = open_backing(o, (base / "probe").string(), "probe");
    if (!node.ok()) return fail(node.status());
    auto store = KvStore::open(store_config(*node, profile_path, o.chunk_tokens, true));
    if (!store.ok()) return fail(store.status());
    for (uint32_t k = 0; k < 2; ++k)
      if (auto put = store->put(w.prompts[k], setup->context.view(), deadline_in(60s)); !put.ok())
        return fail(put.status());
    auto two = store->evict(0, 0s, deadline_in(60s));
    if (!two.ok()) return fail(two.status());
    // Two prompts: the shared chunks once and two prompts' own.
    const uint64_t per_chunk = two->bytes_kept / (o.shared_chunks + 2 * o.own_chunks);
    all_bytes = per_chunk * (o.shared_chunks + uint64_t(o.prompts) * o.own_chunks);
  }
  const uint64_t max_bytes = uint64_t(o.capacity * double(all_bytes));
  if (!o.redis.empty())
    fmt::print("on the Redis {} at {} (node requests not counted there)\n", o.redis_cluster ? "cluster" : "server",
               o.redis);
  fmt::print("{} prompts of {} tokens ({} shared chunks, {} own, {} tokens each); {} requests, Zipf {}; the store "
             "bounded to {:.0f}% of the {:.1f} MiB they take\n",
             o.prompts, prompt_tokens, o.shared_chunks, o.own_chunks, o.chunk_tokens, o.requests, o.zipf,
             100 * o.capacity, double(all_bytes) / (1 << 20));

  nlohmann::json j;
  j["prompts"] = o.prompts, j["requests"] = o.requests, j["zipf"] = o.zipf, j["capacity"] = o.capacity;
  HitRun runs[2];
  for (int by_use = 0; by_use < 2; ++by_use) {
    auto r = run_hits(o, *setup, profile_path, w, by_use, max_bytes, (base / fmt::format("hits-{}", by_use)).string());
    if (!r.ok()) return fail(r.status());
    runs[by_use] = *r;
  }
  fmt::print("\n| order | tokens found | whole prompts found | puts | chunks evicted | evict ms (mean) | node requests "
             "per evict |\n|---|---|---|---|---|---|---|\n");
  const char* names[2] = {"deepest, then oldest stored (anchor)", "least recently used (use marks)"};
  for (int i = 0; i < 2; ++i) {
    const HitRun& r = runs[i];
    fmt::print("| {} | {:.1f}% | {} of {} | {} | {} | {:.2f} | {:.1f} |\n", names[i], 100 * r.hit_rate(), r.whole_hits,
               o.requests, r.puts, r.chunks_evicted, r.evictions ? 1e3 * r.evict_seconds / r.evictions : 0.0,
               r.evictions ? double(r.evict_requests) / r.evictions : 0.0);
    j[i ? "by_use" : "by_depth"] = {{"hit_rate", r.hit_rate()},       {"whole_hits", r.whole_hits},
                                    {"puts", r.puts},                 {"chunks_evicted", r.chunks_evicted},
                                    {"evict_seconds", r.evict_seconds}, {"evict_requests", r.evict_requests}};
  }
  const double miss_old = 1 - runs[0].hit_rate(), miss_new = 1 - runs[1].hit_rate();
  fmt::print("\ntokens found: {:.3f}x the anchor's; tokens to recompute: {:.3f}x\n",
             runs[0].hit_rate() > 0 ? runs[1].hit_rate() / runs[0].hit_rate() : 0.0,
             miss_old > 0 ? miss_new / miss_old : 0.0);

  if (o.scan_chunks > 0) {
    auto cost = scan_cost(o, *setup, profile_path, (base / "scan").string());
    if (!cost.ok()) return fail(cost.status());
    const auto& [use, depth] = *cost;
    fmt::print("\none eviction listing over {} chunks (median of {}):\n| order | ms | node requests |\n|---|---|---|\n"
               "| deepest, then oldest stored (anchor: a list, a stat and a record read per chunk) | {:.1f} | {} |\n"
               "| least recently used (one usage listing) | {:.1f} | {} |\n{:.3f}x the anchor's time\n",
               o.scan_chunks, o.scan_reps, 1e3 * depth.seconds, depth.requests, 1e3 * use.seconds, use.requests,
               depth.seconds > 0 ? use.seconds / depth.seconds : 0.0);
    j["scan"] = {{"chunks", o.scan_chunks},
                 {"by_depth_seconds", depth.seconds},
                 {"by_depth_requests", depth.requests},
                 {"by_use_seconds", use.seconds},
                 {"by_use_requests", use.requests}};
  }
  if (!o.json.empty()) std::ofstream(o.json) << j.dump(2) << "\n";
  return 0;
}

}  // namespace kvstream::bench
