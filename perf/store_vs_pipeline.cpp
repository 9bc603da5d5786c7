// The front door's cost: the same whole chunks fetched through KvStore (one call:
// keys, the stat of each chunk, the request) and through the hand-assembled pipeline
// (the caller's context id, one stat, the request), on one node and one client
// config, alternated rep by rep so that the noise of a shared machine falls on both.
#include "perf/store_vs_pipeline.hpp"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "kvstream/kv_store.hpp"
#include "perf/bench.hpp"
#include "store/chunk_record.hpp"

namespace kvstream::bench {

using namespace std::chrono_literals;
using transport::Clock;
using transport::deadline_in;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
}  // namespace

Result<StoreVsPipeline> compare_store_with_pipeline(const StoreComparison& in) {
  const uint32_t ct = in.chunk_tokens;
  const size_t whole = in.tokens / ct;
  if (whole == 0 || in.chunks.size() < whole)
    return make_status(StatusCode::invalid_argument, "no whole {}-token chunk to compare", ct);
  // The profile as a file, as a StoreConfig names it.
  const std::string profile_path = (std::filesystem::path(in.directory) / "store-compare.kvsprofile").string();
  KVS_RETURN_IF_ERROR(in.profile->save_file(profile_path));
  StoreConfig sc;
  sc.storage.address = in.client.address;
  sc.storage.backend = in.client.backend.name;
  sc.storage.name_space = in.client.name_space;
  sc.storage.secret = in.client.secret;
  sc.storage.connections = in.client.connections;
  sc.codec.profile_path = profile_path;
  sc.codec.model_id = "bench";
  sc.codec.chunk_tokens = ct;
  sc.pipeline.depth = in.pipeline.depth;
  sc.pipeline.max_chunk_bytes = in.pipeline.max_chunk_bytes;
  sc.pipeline.decode_threads = in.pipeline.decode_threads;
  sc.pipeline.max_on_wire = in.pipeline.max_on_wire;
  sc.log.level = "warn";
  KVS_ASSIGN_OR_RETURN(KvStore store, KvStore::open(sc));

  // The chunks already encoded at the benchmark's level go under the store's keys
  // (with their records), so both paths fetch the very same bytes; put() would
  // encode every level, which this benchmark does not measure.
  std::vector<Token> tokens(whole * ct);
  for (size_t t = 0; t < tokens.size(); ++t) tokens[t] = Token(1 + (t * 7919) % 500);
  const auto keys = store.chunk_keys(tokens);
  for (size_t c = 0; c < whole; ++c) {
    KVS_RETURN_IF_ERROR(store.client().put(keys[c], store::kLevelsChunk, in.level,
                                           std::as_bytes(std::span(in.chunks[c])), deadline_in(60s)));
    store::ChunkRecord rec{ct, uint64_t(c) * ct, 0, in.profile->levels()};
    KVS_RETURN_IF_ERROR(store.client().put(keys[c], store::kRecordChunk, 0, store::serialize(rec), deadline_in(60s)));
  }
  KVS_ASSIGN_OR_RETURN(uint64_t found, store.lookup(tokens, deadline_in(10s)));
  if (found != tokens.size())
    return make_status(StatusCode::internal, "the store finds {} of the {} tokens put", found, tokens.size());

  // The hand-assembled path on the same client settings.
  KVS_ASSIGN_OR_RETURN(auto client, storage::Client::connect(in.client, deadline_in(10s)));
  KVS_ASSIGN_OR_RETURN(auto pipe, pipeline::Pipeline::create(*client, *in.profile, in.pipeline));
  std::vector<TokenRange> ranges;
  for (size_t c = 0; c < whole; ++c) ranges.push_back({c * ct, (c + 1) * ct});

  KVS_ASSIGN_OR_RETURN(KvCache dest, KvCache::create(in.profile->geometry(), DType::f16, whole * ct));
  StoreVsPipeline r;
  r.chunks = uint32_t(whole);
  std::vector<double> store_s, fetch_s, pipe_s;
  FetchOptions fo;
  fo.level = in.level;
  for (uint32_t rep = 0; rep < in.reps; ++rep) {
    // KvStore: lookup and fetch, as a runtime calls them.
    auto t0 = Clock::now();
    KVS_ASSIGN_OR_RETURN(uint64_t n, store.lookup(tokens, deadline_in(60s)));
    const auto t_fetch = Clock::now();
    KVS_ASSIGN_OR_RETURN(StoreFetch f, store.fetch(std::span(tokens).first(n), {.host = dest.view()},
                                                   deadline_in(600s), fo));
    KVS_ASSIGN_OR_RETURN(FetchReport rep_s, f.wait());
    store_s.push_back(since(t0));
    fetch_s.push_back(since(t_fetch));
    r.store_bytes = rep_s.bytes;

    // By hand: the pipeline's own stat of the caller's context, then the fetch.
    pipeline::FetchRequest req;
    req.context = "bench-ctx";
    req.destination = dest.view();
    req.chunks = ranges;
    req.deadline = deadline_in(600s);
    pipeline::FetchCallbacks cb;
    cb.decide = [level = in.level](uint32_t, std::span<const uint64_t>) {
      return pipeline::ChunkDecision{pipeline::ChunkDecision::Action::fetch, level};
    };
    t0 = Clock::now();
    KVS_ASSIGN_OR_RETURN(auto hf, pipe->fetch(req, cb));
    KVS_RETURN_IF_ERROR(hf->wait());
    pipe_s.push_back(since(t0));
    uint64_t b = 0;
    for (const auto& t : hf->timings()) b += t.bytes;
    r.pipeline_bytes = b;
  }
  r.store_s = median(store_s);
  r.pipeline_s = median(pipe_s);
  r.store_fetch_s = median(fetch_s);
  r.store_all_s = store_s;
  r.pipeline_all_s = pipe_s;
  pipe.reset();  // before the client it uses
  return r;
}

}  // namespace kvstream::bench
