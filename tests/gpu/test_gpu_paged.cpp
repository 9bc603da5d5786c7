// The GPU decoder's paged destinations and stream-ordered decode
// (include/kvstream/gpu_decoder.hpp):
//  * OutputPlan (gpu/output_plan.hpp), where the reconstruction kernel writes each
//    element, against KvView's own addressing, for packed, strided and paged views (NHD,
//    HND, K and V in separate tensors, shuffled block tables, sliced views). Runs
//    everywhere: it is plain host code.
//  * On a GPU: decodes into paged device KV (both orders, every level and dtype) equal
//    the CPU decoder's into the same layout in host memory, byte for byte across the
//    whole block pool; enqueue() reports each chunk's device verdict by its tag
//    (a chunk whose rANS words were altered and resealed fails there, the others
//    pass); a captured graph replays the decode. Without a GPU these skip with the
//    reason, and the error paths are checked instead.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <vector>

#include "gpu/output_plan.hpp"
#include "kvstream/codec.hpp"
#include "kvstream/gpu.hpp"
#include "kvstream/gpu_decoder.hpp"
#include "kvstream/gpu_resources.hpp"
#include "kvstream/kv_model.hpp"
#include "kvstream/log.hpp"
#include "tests/codec/synthetic_kv.hpp"
#include "tests/fuzz/fuzz_common.hpp"

namespace kvstream::gpu::test_gpu_paged {
namespace {

const KvGeometry kGeom{3, 2, 32, 4, AttentionKind::gqa};
const RopeParams kRope{true, 10000.0f, 0, RopePairing::half};
constexpr uint32_t kBlock = 16;

// A block table of `tokens` tokens over `num_blocks` physical blocks, in shuffled order.
std::vector<uint32_t> shuffled_table(uint64_t tokens, uint64_t num_blocks, uint32_t seed) {
  std::vector<uint32_t> all(num_blocks);
  std::iota(all.begin(), all.end(), 0u);
  std::shuffle(all.begin(), all.end(), std::mt19937(seed));
  all.resize((tokens + kBlock - 1) / kBlock);
  return all;
}

// K and V pools of one paged cache: per layer a [num_blocks][...] tensor each.
struct Pools {
  std::vector<std::vector<std::byte>> k, v;
  Pools(const KvGeometry& g, uint64_t num_blocks, DType dt, uint8_t fill) {
    const size_t bytes = size_t(num_blocks) * kBlock * g.channels() * dtype_size(dt);
    k.assign(g.layers, std::vector<std::byte>(bytes, std::byte{fill}));
    v.assign(g.layers, std::vector<std::byte>(bytes, std::byte{fill}));
  }
  std::vector<void*> ptrs(std::vector<std::vector<std::byte>>& t) {
    std::vector<void*> p;
    for (auto& x : t) p.push_back(x.data());
    return p;
  }
};

// Every element's address as the plan computes it equals KvView's own.
void expect_plan_matches(const KvView& v, const std::string& what) {
  auto plan = detail::plan_output(v);
  ASSERT_TRUE(plan.ok()) << what << ": " << plan.status().to_string();
  const KvGeometry& g = v.geometry();
  const int64_t es = int64_t(dtype_size(v.dtype()));
  size_t bad = 0;
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < g.planes(); ++p)
      for (uint64_t t = 0; t < v.tokens(); ++t)
        for (uint32_t c = 0; c < g.channels(); ++c) {
          const auto want = reinterpret_cast<uint64_t>(v.row(l, p, t) + v.channel_offset(c) * es);
          if (plan->address(l * g.planes() + p, t, c) != want) ++bad;
        }
  EXPECT_EQ(bad, 0u) << what;
  EXPECT_EQ(plan->elem_bytes, uint32_t(es)) << what;
}

TEST(OutputPlan, AddressesEveryElementWhereTheViewDoes) {
  const uint64_t T = 45, blocks = 9;
  for (DType dt : {DType::f16, DType::f32}) {
    KvCache packed = KvCache::create(kGeom, dt, T, 7).value();
    expect_plan_matches(packed.view(), "packed");
    // Strided: token-major with padding between tokens and planes.
    const KvStrides st{int64_t(T) * 136 + 16, 64, 136, 1};
    std::vector<std::byte> mem(size_t(kGeom.layers) * st.layer * dtype_size(dt) + 4096);
    expect_plan_matches(KvView::strided(mem.data(), dt, kGeom, T, st).value(), "strided");
    for (PagedOrder order : {PagedOrder::nhd, PagedOrder::hnd}) {
      Pools pools(kGeom, blocks, dt, 0);
      const KvView paged = KvView::paged(PagedLayout::blocks(order, kGeom, kBlock, blocks, pools.ptrs(pools.k),
                                                             pools.ptrs(pools.v), shuffled_table(T, blocks, 3)),
                                         dt, kGeom, T, 100)
                               .value();
      const std::string name = order == PagedOrder::nhd ? "paged NHD" : "paged HND";
      expect_plan_matches(paged, name);
      // A slice starts inside a block: token offsets then cross block boundaries.
      expect_plan_matches(paged.slice({5, 40}).value(), name + " slice");
    }
  }
}

// The kernel's stores, emulated through the plan into a host block pool, land where
// the CPU decoder writes the same chunk into the same layout: the pools are equal
// byte for byte, untouched slots included.
TEST(OutputPlan, StoresThroughThePlanEqualTheCpuDecoderInPagedMemory) {
  set_log_level(LogLevel::warn);
  const uint64_t T = 37, blocks = 6;
  const KvCache src = test_util::synthetic_cache(kGeom, DType::f32, T, 21, kRope, 5);
  const std::vector<KvView> samples = {src.view()};
  const codec::Profile prof = codec::ProfileBuilder::build(samples, kRope, {}).value();
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(codec::encode_chunk(prof, src.view(), 2, bytes).ok());
  KvCache packed = KvCache::create(kGeom, DType::f32, T, 21).value();
  ASSERT_TRUE(codec::decode_chunk(prof, bytes, packed.view()).ok());
  for (PagedOrder order : {PagedOrder::nhd, PagedOrder::hnd}) {
    const auto table = shuffled_table(T, blocks, 9);
    Pools cpu(kGeom, blocks, DType::f16, 0x5A), emu(kGeom, blocks, DType::f16, 0x5A);
    const KvView cpu_view =
        KvView::paged(PagedLayout::blocks(order, kGeom, kBlock, blocks, cpu.ptrs(cpu.k), cpu.ptrs(cpu.v), table),
                      DType::f16, kGeom, T, 21)
            .value();
    const KvView emu_view =
        KvView::paged(PagedLayout::blocks(order, kGeom, kBlock, blocks, emu.ptrs(emu.k), emu.ptrs(emu.v), table),
                      DType::f16, kGeom, T, 21)
            .value();
    ASSERT_TRUE(codec::decode_chunk(prof, bytes, cpu_view).ok());
    const detail::OutputPlan plan = detail::plan_output(emu_view).value();
    for (uint32_t lp = 0; lp < kGeom.layers * kGeom.planes(); ++lp)
      for (uint64_t t = 0; t < T; ++t)
        for (uint32_t c = 0; c < kGeom.channels(); ++c) {
          const uint16_t h = f32_to_f16(packed.at(lp / 2, lp % 2, t, c));
          std::memcpy(reinterpret_cast<void*>(plan.address(lp, t, c)), &h, 2);
        }
    EXPECT_EQ(cpu.k, emu.k);
    EXPECT_EQ(cpu.v, emu.v);
  }
}

TEST(OutputPlan, RefusesAnEmptyView) {
  KvCache c = KvCache::create(kGeom, DType::f16, 4, 0).value();
  const KvView empty = c.view().slice({2, 2}).value();
  EXPECT_EQ(detail::plan_output(empty).status().code(), StatusCode::invalid_argument);
}

// ---- on a GPU ------------------------------------------------------------------------

const codec::Profile& profile() {
  static const codec::Profile p = [] {
    set_log_level(LogLevel::warn);
    const KvCache a = test_util::synthetic_cache(kGeom, DType::f32, 96, 0, kRope, 11);
    const KvCache b = test_util::synthetic_cache(kGeom, DType::f32, 64, 300, kRope, 12);
    const std::vector<KvView> views = {a.view(), b.view()};
    codec::ProfileOptions opt;
    opt.max_tables_per_level = 16;
    return codec::ProfileBuilder::build(views, kRope, opt).value();
  }();
  return p;
}

std::unique_ptr<GpuDecoder> decoder(std::string& why) {
  auto d = GpuDecoder::create(profile());
  if (d.ok()) return std::move(d).value();
  why = d.status().to_string();
  return nullptr;
}

// Device K and V pools of one paged cache, filled with `fill`.
struct DevicePools {
  std::vector<DeviceBuffer> k, v;
  size_t bytes = 0;
  static Result<DevicePools> create(uint64_t num_blocks, DType dt, uint8_t fill) {
    DevicePools d;
    d.bytes = size_t(num_blocks) * kBlock * kGeom.channels() * dtype_size(dt);
    const std::vector<uint8_t> init(d.bytes, fill);
    for (uint32_t l = 0; l < kGeom.layers; ++l)
      for (auto* side : {&d.k, &d.v}) {
        KVS_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::allocate(d.bytes));
        KVS_RETURN_IF_ERROR(copy_to_device(b.data(), init.data(), d.bytes));
        side->push_back(std::move(b));
      }
    return d;
  }
  std::vector<void*> ptrs(std::vector<DeviceBuffer>& side) {
    std::vector<void*> p;
    for (auto& b : side) p.push_back(b.data());
    return p;
  }
  // The pools back on the host, as Pools.
  void download(Pools& host) {
    for (uint32_t l = 0; l < kGeom.layers; ++l) {
      ASSERT_TRUE(copy_to_host(host.k[l].data(), k[l].data(), bytes).ok());
      ASSERT_TRUE(copy_to_host(host.v[l].data(), v[l].data(), bytes).ok());
    }
  }
};

TEST(GpuPaged, PagedDeviceOutputEqualsTheCpuDecoderEveryLevelBothOrders) {
  std::string why;
  auto gpu = decoder(why);
  if (!gpu) GTEST_SKIP() << "no usable GPU: " << why;
  const codec::Profile& p = profile();
  const uint64_t T = 45, blocks = 8, first = 60;
  const KvCache src = test_util::synthetic_cache(kGeom, DType::f16, T, first, kRope, 77);
  for (uint32_t level = 0; level < p.levels(); ++level) {
    std::vector<uint8_t> bytes;
    ASSERT_TRUE(codec::encode_chunk(p, src.view(), level, bytes).ok());
    for (DType dt : {DType::f16, DType::bf16, DType::f32})
      for (PagedOrder order : {PagedOrder::nhd, PagedOrder::hnd}) {
        const auto table = shuffled_table(T, blocks, level + 1);
        Pools cpu(kGeom, blocks, dt, 0xA5), back(kGeom, blocks, dt, 0);
        auto dev = DevicePools::create(blocks, dt, 0xA5);
        ASSERT_TRUE(dev.ok()) << dev.status().to_string();
        const KvView cpu_view = KvView::paged(PagedLayout::blocks(order, kGeom, kBlock, blocks, cpu.ptrs(cpu.k),
                                                                  cpu.ptrs(cpu.v), table),
                                              dt, kGeom, T, first)
                                    .value();
        const KvView dev_view = KvView::paged(PagedLayout::blocks(order, kGeom, kBlock, blocks, dev->ptrs(dev->k),
                                                                  dev->ptrs(dev->v), table),
                                              dt, kGeom, T, first)
                                    .value();
        ASSERT_TRUE(codec::decode_chunk(p, bytes, cpu_view).ok());
        const Status st = gpu->decode(bytes, dev_view);
        ASSERT_TRUE(st.ok()) << st.to_string();
        dev->download(back);
        const std::string what = fmt::format("level {} {} {}", level, dtype_name(dt), int(order));
        EXPECT_EQ(back.k, cpu.k) << what;
        EXPECT_EQ(back.v, cpu.v) << what;
      }
  }
  // A host pointer in the view is refused before anything runs.
  Pools host(kGeom, blocks, DType::f16, 0);
  const KvView host_view = KvView::paged(PagedLayout::blocks(PagedOrder::nhd, kGeom, kBlock, blocks,
                                                             host.ptrs(host.k), host.ptrs(host.v),
                                                             shuffled_table(T, blocks, 1)),
                                         DType::f16, kGeom, T, first)
                               .value();
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(codec::encode_chunk(p, src.view(), 0, bytes).ok());
  EXPECT_EQ(gpu->decode(bytes, host_view).code(), StatusCode::invalid_argument);
}

TEST(GpuPaged, EnqueueReportsEveryVerdictByTagAndCatchesACorruptChunkOnTheDevice) {
  std::string why;
  auto gpu = decoder(why);
  if (!gpu) GTEST_SKIP() << "no usable GPU: " << why;
  const codec::Profile& p = profile();
  const uint64_t T = 40;
  constexpr int kChunks = 9;  // more than kMaxInFlight: the ring wraps
  std::vector<std::vector<uint8_t>> chunks(kChunks);
  std::vector<KvCache> cpu;
  for (int i = 0; i < kChunks; ++i) {
    const KvCache src = test_util::synthetic_cache(kGeom, DType::f16, T, 40 * uint64_t(i), kRope, 200 + i);
    ASSERT_TRUE(codec::encode_chunk(p, src.view(), uint32_t(i) % p.levels(), chunks[i]).ok());
    cpu.push_back(KvCache::create(kGeom, DType::f16, T, 40 * uint64_t(i)).value());
    ASSERT_TRUE(codec::decode_chunk(p, chunks[i], cpu.back().view()).ok());
  }
  // Chunk 4: a rANS word altered and the checksums recomputed, so that only the
  // device's checks can see it.
  const codec::ChunkInfo info = codec::inspect_chunk(chunks[4]).value();
  chunks[4][chunks[4].size() / 2] ^= 0x5A;
  fuzz::chunk_reseal(chunks[4], info.geometry.layers * info.geometry.planes());
  KvCache probe = KvCache::create(kGeom, DType::f16, T, 160).value();
  ASSERT_EQ(codec::decode_chunk(p, chunks[4], probe.view()).code(), StatusCode::corrupt_data);

  auto stream = Stream::create();
  ASSERT_TRUE(stream.ok());
  std::vector<DeviceBuffer> outs;
  std::mutex mu;
  std::map<uint64_t, Status> verdicts;
  int calls = 0;
  for (int i = 0; i < kChunks; ++i) {
    outs.push_back(DeviceBuffer::allocate(GpuDecoder::output_bytes(kGeom, T, DType::f16)).value());
    const KvView view = KvView::packed(outs.back().data(), DType::f16, kGeom, T, 40 * uint64_t(i)).value();
    const Status st = gpu->enqueue(chunks[i], view, stream->handle(), 1000 + i, [&](uint64_t tag, const Status& s) {
      std::lock_guard lock(mu);
      ++calls;
      verdicts[tag] = s;
    });
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  ASSERT_TRUE(stream->synchronize().ok());
  std::lock_guard lock(mu);
  EXPECT_EQ(calls, kChunks);
  for (int i = 0; i < kChunks; ++i) {
    ASSERT_TRUE(verdicts.count(1000 + i)) << i;
    if (i == 4) {
      EXPECT_EQ(verdicts[1004].code(), StatusCode::corrupt_data) << verdicts[1004].to_string();
      continue;
    }
    EXPECT_TRUE(verdicts[1000 + i].ok()) << i << ": " << verdicts[1000 + i].to_string();
    std::vector<std::byte> back(outs[i].size());
    ASSERT_TRUE(copy_to_host(back.data(), outs[i].data(), back.size()).ok());
    EXPECT_EQ(0, std::memcmp(back.data(), cpu[i].bytes().data(), cpu[i].bytes().size())) << i;
  }
  // Host-side defects are returned at once, and nothing is enqueued for them.
  const KvView view = KvView::packed(outs[0].data(), DType::f16, kGeom, T, 0).value();
  const std::span<const uint8_t> cut(chunks[0].data(), 30);
  EXPECT_FALSE(gpu->enqueue(cut, view, stream->handle(), 7, [&](uint64_t, const Status&) { ++calls; }).ok());
  ASSERT_TRUE(stream->synchronize().ok());
  EXPECT_EQ(calls, kChunks);
}

TEST(GpuPaged, ACapturedGraphReplaysTheDecode) {
  std::string why;
  auto gpu = decoder(why);
  if (!gpu) GTEST_SKIP() << "no usable GPU: " << why;
  const codec::Profile& p = profile();
  const uint64_t T = 33;
  const KvCache src = test_util::synthetic_cache(kGeom, DType::f16, T, 0, kRope, 31);
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(codec::encode_chunk(p, src.view(), 1, bytes).ok());
  KvCache cpu = KvCache::create(kGeom, DType::bf16, T, 0).value();
  ASSERT_TRUE(codec::decode_chunk(p, bytes, cpu.view()).ok());
  auto stream = Stream::create();
  ASSERT_TRUE(stream.ok());
  DeviceBuffer out = DeviceBuffer::allocate(GpuDecoder::output_bytes(kGeom, T, DType::bf16)).value();
  const KvView view = KvView::packed(out.data(), DType::bf16, kGeom, T, 0).value();
  // Levels not loaded: a capture cannot upload them, and says so.
  auto early = Graph::capture(*stream, [&] { return gpu->enqueue(bytes, view, stream->handle(), 0, nullptr); });
  EXPECT_EQ(early.status().code(), StatusCode::invalid_argument) << early.status().to_string();
  ASSERT_TRUE(gpu->load_levels().ok());
  std::atomic<int> passed{0};
  auto graph = Graph::capture(*stream, [&] {
    return gpu->enqueue(bytes, view, stream->handle(), 5, [&](uint64_t, const Status& s) { passed += s.ok(); });
  });
  ASSERT_TRUE(graph.ok()) << graph.status().to_string();
  const std::vector<uint8_t> zero(out.size(), 0);
  for (int replay = 0; replay < 3; ++replay) {
    ASSERT_TRUE(copy_to_device(out.data(), zero.data(), zero.size()).ok());
    ASSERT_TRUE(graph->launch(*stream).ok());
    ASSERT_TRUE(stream->synchronize().ok());
    std::vector<std::byte> back(out.size());
    ASSERT_TRUE(copy_to_host(back.data(), out.data(), back.size()).ok());
    EXPECT_EQ(0, std::memcmp(back.data(), cpu.bytes().data(), back.size())) << "replay " << replay;
  }
  EXPECT_EQ(passed.load(), 3);
}

TEST(GpuPaged, WithoutAGpuTheStreamOrderedCallsAreClearErrors) {
  if (GpuDecoder::create(profile()).ok()) GTEST_SKIP() << "a GPU is present";
  EXPECT_FALSE(Stream::create().ok());
  auto g = Graph::capture(Stream{}, [] { return Status{}; });
  EXPECT_FALSE(g.ok());
  EXPECT_FALSE(Graph{}.launch(Stream{}).ok());
}

}  // namespace
}  // namespace kvstream::gpu::test_gpu_paged
