// kvstream-bench pipeline: transfer alone, decode alone and the pipelined fetch of one
// context, measured in one run; overlap efficiency = max(transfer, decode) / pipelined.
// --decode gpu (or auto, on a machine with a GPU) decodes on the GPU into paged device
// KV as a runtime keeps it (per layer a K and a V tensor of 16-token blocks, a block
// table), in the pipeline and in the decode-alone run alike, and then checks the device
// blocks against the CPU decoder's output in the same layout, bit for bit.
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvstream/gpu.hpp"
#include "kvstream/gpu_decoder.hpp"
#include "kvstream/gpu_resources.hpp"
#include "kvstream/pipeline.hpp"
#include "examples/tinyllama/eval_harness.hpp"
#include "perf/assembled_kv.hpp"
#include "perf/bench.hpp"
#include "perf/store_vs_pipeline.hpp"

namespace kvstream::bench {

using namespace std::chrono_literals;
using transport::Clock;
using transport::deadline_in;

int run_pipeline_bench(const PipelineBenchOptions& o) {
  const Fail fail{"pipeline"};
  auto geom = named_geometry(o.geometry);
  if (!geom.ok()) return fail(geom.status());
  auto decode_on = pipeline::parse_decode_on(o.decode);
  if (!decode_on.ok()) return fail(decode_on.status());
  // Before the minutes of data preparation: --decode gpu without a GPU is an error now.
  if (*decode_on == pipeline::DecodeOn::gpu)
    if (auto probe = gpu::probe_device(); !probe.ok()) return fail(probe.status().with_context("--decode gpu"));
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
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("kvstream-pbench-{}", ::getpid());
  auto node = open_bench_node(o.server, o.backend, o.secret, dir.string());
  if (!node.ok()) return fail(node.status());
  std::unique_ptr<storage::Server> server = std::move(node->server);
  storage::ClientConfig cc = node->client;
  cc.connections = o.connections;
  auto client = storage::Client::connect(cc, deadline_in(10s));
  if (!client.ok()) return fail(client.status());
  for (size_t i = 0; i < chunks.size(); ++i)
    if (Status s = (*client)->put("bench-ctx", uint32_t(i), level, std::as_bytes(std::span(chunks[i])), deadline_in(60s));
        !s.ok())
      return fail(s);

  const unsigned threads = o.decode_threads;
  // The pipeline first, so that --decode auto is resolved (and logged) before the
  // decode-alone run, which then decodes where the pipeline will.
  pipeline::PipelineConfig pc;
  pc.depth = o.depth;
  pc.max_chunk_bytes = max_chunk;
  pc.decode_threads = threads;
  pc.decode = *decode_on;
  auto pipe = pipeline::Pipeline::create(**client, *profile, pc);
  if (!pipe.ok()) return fail(pipe.status());
  const bool on_gpu = (*pipe)->decodes_on() == pipeline::DecodeOn::gpu;

  // The runtime's KV memory: a host cache, or on the GPU paged blocks (NHD, 16 tokens
  // a block, the context's blocks scattered over a pool twice its size).
  Result<KvCache> dest = KvCache::create(*geom, DType::f16, on_gpu ? 1 : o.tokens);
  if (!dest.ok()) return fail(dest.status());
  constexpr uint32_t kBlock = 16;
  const uint64_t used_blocks = (o.tokens + kBlock - 1) / kBlock, pool_blocks = 2 * used_blocks;
  std::vector<uint32_t> table(pool_blocks);
  for (uint64_t b = 0; b < pool_blocks; ++b) table[b] = uint32_t((b * 7919) % pool_blocks);  // 7919: a permutation
  table.resize(used_blocks);
  const size_t pool_bytes = size_t(pool_blocks) * kBlock * geom->channels() * 2;
  std::vector<gpu::DeviceBuffer> pools;
  KvView device_view;
  if (on_gpu) {
    std::vector<void*> keys, values;
    for (uint32_t i = 0; i < 2 * geom->layers; ++i) {
      auto b = gpu::DeviceBuffer::allocate(pool_bytes);
      if (!b.ok()) return fail(b.status());
      (i % 2 ? values : keys).push_back(b->data());
      pools.push_back(std::move(b).value());
    }
    auto v = KvView::paged(PagedLayout::blocks(PagedOrder::nhd, *geom, kBlock, pool_blocks, keys, values, table),
                           DType::f16, *geom, o.tokens);
    if (!v.ok()) return fail(v.status());
    device_view = *v;
  }

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
  // so first-use allocations are not counted). On the GPU: one decoder and stream per
  // thread, chunks page-locked as the pipeline's receive buffers are.
  double decode_s = 1e300;
  if (on_gpu) {
    std::vector<gpu::PinnedHostMemory> pins;
    std::vector<std::unique_ptr<gpu::GpuDecoder>> decoders;
    std::vector<gpu::Stream> streams;
    for (auto& c : chunks) {
      auto pin = gpu::PinnedHostMemory::register_range(c.data(), c.size());
      if (!pin.ok()) return fail(pin.status());
      pins.push_back(std::move(pin).value());
    }
    for (unsigned t = 0; t < threads; ++t) {
      auto dec = gpu::GpuDecoder::create(*profile);
      auto st = gpu::Stream::create();
      if (!dec.ok() || !st.ok()) return fail(dec.ok() ? st.status() : dec.status());
      decoders.push_back(std::move(dec).value());
      streams.push_back(std::move(st).value());
    }
    for (int rep = 0; rep < 2; ++rep) {
      t0 = Clock::now();
      std::vector<std::thread> pool;
      std::vector<Status> err(threads);
      for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
          for (size_t i = t; i < chunks.size(); i += threads) {
            Status s = decoders[t]->decode(chunks[i], *device_view.slice(ranges[i]), streams[t].handle());
            if (!s.ok() && err[t].ok()) err[t] = s;
          }
        });
      for (auto& th : pool) th.join();
      for (auto& e : err)
        if (!e.ok()) return fail(e);
      decode_s = std::min(decode_s, since(t0));
    }
  }
  for (int rep = 0; rep < (on_gpu ? 0 : 2); ++rep) {
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
  pipeline::FetchRequest req;
  req.context = "bench-ctx";
  req.destination = on_gpu ? device_view : dest->view();
  req.destination_memory = on_gpu ? transport::MemoryType::cuda : transport::MemoryType::host;
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

  // On the GPU: the device blocks, copied back, must equal the CPU decoder's output in
  // the same paged layout in host memory.
  bool bit_exact = true;
  if (on_gpu) {
    std::vector<std::vector<std::byte>> host(pools.size(), std::vector<std::byte>(pool_bytes));
    std::vector<std::vector<std::byte>> back(pools.size(), std::vector<std::byte>(pool_bytes));
    std::vector<void*> hk, hv;
    for (size_t i = 0; i < pools.size(); ++i) {
      if (Status s = gpu::copy_to_host(back[i].data(), pools[i].data(), pool_bytes); !s.ok()) return fail(s);
      (i % 2 ? hv : hk).push_back(host[i].data());
    }
    auto hview = KvView::paged(PagedLayout::blocks(PagedOrder::nhd, *geom, kBlock, pool_blocks, hk, hv, table),
                               DType::f16, *geom, o.tokens);
    if (!hview.ok()) return fail(hview.status());
    const unsigned cpu_threads = std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> pool;
    std::vector<Status> err(cpu_threads);
    for (unsigned t = 0; t < cpu_threads; ++t)
      pool.emplace_back([&, t] {
        for (size_t i = t; i < chunks.size(); i += cpu_threads) {
          Status s = codec::decode_chunk(*profile, chunks[i], *hview->slice(ranges[i]));
          if (!s.ok() && err[t].ok()) err[t] = s;
        }
      });
    for (auto& th : pool) th.join();
    for (auto& e : err)
      if (!e.ok()) return fail(e);
    // Compare only the slots the context owns (the rest of the pool is never written).
    std::atomic<uint32_t> differ{0};
    const size_t slot_bytes = size_t(geom->channels()) * 2;
    for (size_t i = 0; i < pools.size(); ++i)
      for (uint64_t t = 0; t < o.tokens; ++t) {
        const size_t at = (size_t(table[t / kBlock]) * kBlock + t % kBlock) * slot_bytes;
        if (std::memcmp(host[i].data() + at, back[i].data() + at, slot_bytes) != 0) {
          ++differ;
          break;
        }
      }
    bit_exact = differ == 0;
    fmt::print("GPU output (paged NHD blocks) vs CPU decode: {} ({} of {} K/V tensors differ)\n",
               bit_exact ? "bit-exact" : "DIFFERENT", differ.load(), pools.size());
  }
  fmt::print("geometry {} tokens {} chunks {} x {} tokens, level {}, {} bytes, backend {}{}, decode on {}\n", o.geometry,
             o.tokens, chunks.size(), o.chunk_tokens, level, bytes, o.backend,
             o.server.empty() ? " (loopback)" : " (" + o.server + ")", on_gpu ? "the GPU (paged device KV)" : "the CPU");
  fmt::print("transfer alone   {:8.3f} s  ({:.2f} Gbit/s)\n", transfer_s, double(bytes) * 8 / transfer_s / 1e9);
  fmt::print("decode alone     {:8.3f} s  ({:.0f} M elements/s, {} {})\n", decode_s, double(elems) / decode_s / 1e6,
             threads, on_gpu ? "GPU decoders, one stream each" : "threads");
  fmt::print("pipelined fetch  {:8.3f} s  overlap efficiency {:.3f}; pipelined / (max + one chunk's decode) = {:.3f} "
             "(figure <= 1.1)\n",
             pipelined_s, efficiency, pipelined_s / (bound + one_chunk_decode));
  // 4. The same whole chunks through the front door and by hand (CPU path).
  Result<StoreVsPipeline> cmp = Status(StatusCode::unsupported, "not on the GPU path");
  if (!on_gpu && o.store_reps > 0) {
    fetch->reset();
    StoreComparison sc;
    sc.profile = &*profile;
    sc.chunks = chunks;
    sc.level = level;
    sc.tokens = o.tokens;
    sc.chunk_tokens = o.chunk_tokens;
    sc.client = cc;
    sc.pipeline = pc;
    sc.directory = dir.string();
    sc.reps = o.store_reps;
    cmp = compare_store_with_pipeline(sc);
    if (!cmp.ok()) return fail(cmp.status().with_context("KvStore against the pipeline"));
    fmt::print("whole chunks ({}), median of {} alternated: KvStore lookup+fetch {:.3f} s (fetch alone {:.3f} s), {} "
               "bytes; by hand {:.3f} s, {} bytes; ratio {:.3f} (fetch alone {:.3f})\n",
               cmp->chunks, o.store_reps, cmp->store_s, cmp->store_fetch_s, cmp->store_bytes, cmp->pipeline_s,
               cmp->pipeline_bytes, cmp->store_s / cmp->pipeline_s, cmp->store_fetch_s / cmp->pipeline_s);
  }
  if (!o.json.empty()) {
    nlohmann::json j = {{"geometry", o.geometry}, {"tokens", o.tokens},   {"transfer_s", transfer_s},
                        {"decode_s", decode_s},   {"pipelined_s", pipelined_s}, {"chunks", chunks.size()},
                        {"chunk_tokens", o.chunk_tokens}, {"bytes", bytes}, {"overlap_efficiency", efficiency},
                        {"one_chunk_decode_s", one_chunk_decode}, {"backend", o.backend}, {"level", level},
                        {"decode", on_gpu ? "gpu" : "cpu"},       {"decode_requested", o.decode},
                        {"decode_threads", threads},              {"gpu_bit_exact", bit_exact}};
    if (cmp.ok())
      j["kvstore_vs_pipeline"] = {{"chunks", cmp->chunks},         {"reps", o.store_reps},
                                  {"store_s", cmp->store_s},       {"pipeline_s", cmp->pipeline_s},
                                  {"store_fetch_s", cmp->store_fetch_s},
                                  {"store_bytes", cmp->store_bytes}, {"pipeline_bytes", cmp->pipeline_bytes},
                                  {"store_all_s", cmp->store_all_s}, {"pipeline_all_s", cmp->pipeline_all_s},
                                  {"ratio", cmp->store_s / cmp->pipeline_s}};
    std::ofstream(o.json) << j.dump(1) << "\n";
  }
  if (*fetch) fetch->reset();
  pipe->reset();  // before the client it uses
  client->reset();
  if (server) server->stop();
  std::filesystem::remove_all(dir);
  return bit_exact ? 0 : 1;
}

}  // namespace kvstream::bench
