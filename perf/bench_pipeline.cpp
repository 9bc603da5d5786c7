// kvstream-bench pipeline: transfer alone, decode alone and the pipelined fetch of one
// context, measured in one run; overlap efficiency = max(transfer, decode) / pipelined.
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvstream/pipeline.hpp"
#include "examples/tinyllama/eval_harness.hpp"
#include "perf/assembled_kv.hpp"
#include "perf/bench.hpp"

namespace kvstream::bench {

using namespace std::chrono_literals;
using transport::Clock;
using transport::deadline_in;

namespace {
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
int fail(const Status& s) {
  fmt::print(stderr, "kvstream-bench pipeline: {}\n", s.to_string());
  return 1;
}
}  // namespace

int run_pipeline_bench(const PipelineBenchOptions& o) {
  auto geom = named_geometry(o.geometry);
  if (!geom.ok()) return fail(geom.status());
  auto d = tinyllama::load_eval_data(tinyllama::data_dir(o.data));
  if (!d.ok()) return fail(d.status());
  // Profile from the first half, context from the second half (assembled).
  auto train_src = source_windows(d->model, d->first_half, 48);
  auto test_src = source_windows(d->model, d->second_half, 48);
  if (!train_src.ok() || !test_src.ok()) return fail(train_src.ok() ? test_src.status() : train_src.status());
  const auto t_asm = Clock::now();
  auto train = assemble_kv(*geom, 2 * uint64_t(o.profile_tokens), *train_src, 1);
  auto ctx = assemble_kv(*geom, o.tokens, *test_src, 1);  // same channel mapping as the profile's samples
  if (!train.ok() || !ctx.ok()) return fail(train.ok() ? ctx.status() : train.status());
  fmt::print(stderr, "assembled {} x {} tokens of {} in {:.1f} s\n", o.geometry, o.tokens, o.geometry, since(t_asm));
  std::vector<KvView> samples;
  for (const auto& r : codec::chunk_ranges(train->tokens(), o.profile_tokens)) samples.push_back(*train->view().slice(r));
  codec::ProfileOptions po;
  po.max_transform_block = o.max_transform_block;
  const auto t_prof = Clock::now();
  auto profile = codec::ProfileBuilder::build(samples, RopeParams{}, po);
  if (!profile.ok()) return fail(profile.status());
  const uint32_t level = std::min(o.level, profile->levels() - 1);
  fmt::print(stderr, "profile in {:.1f} s; level {} ({:.2f} bits/element on the profile samples)\n", since(t_prof),
             level, profile->level(level).bits_per_element);

  // Encode the context.
  const auto ranges = codec::chunk_ranges(o.tokens, o.chunk_tokens);
  std::vector<std::vector<uint8_t>> chunks(ranges.size());
  uint64_t bytes = 0, max_chunk = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (Status s = codec::encode_chunk(*profile, *ctx->view().slice(ranges[i]), level, chunks[i]); !s.ok()) return fail(s);
    bytes += chunks[i].size();
    max_chunk = std::max<uint64_t>(max_chunk, chunks[i].size());
  }
  const uint64_t elems = o.tokens * geom->elements_per_token();
  fmt::print(stderr, "{} chunks, {} bytes ({:.3f} bits/element; fp16 would be {} bytes)\n", chunks.size(), bytes,
             double(bytes) * 8 / double(elems), elems * 2);

  // A storage node: in-process on loopback, or an external one (shaped link).
  std::unique_ptr<storage::Server> server;
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("kvstream-pbench-{}", ::getpid());
  storage::ClientConfig cc;
  cc.backend.name = o.backend;
  cc.name_space = "bench";
  cc.secret = o.secret;
  cc.connections = o.connections;
  if (o.server.empty()) {
    storage::ServerConfig sc;
    sc.address = "127.0.0.1:0";
    sc.backend.name = o.backend;
    sc.directory = dir.string();
    sc.secrets = {{"bench", o.secret}};
    auto s = storage::Server::start(sc);
    if (!s.ok()) return fail(s.status());
    server = std::move(s).value();
    cc.address = server->address();
  } else {
    cc.address = o.server;
  }
  auto client = storage::Client::connect(cc, deadline_in(10s));
  if (!client.ok()) return fail(client.status());
  for (size_t i = 0; i < chunks.size(); ++i)
    if (Status s = (*client)->put("bench-ctx", uint32_t(i), level, std::as_bytes(std::span(chunks[i])), deadline_in(60s));
        !s.ok())
      return fail(s);

  auto dest = KvCache::create(*geom, DType::f16, o.tokens);
  if (!dest.ok()) return fail(dest.status());
  const unsigned threads = o.decode_threads;

  // 1. Transfer alone: every chunk into memory, `depth` in flight, no decode.
  std::vector<std::byte> landing(max_chunk * o.depth);
  auto mr = (*client)->register_memory(landing.data(), landing.size());
  if (!mr.ok()) return fail(mr.status());
  auto t0 = Clock::now();
  {
    std::vector<std::future<Result<size_t>>> inflight;
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (inflight.size() == o.depth) {
        auto r = inflight.front().get();
        if (!r.ok()) return fail(r.status());
        inflight.erase(inflight.begin());
      }
      inflight.push_back((*client)->get_future("bench-ctx", uint32_t(i), level, *mr, (i % o.depth) * max_chunk,
                                               max_chunk, deadline_in(120s)));
    }
    for (auto& f : inflight)
      if (auto r = f.get(); !r.ok()) return fail(r.status());
  }
  const double transfer_s = since(t0);

  // 2. Decode alone: every chunk from memory into the runtime's cache (best of two,
  // so first-use allocations are not counted).
  double decode_s = 1e300;
  for (int rep = 0; rep < 2; ++rep) {
    t0 = Clock::now();
    std::vector<std::thread> pool;
    std::vector<Status> err(threads);
    for (unsigned t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        codec::DecodeScratch scratch;
        for (size_t i = t; i < chunks.size(); i += threads) {
          Status s = codec::decode_chunk(*profile, chunks[i], *dest->view().slice(ranges[i]), &scratch);
          if (!s.ok() && err[t].ok()) err[t] = s;
        }
      });
    for (auto& th : pool) th.join();
    for (auto& e : err)
      if (!e.ok()) return fail(e);
    decode_s = std::min(decode_s, since(t0));
  }

  // 3. The pipelined fetch.
  pipeline::PipelineConfig pc;
  pc.depth = o.depth;
  pc.max_chunk_bytes = max_chunk;
  pc.decode_threads = threads;
  auto pipe = pipeline::Pipeline::create(**client, *profile, pc);
  if (!pipe.ok()) return fail(pipe.status());
  pipeline::FetchRequest req;
  req.context = "bench-ctx";
  req.destination = dest->view();
  req.chunks = ranges;
  req.deadline = deadline_in(600s);
  pipeline::FetchCallbacks cb;
  cb.decide = [level](uint32_t, std::span<const uint64_t>) {
    return pipeline::ChunkDecision{pipeline::ChunkDecision::Action::fetch, level};
  };
  double one_chunk_decode = 0;
  t0 = Clock::now();
  auto fetch = (*pipe)->fetch(req, cb);
  if (!fetch.ok()) return fail(fetch.status());
  if (Status s = (*fetch)->wait(); !s.ok()) return fail(s);
  const double pipelined_s = since(t0);
  for (const auto& t : (*fetch)->timings())
    one_chunk_decode = std::max(one_chunk_decode, std::chrono::duration<double>(t.decode_end - t.decode_start).count());
  const double bound = std::max(transfer_s, decode_s);
  const double efficiency = bound / pipelined_s;
  fmt::print("geometry {} tokens {} chunks {} x {} tokens, level {}, {} bytes, backend {}{}\n", o.geometry, o.tokens,
             chunks.size(), o.chunk_tokens, level, bytes, o.backend, o.server.empty() ? " (loopback)" : " (" + o.server + ")");
  fmt::print("transfer alone   {:8.3f} s  ({:.2f} Gbit/s)\n", transfer_s, double(bytes) * 8 / transfer_s / 1e9);
  fmt::print("decode alone     {:8.3f} s  ({:.0f} M elements/s, {} threads)\n", decode_s, double(elems) / decode_s / 1e6,
             threads);
  fmt::print("pipelined fetch  {:8.3f} s  overlap efficiency {:.3f}; pipelined / (max + one chunk's decode) = {:.3f} "
             "(figure <= 1.1)\n",
             pipelined_s, efficiency, pipelined_s / (bound + one_chunk_decode));
  if (!o.json.empty()) {
    nlohmann::json j = {{"geometry", o.geometry}, {"tokens", o.tokens},   {"transfer_s", transfer_s},
                        {"decode_s", decode_s},   {"pipelined_s", pipelined_s}, {"chunks", chunks.size()},
                        {"chunk_tokens", o.chunk_tokens}, {"bytes", bytes}, {"overlap_efficiency", efficiency},
                        {"one_chunk_decode_s", one_chunk_decode}, {"backend", o.backend}, {"level", level}};
    std::ofstream(o.json) << j.dump(1) << "\n";
  }
  client->reset();
  if (server) server->stop();
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace kvstream::bench
