// kvstream-gpu-bench: GPU decode throughput on one mistral-7b-sized chunk (32 layers x
// 8 KV heads x 128, GQA, RoPE half, K coded before RoPE; synthetic but structured
// data), against the CPU decoder on every core and the host-to-device copy; then into
// paged device KV (vLLM's per-layer K/V block tensors, NHD and HND, checked against
// the CPU decoder's output in the same layout) with stream-ordered decodes; and a
// progressive profile's base prefix and whole stream (checked, then timed). Prints
// "BENCH key value" lines (perf/gpu/run.sh makes its table of them). Checks first
// that the GPU's output equals the CPU's bit for bit on this chunk. Exit 0 when
// measured, 2 without a usable GPU, 1 on an error or a mismatch.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "kvstream/codec.hpp"
#include "kvstream/gpu.hpp"
#include "kvstream/gpu_decoder.hpp"
#include "kvstream/gpu_resources.hpp"
#include "kvstream/log.hpp"
#include "tests/codec/synthetic_kv.hpp"

using namespace kvstream;

namespace {

using clock_type = std::chrono::steady_clock;
double secs_since(clock_type::time_point a) { return std::chrono::duration<double>(clock_type::now() - a).count(); }

int fail(const Status& s) {
  fmt::print(stderr, "kvstream-gpu-bench: {}\n", s.to_string());
  return 1;
}

using test_util::synthetic_cache;

double gb_of(uint64_t bytes) { return double(bytes) / 1e9; }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GPU chunk decode throughput on a mistral-7b-sized chunk"};
  uint64_t tokens = 1536;
  int reps = 20;
  app.add_option("--tokens", tokens, "tokens in the chunk")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "timed GPU decodes (the best is reported)")->capture_default_str()->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  set_log_level(LogLevel::warn);
  if (auto probe = gpu::probe_device(); !probe.ok()) {
    fmt::print(stderr, "kvstream-gpu-bench: no usable GPU: {}\n", probe.status().to_string());
    return 2;
  }
  const KvGeometry geom{32, 8, 128, 32, AttentionKind::gqa};
  const RopeParams rope{true, 1000000.0f, 0, RopePairing::half};

  auto t0 = clock_type::now();
  const KvCache s1 = synthetic_cache(geom, DType::f32, 96, 0, rope, 11), s2 = synthetic_cache(geom, DType::f32, 64, 300, rope, 12);
  codec::ProfileOptions opt;
  opt.group_size = 10;
  opt.code_k_before_rope = true;
  opt.allow_transform = true;
  opt.transform_min_gain = 0.2;
  opt.max_transform_block = 128;
  opt.max_tables_per_level = 16;
  auto profile = codec::ProfileBuilder::build(std::vector<KvView>{s1.view(), s2.view()}, rope, opt);
  if (!profile.ok()) return fail(profile.status());
  std::printf("BENCH profile_build_s %.2f\n", secs_since(t0));
  auto dec = gpu::GpuDecoder::create(*profile);
  if (!dec.ok()) return fail(dec.status());
  t0 = clock_type::now();
  const KvCache src = synthetic_cache(geom, DType::f16, tokens, 4096, rope, 99);
  std::printf("BENCH data_s %.2f\n", secs_since(t0));
  const uint32_t level = profile->levels() / 2;
  std::vector<uint8_t> bytes;
  if (Status s = codec::encode_chunk(*profile, src.view(), level, bytes); !s.ok()) return fail(s);
  const uint64_t out_bytes = gpu::GpuDecoder::output_bytes(geom, tokens, DType::f16);
  std::printf("BENCH tokens %llu level %u chunk_bytes %zu out_bytes_f16 %llu\n", (unsigned long long)tokens, level,
              bytes.size(), (unsigned long long)out_bytes);

  // Bit-exact on this chunk before anything is timed (test_gpu_decoder checks every
  // level, type and geometry).
  KvCache cpu = KvCache::create(geom, DType::f16, tokens, 4096).value();
  KvCache dev = KvCache::create(geom, DType::f16, tokens, 4096).value();
  std::memset(dev.bytes().data(), 0xA5, dev.bytes().size());
  if (Status s = codec::decode_chunk(*profile, bytes, cpu.view()); !s.ok()) return fail(s);
  if (Status s = (*dec)->decode_to_host(bytes, dev.view()); !s.ok()) return fail(s);
  if (std::memcmp(cpu.bytes().data(), dev.bytes().data(), cpu.bytes().size()) != 0)
    return fail(make_status(StatusCode::internal, "the GPU's decode of the chunk differs from the CPU's"));
  std::printf("BENCH bit_exact 1\n");

  auto out = gpu::DeviceBuffer::allocate(out_bytes);
  if (!out.ok()) return fail(out.status());
  if (Status s = (*dec)->decode(bytes, out->data(), out->size(), DType::f16); !s.ok()) return fail(s);  // warm-up
  double best = 1e30, kernel_best = 1e30, up_best = 1e30, rans_best = 1e30, rec_best = 1e30;
  for (int r = 0; r < reps; ++r) {
    t0 = clock_type::now();
    const Status st = (*dec)->decode(bytes, out->data(), out->size(), DType::f16);
    const double s = secs_since(t0);
    if (!st.ok()) return fail(st);
    const gpu::DecodeTimings tm = (*dec)->last_timings();
    best = std::min(best, s);
    up_best = std::min(up_best, double(tm.upload_ms) * 1e-3);
    rans_best = std::min(rans_best, double(tm.entropy_ms) * 1e-3);
    rec_best = std::min(rec_best, double(tm.reconstruct_ms) * 1e-3);
    kernel_best = std::min(kernel_best, double(tm.entropy_ms + tm.reconstruct_ms) * 1e-3);
  }
  // Paged device KV as a runtime keeps it: per layer a K and a V tensor of 16-token
  // blocks, the chunk's blocks scattered by a block table. Bit-exact first (both orders),
  // then stream-ordered decodes (enqueue, no host wait per chunk, the chunk in
  // page-locked memory as the pipeline's receive buffers are) into NHD blocks.
  {
    constexpr uint32_t kBlock = 16;
    const uint64_t used = (tokens + kBlock - 1) / kBlock, blocks = 2 * used;
    std::vector<uint32_t> table(blocks);
    for (uint32_t b = 0; b < blocks; ++b) table[b] = uint32_t((uint64_t(b) * 7919) % blocks);  // 7919 prime: a permutation
    table.resize(used);
    const size_t pool_bytes = size_t(blocks) * kBlock * geom.channels() * 2;
    std::vector<gpu::DeviceBuffer> pools;
    std::vector<void*> keys, values;
    for (uint32_t i = 0; i < 2 * geom.layers; ++i) {
      auto b = gpu::DeviceBuffer::allocate(pool_bytes);
      if (!b.ok()) return fail(b.status());
      (i % 2 ? values : keys).push_back(b->data());
      pools.push_back(std::move(b).value());
    }
    for (PagedOrder order : {PagedOrder::hnd, PagedOrder::nhd}) {
      auto dview = KvView::paged(PagedLayout::blocks(order, geom, kBlock, blocks, keys, values, table), DType::f16,
                                 geom, tokens, 4096);
      if (!dview.ok()) return fail(dview.status());
      if (Status s = (*dec)->decode(bytes, *dview); !s.ok()) return fail(s);
      // The same layout in host memory, decoded by the CPU, against the device pools.
      std::vector<std::vector<std::byte>> host(2 * geom.layers, std::vector<std::byte>(pool_bytes));
      std::vector<std::vector<std::byte>> back(2 * geom.layers, std::vector<std::byte>(pool_bytes));
      std::vector<void*> hk, hv;
      for (uint32_t i = 0; i < 2 * geom.layers; ++i) {
        if (Status s = gpu::copy_to_host(host[i].data(), pools[i].data(), pool_bytes); !s.ok()) return fail(s);
        (i % 2 ? hv : hk).push_back(host[i].data());
      }
      auto hview = KvView::paged(PagedLayout::blocks(order, geom, kBlock, blocks, hk, hv, table), DType::f16, geom,
                                 tokens, 4096);
      if (!hview.ok()) return fail(hview.status());
      if (Status s = codec::decode_chunk(*profile, bytes, *hview); !s.ok()) return fail(s);
      // The device pools, decoded into, against the host pools the CPU decoded into.
      for (uint32_t i = 0; i < 2 * geom.layers; ++i) {
        if (Status s = gpu::copy_to_host(back[i].data(), pools[i].data(), pool_bytes); !s.ok()) return fail(s);
        if (back[i] != host[i])
          return fail(make_status(StatusCode::internal, "paged {} device output differs from the CPU's (tensor {})",
                                  order == PagedOrder::nhd ? "NHD" : "HND", i));
      }
      std::printf("BENCH paged_bit_exact_%s 1\n", order == PagedOrder::nhd ? "nhd" : "hnd");
      if (order == PagedOrder::hnd) continue;
      auto pinned = gpu::PinnedHostMemory::allocate(bytes.size());
      if (!pinned.ok()) return fail(pinned.status());
      std::memcpy(pinned->data(), bytes.data(), bytes.size());
      const std::span<const uint8_t> chunk(static_cast<const uint8_t*>(pinned->data()), bytes.size());
      auto stream = gpu::Stream::create();
      if (!stream.ok()) return fail(stream.status());
      std::atomic<int> ok{0}, bad{0};
      const int n = std::max(reps, 32);
      double stream_best = 1e30;
      for (int round = 0; round < 3; ++round) {
        t0 = clock_type::now();
        for (int k = 0; k < n; ++k)
          if (Status s = (*dec)->enqueue(chunk, *dview, stream->handle(), uint64_t(k),
                                         [&](uint64_t, const Status& v) { (v.ok() ? ok : bad) += 1; });
              !s.ok())
            return fail(s);
        if (Status s = stream->synchronize(); !s.ok()) return fail(s);
        stream_best = std::min(stream_best, secs_since(t0) / n);
      }
      if (bad != 0 || ok != 3 * n)
        return fail(make_status(StatusCode::internal, "stream-ordered verdicts: {} ok, {} failed of {}", ok.load(),
                                bad.load(), 3 * n));
      std::printf("BENCH paged_stream_ms %.3f paged_stream_GBps %.2f paged_stream_chunks %d\n", stream_best * 1e3,
                  gb_of(out_bytes) / stream_best, n);
    }
  }
  // A progressive profile (the kind KvStore stores by default) on the same chunk: its
  // base prefix (what a deadline fetches) and the whole stream, each checked against
  // the CPU, then timed.
  {
    codec::ProfileOptions po = opt;
    po.progressive = true;
    po.progressive_base_step = 2.8f;
    auto prog = codec::ProfileBuilder::build(std::vector<KvView>{s1.view(), s2.view()}, rope, po);
    if (!prog.ok()) return fail(prog.status());
    auto pdec = gpu::GpuDecoder::create(*prog);
    if (!pdec.ok()) return fail(pdec.status());
    std::vector<uint8_t> stream_bytes;
    if (Status s = codec::encode_chunk(*prog, src.view(), 0, stream_bytes); !s.ok()) return fail(s);
    auto prefixes = codec::chunk_prefixes(stream_bytes);
    if (!prefixes.ok()) return fail(prefixes.status());
    const uint64_t base_end = prefixes->front().end;
    for (const auto& [name, end] : {std::pair<const char*, uint64_t>{"base", base_end}, {"full", stream_bytes.size()}}) {
      const std::span<const uint8_t> prefix(stream_bytes.data(), end);
      std::memset(dev.bytes().data(), 0xA5, dev.bytes().size());
      if (Status s = codec::decode_chunk(*prog, prefix, cpu.view()); !s.ok()) return fail(s);
      if (Status s = (*pdec)->decode_to_host(prefix, dev.view()); !s.ok()) return fail(s);
      if (std::memcmp(cpu.bytes().data(), dev.bytes().data(), cpu.bytes().size()) != 0)
        return fail(make_status(StatusCode::internal, "progressive {} prefix: the GPU's decode differs from the CPU's",
                                name));
      double pbest = 1e30;
      for (int r = 0; r < reps + 1; ++r) {
        t0 = clock_type::now();
        if (Status s = (*pdec)->decode(prefix, out->data(), out->size(), DType::f16); !s.ok()) return fail(s);
        if (r > 0) pbest = std::min(pbest, secs_since(t0));
      }
      std::printf("BENCH progressive_%s_bytes %llu progressive_%s_ms %.3f progressive_%s_GBps %.2f\n", name,
                  (unsigned long long)end, name, pbest * 1e3, name, gb_of(out_bytes) / pbest);
    }
  }
  // CPU reference: every core.
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  double cpu_best = 1e30;
  for (int r = 0; r < 4; ++r) {  // the first is a warm-up
    t0 = clock_type::now();
    if (Status s = codec::decode_chunk_parallel(*profile, bytes, cpu.view(), threads); !s.ok()) return fail(s);
    if (r > 0) cpu_best = std::min(cpu_best, secs_since(t0));
  }
  auto bw = gpu::measure_h2d_bandwidth(out_bytes, 5);
  if (!bw.ok()) return fail(bw.status());
  const double gb = double(out_bytes) / 1e9;
  std::printf("BENCH gpu_decode_wall_ms %.3f gpu_decode_GBps %.2f\n", best * 1e3, gb / best);
  std::printf("BENCH gpu_upload_ms %.3f gpu_rans_ms %.3f gpu_reconstruct_ms %.3f gpu_kernels_GBps %.2f\n",
              up_best * 1e3, rans_best * 1e3, rec_best * 1e3, gb / kernel_best);
  std::printf("BENCH cpu_decode_ms %.3f cpu_decode_GBps %.2f cpu_threads %u\n", cpu_best * 1e3, gb / cpu_best, threads);
  std::printf("BENCH h2d_pinned_GBps %.2f h2d_pageable_GBps %.2f copy_bytes %llu\n", bw->pinned_gbps,
              bw->pageable_gbps, (unsigned long long)out_bytes);
  return 0;
}
