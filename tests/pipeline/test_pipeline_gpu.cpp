// The pipeline's GPU path against a real storage node on loopback: `auto` without a
// GPU fetches on the CPU, `gpu` without one is a clear error, GPUDirect is unsupported
// by every backend here (naming it, through wrapped clients), device destinations (one
// packed buffer per chunk, or a paged view over device memory) need a GPU pipeline, and
// with a GPU a fetch into device memory, packed or paged, equals the CPU's fetch bit
// for bit.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <iostream>
#include <numeric>

#include "kvstream/gpu.hpp"
#include "kvstream/gpu_decoder.hpp"
#include "kvstream/gpu_resources.hpp"
#include "kvstream/paced_client.hpp"
#include "kvstream/pipeline.hpp"
#include "tests/pipeline/pipeline_fixture.hpp"
#include "transport/common/registration.hpp"

namespace kvstream::test_pipeline_gpu {

using namespace kvstream::pipeline_test;

namespace {

// What the GPU path says where no GPU is usable: a build with CUDA on a machine
// without a device answers `unavailable` and names the GPU; a build without CUDA
// (the sanitizer trees, a machine without the toolkit) answers `unsupported` and says
// so. Each test checks the answer of the build it runs in.
void expect_no_usable_gpu(const Status& st) {
  if (gpu::built_with_cuda()) {
    EXPECT_EQ(st.code(), StatusCode::unavailable) << st.to_string();
    EXPECT_NE(st.message().find("GPU"), std::string::npos) << st.to_string();
  } else {
    EXPECT_EQ(st.code(), StatusCode::unsupported) << st.to_string();
    EXPECT_NE(st.message().find("built without CUDA"), std::string::npos) << st.to_string();
  }
}

pipeline::PipelineConfig gpu_config(pipeline::DecodeOn on) {
  pipeline::PipelineConfig pc;
  pc.depth = 3;
  pc.max_chunk_bytes = 1 << 20;
  pc.decode_threads = 2;  // two decoders, two streams: chunks overlap on the GPU
  pc.decode = on;
  return pc;
}

TEST(PipelineDecodeOn, NamesRoundTrip) {
  for (auto d : {pipeline::DecodeOn::cpu, pipeline::DecodeOn::gpu, pipeline::DecodeOn::automatic})
    EXPECT_EQ(pipeline::parse_decode_on(pipeline::decode_on_name(d)).value(), d);
  EXPECT_EQ(pipeline::decode_on_name(pipeline::DecodeOn::automatic), "auto");
  EXPECT_EQ(pipeline::parse_decode_on("cuda").status().code(), StatusCode::invalid_argument);
}

TEST_F(PipelineTest, AutoFetchesCorrectlyWhereverItDecodes) {
  auto p = pipeline::Pipeline::create(*client_, profile_, gpu_config(pipeline::DecodeOn::automatic));
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  // Without a usable GPU, auto is the CPU path; with one, the GPU decodes and copies
  // each chunk back into the host view. Either way: the serial CPU decode, bit for bit.
  if (!gpu::probe_device().ok()) EXPECT_EQ((*p)->decodes_on(), pipeline::DecodeOn::cpu);
  auto out = KvCache::create(kGeom, DType::f16, kTokens).value();
  auto f = (*p)->fetch(request(out.view()), by_index());
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  ASSERT_TRUE((*f)->wait().ok());
  EXPECT_EQ((*p)->buffers_in_use(), 0u);
  const KvCache ref = serial();
  EXPECT_EQ(std::memcmp(out.bytes().data(), ref.bytes().data(), ref.bytes().size()), 0);
}

TEST_F(PipelineTest, GpuWithoutAGpuIsAClearErrorFromCreate) {
  const auto probe = gpu::probe_device();
  if (probe.ok()) GTEST_SKIP() << "a GPU is present (" << probe->name << "): this checks the error without one";
  auto p = pipeline::Pipeline::create(*client_, profile_, gpu_config(pipeline::DecodeOn::gpu));
  ASSERT_FALSE(p.ok()) << "decode=gpu must not fall back to the CPU silently";
  const std::string msg = p.status().message();
  std::cout << "decode=gpu without a GPU: " << p.status().to_string() << "\n";
  if (!gpu::built_with_cuda()) {
    EXPECT_EQ(p.status().code(), StatusCode::unsupported) << msg;
    return;
  }
  EXPECT_EQ(p.status().code(), StatusCode::unavailable) << msg;
  // Names the CUDA error (35, cudaErrorInsufficientDriver, on a machine without a
  // driver) or says that there is no device.
  EXPECT_TRUE(msg.find("CUDA") != std::string::npos || msg.find("cuda") != std::string::npos) << msg;
  EXPECT_TRUE(msg.find("35") != std::string::npos || msg.find("0 devices") != std::string::npos ||
              msg.find("does not exist") != std::string::npos)
      << msg;
  EXPECT_NE(msg.find("decode=gpu"), std::string::npos) << msg;
}

TEST_F(PipelineTest, GpuDirectIsUnsupportedNamingTheBackend) {
  for (auto on : {pipeline::DecodeOn::gpu, pipeline::DecodeOn::automatic}) {
    auto pc = gpu_config(on);
    pc.gpudirect = true;
    auto p = pipeline::Pipeline::create(*client_, profile_, pc);
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().code(), StatusCode::unsupported) << p.status().to_string();
    const std::string msg = p.status().message();
    std::cout << "GPUDirect, decode=" << pipeline::decode_on_name(on) << ": " << p.status().to_string() << "\n";
    EXPECT_NE(msg.find("GPUDirect"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cuda_memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tcp"), std::string::npos) << msg;  // names the backend (tcp here)
  }
  auto pc = gpu_config(pipeline::DecodeOn::cpu);
  pc.gpudirect = true;
  EXPECT_EQ(pipeline::Pipeline::create(*client_, profile_, pc).status().code(), StatusCode::invalid_argument);
}

// A client that borrows another and forwards every call to it: what the tests wrap
// (a pacer owns its inner client, so it gets one of these over the fixture's).
struct Forwarding : storage::Client {
  storage::Client& c;
  explicit Forwarding(storage::Client& inner) : c(inner) {}
  const transport::Capabilities* capabilities() const override { return c.capabilities(); }
  Result<transport::MemoryRegion> register_memory(void* d, size_t n) override { return c.register_memory(d, n); }
  Status put(const std::string& x, uint32_t i, uint32_t l, std::span<const std::byte> b, transport::Deadline d,
             const transport::CancelToken& k) override {
    return c.put(x, i, l, b, d, k);
  }
  void get_async(const std::string& x, uint32_t i, uint32_t l, transport::MemoryRegion m, size_t o, size_t n,
                 transport::Deadline d, const transport::CancelToken& k, storage::GetCallback cb) override {
    c.get_async(x, i, l, std::move(m), o, n, d, k, std::move(cb));
  }
  Result<std::vector<storage::ChunkStat>> stat(const std::string& x, transport::Deadline d,
                                               const transport::CancelToken& k) override {
    return c.stat(x, d, k);
  }
  Status remove(const std::string& x, transport::Deadline d, const transport::CancelToken& k) override {
    return c.remove(x, d, k);
  }
  Result<std::vector<std::string>> list(transport::Deadline d, const transport::CancelToken& k) override {
    return c.list(d, k);
  }
};

// The check reads the capabilities through the wrappers a runtime puts around the
// node's client (issue 20): a paced link reports the tcp backend beneath it, and a
// client whose transport declares cuda memory reaches the last refusal, which says
// that the GPUDirect path itself is what is missing here.
TEST_F(PipelineTest, GpuDirectSeesThroughWrappedClients) {
  storage::PacedClientConfig paced_cfg;
  paced_cfg.bits_per_second = 1e9;
  auto paced = storage::make_paced_client(std::make_unique<Forwarding>(*client_), paced_cfg);
  ASSERT_TRUE(paced.ok()) << paced.status().to_string();
  auto pc = gpu_config(pipeline::DecodeOn::gpu);
  pc.gpudirect = true;
  auto p = pipeline::Pipeline::create(**paced, profile_, pc);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::unsupported) << p.status().to_string();
  EXPECT_NE(p.status().message().find("'tcp'"), std::string::npos) << p.status().to_string();

  struct CudaCapable : Forwarding {
    transport::Capabilities caps{.backend = "ucx", .provider = "cuda_copy,cuda_ipc", .cuda_memory = true};
    using Forwarding::Forwarding;
    const transport::Capabilities* capabilities() const override { return &caps; }
  };
  auto cuda_paced = storage::make_paced_client(std::make_unique<CudaCapable>(*client_), paced_cfg);
  ASSERT_TRUE(cuda_paced.ok());
  p = pipeline::Pipeline::create(**cuda_paced, profile_, pc);
  if (gpu::probe_device().ok()) return;  // GpuDirectLandsChunksInDeviceMemory covers a GPU machine
  // Past the capability check, the GPU itself is what is missing here, and said so.
  ASSERT_FALSE(p.ok());
  expect_no_usable_gpu(p.status());
}

TEST_F(PipelineTest, DeviceDestinationNeedsAGpuPipeline) {
  auto p = pipeline::Pipeline::create(*client_, profile_, gpu_config(pipeline::DecodeOn::cpu));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->decodes_on(), pipeline::DecodeOn::cpu);
  pipeline::FetchRequest req = request(KvView{});
  static std::byte not_device[16];
  req.device.chunks.assign(ranges_.size(), not_device);
  const auto f = (*p)->fetch(req, by_index());
  EXPECT_EQ(f.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(f.status().message().find("GPU pipeline"), std::string::npos) << f.status().to_string();
  // A view said to lie in device memory, likewise.
  auto out = KvCache::create(kGeom, DType::f16, kTokens).value();
  pipeline::FetchRequest in_device = request(out.view());
  in_device.destination_memory = MemoryType::cuda;
  const auto g = (*p)->fetch(in_device, by_index());
  EXPECT_EQ(g.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(g.status().message().find("GPU pipeline"), std::string::npos) << g.status().to_string();
}

TEST_F(PipelineTest, GpuFetchIntoDeviceMemoryEqualsTheCpuFetch) {
  const auto probe = gpu::probe_device();
  if (!probe.ok())
    GTEST_SKIP() << probe.status().message()
                 << " -- the fetch into device memory is checked on a GPU machine (perf/gpu/run.sh)";
  auto gp = pipeline::Pipeline::create(*client_, profile_, gpu_config(pipeline::DecodeOn::gpu));
  ASSERT_TRUE(gp.ok()) << gp.status().to_string();
  ASSERT_EQ((*gp)->decodes_on(), pipeline::DecodeOn::gpu);
  auto cp = pipeline::Pipeline::create(*client_, profile_, gpu_config(pipeline::DecodeOn::cpu));
  ASSERT_TRUE(cp.ok());
  // Each chunk at level i % 4 (by_index): every level is compared.
  for (DType dt : {DType::f16, DType::bf16, DType::f32}) {
    SCOPED_TRACE(fmt::format("dtype {}", int(dt)));
    auto ref = KvCache::create(kGeom, dt, kTokens).value();
    auto cf = (*cp)->fetch(request(ref.view()), by_index());
    ASSERT_TRUE(cf.ok());
    ASSERT_TRUE((*cf)->wait().ok());
    // The runtime's device memory: one allocation, chunk i packed at its offset.
    std::vector<uint64_t> offset, bytes;
    uint64_t total = 0;
    for (const auto& r : ranges_) {
      offset.push_back(total);
      bytes.push_back(gpu::GpuDecoder::output_bytes(kGeom, r.size(), dt));
      total += bytes.back();
    }
    auto dev = gpu::DeviceBuffer::allocate(total);
    ASSERT_TRUE(dev.ok()) << dev.status().to_string();
    pipeline::FetchRequest req = request(KvView{});
    req.device.dtype = dt;
    for (uint64_t o : offset) req.device.chunks.push_back(static_cast<std::byte*>(dev->data()) + o);
    auto gf = (*gp)->fetch(req, by_index());
    ASSERT_TRUE(gf.ok()) << gf.status().to_string();
    ASSERT_TRUE((*gf)->wait().ok());
    EXPECT_EQ((*gp)->buffers_in_use(), 0u);
    std::vector<std::byte> host(total);
    ASSERT_TRUE(gpu::copy_to_host(host.data(), dev->data(), total).ok());
    for (uint32_t i = 0; i < ranges_.size(); ++i) {
      auto packed = KvCache::create(kGeom, dt, ranges_[i].size()).value();
      ASSERT_TRUE(copy_kv(*ref.view().slice(ranges_[i]), packed.view()).ok());
      ASSERT_EQ(packed.bytes().size(), bytes[i]);
      EXPECT_EQ(std::memcmp(host.data() + offset[i], packed.bytes().data(), bytes[i]), 0)
          << "chunk " << i << " (level " << level_of(i) << ") differs from the CPU's fetch";
    }
  }
  // A host pointer is refused before anything is fetched.
  pipeline::FetchRequest bad = request(KvView{});
  std::vector<std::byte> host_mem(1 << 20);
  bad.device.chunks.assign(ranges_.size(), host_mem.data());
  EXPECT_EQ((*gp)->fetch(bad, by_index()).status().code(), StatusCode::invalid_argument);
}

}  // namespace

// A paged runtime's KV in device memory: the same KvView type as on the host, over
// device pointers. Only a GPU pipeline writes there; with one, the fetch equals the CPU
// pipeline's into the same layout in host memory, byte for byte across the pools.
namespace {

constexpr uint32_t kBlock = 16;

std::vector<uint32_t> scattered_table(uint64_t blocks) {
  std::vector<uint32_t> t(blocks);
  for (uint64_t b = 0; b < blocks; ++b) t[b] = uint32_t((b * 13) % blocks);  // 13 prime to blocks: a permutation
  return t;
}

TEST_F(PipelineTest, GpuFetchIntoPagedDeviceKvEqualsTheCpuFetch) {
  const auto probe = gpu::probe_device();
  if (!probe.ok())
    GTEST_SKIP() << probe.status().message()
                 << " -- the fetch into paged device KV is checked on a GPU machine (perf/gpu/run.sh)";
  auto gp = pipeline::Pipeline::create(*client_, profile_, gpu_config(pipeline::DecodeOn::gpu));
  ASSERT_TRUE(gp.ok()) << gp.status().to_string();
  auto cp = pipeline::Pipeline::create(*client_, profile_, gpu_config(pipeline::DecodeOn::cpu));
  ASSERT_TRUE(cp.ok());
  const uint64_t blocks = (kTokens + kBlock - 1) / kBlock + 3;
  const size_t pool = size_t(blocks) * kBlock * kGeom.channels() * 2;
  for (PagedOrder order : {PagedOrder::nhd, PagedOrder::hnd}) {
    SCOPED_TRACE(order == PagedOrder::nhd ? "NHD" : "HND");
    std::vector<std::vector<std::byte>> host(2 * kGeom.layers, std::vector<std::byte>(pool, std::byte{0x3C}));
    std::vector<gpu::DeviceBuffer> dev;
    std::vector<void*> hk, hv, dk, dv;
    for (uint32_t i = 0; i < 2 * kGeom.layers; ++i) {
      dev.push_back(gpu::DeviceBuffer::allocate(pool).value());
      ASSERT_TRUE(gpu::copy_to_device(dev.back().data(), host[i].data(), pool).ok());
      (i % 2 ? hv : hk).push_back(host[i].data());
      (i % 2 ? dv : dk).push_back(dev.back().data());
    }
    auto table = scattered_table(blocks);
    table.resize((kTokens + kBlock - 1) / kBlock);
    const KvView hview =
        KvView::paged(PagedLayout::blocks(order, kGeom, kBlock, blocks, hk, hv, table), DType::f16, kGeom, kTokens)
            .value();
    const KvView dview =
        KvView::paged(PagedLayout::blocks(order, kGeom, kBlock, blocks, dk, dv, table), DType::f16, kGeom, kTokens)
            .value();
    auto cf = (*cp)->fetch(request(hview), by_index());
    ASSERT_TRUE(cf.ok());
    ASSERT_TRUE((*cf)->wait().ok());
    pipeline::FetchRequest req = request(dview);
    req.destination_memory = MemoryType::cuda;
    auto gf = (*gp)->fetch(req, by_index());
    ASSERT_TRUE(gf.ok()) << gf.status().to_string();
    ASSERT_TRUE((*gf)->wait().ok());
    for (uint32_t i = 0; i < 2 * kGeom.layers; ++i) {
      std::vector<std::byte> back(pool);
      ASSERT_TRUE(gpu::copy_to_host(back.data(), dev[i].data(), pool).ok());
      EXPECT_TRUE(back == host[i]) << "tensor " << i << " differs from the CPU pipeline's";
    }
    // The host view marked as device memory is refused before anything is fetched.
    pipeline::FetchRequest bad = request(hview);
    bad.destination_memory = MemoryType::cuda;
    EXPECT_EQ((*gp)->fetch(bad, by_index()).status().code(), StatusCode::invalid_argument);
  }
}

}  // namespace

// GPUDirect wired end to end with a client whose transport declares cuda memory: its
// device registrations are plain handles over device memory, and a chunk asked into one
// is fetched by the fixture's client and copied into it (what a CUDA-capable transport
// does by DMA). The pipeline registers device receive buffers, the chunks land there,
// and the decoder reads them where they lie after checking their host copies; one
// chunk altered in device memory after landing fails, by its index.
namespace {

struct CudaLandingClient : Forwarding {
  transport::Capabilities caps{.backend = "ucx", .provider = "cuda_copy (test)", .cuda_memory = true};
  std::atomic<int> landed{0};
  int corrupt_chunk = -1;
  using Forwarding::Forwarding;
  const transport::Capabilities* capabilities() const override { return &caps; }
  using Forwarding::register_memory;
  Result<transport::MemoryRegion> register_memory(void* d, size_t n, transport::MemoryType type) override {
    if (type != transport::MemoryType::cuda) return c.register_memory(d, n);
    auto impl = std::make_shared<transport::MemoryRegion::Impl>();
    impl->data = static_cast<std::byte*>(d), impl->size = n, impl->type = type;
    return transport::RegionAccess::wrap(impl);
  }
  void get_async(const std::string& x, uint32_t i, uint32_t l, transport::MemoryRegion m, size_t o, size_t n,
                 transport::Deadline d, const transport::CancelToken& k, storage::GetCallback cb) override {
    if (m.type() != transport::MemoryType::cuda) return c.get_async(x, i, l, std::move(m), o, n, d, k, std::move(cb));
    auto host = std::make_shared<std::vector<std::byte>>(n);
    auto region = c.register_memory(host->data(), n);
    if (!region.ok()) return cb(region.status());
    c.get_async(x, i, l, *region, 0, n, d, k, [this, host, m, o, i, cb = std::move(cb)](Result<size_t> got) {
      if (got.ok()) {
        if (int(i) == corrupt_chunk) (*host)[*got / 2] ^= std::byte{0x40};
        if (Status st = gpu::copy_to_device(m.data() + o, host->data(), *got); !st.ok()) return cb(st);
        ++landed;
      }
      cb(std::move(got));
    });
  }
};

TEST_F(PipelineTest, GpuDirectLandsChunksInDeviceMemory) {
  CudaLandingClient landing(*client_);
  auto pc = gpu_config(pipeline::DecodeOn::gpu);
  pc.gpudirect = true;
  auto gp = pipeline::Pipeline::create(landing, profile_, pc);
  if (!gpu::probe_device().ok()) {
    ASSERT_FALSE(gp.ok());
    expect_no_usable_gpu(gp.status());
    GTEST_SKIP() << gp.status().message() << " -- GPUDirect's landing is checked on a GPU machine (perf/gpu/run.sh)";
  }
  ASSERT_TRUE(gp.ok()) << gp.status().to_string();
  auto cp = pipeline::Pipeline::create(*client_, profile_, gpu_config(pipeline::DecodeOn::cpu));
  ASSERT_TRUE(cp.ok());
  auto ref = KvCache::create(kGeom, DType::f16, kTokens).value();
  auto cf = (*cp)->fetch(request(ref.view()), by_index());
  ASSERT_TRUE(cf.ok());
  ASSERT_TRUE((*cf)->wait().ok());
  auto dev = gpu::DeviceBuffer::allocate(gpu::GpuDecoder::output_bytes(kGeom, kTokens, DType::f16));
  ASSERT_TRUE(dev.ok());
  const KvView dview = KvView::packed(dev->data(), DType::f16, kGeom, kTokens).value();
  pipeline::FetchRequest req = request(dview);
  req.destination_memory = MemoryType::cuda;
  auto gf = (*gp)->fetch(req, by_index());
  ASSERT_TRUE(gf.ok()) << gf.status().to_string();
  ASSERT_TRUE((*gf)->wait().ok());
  EXPECT_EQ(landing.landed.load(), int(ranges_.size()));
  std::vector<std::byte> back(dev->size());
  ASSERT_TRUE(gpu::copy_to_host(back.data(), dev->data(), back.size()).ok());
  EXPECT_EQ(0, std::memcmp(back.data(), ref.bytes().data(), back.size()));
  // A chunk altered in device memory: its host copy fails the checksum, by index.
  landing.corrupt_chunk = 2;
  std::map<uint32_t, Status> outcome;
  std::mutex mu;
  pipeline::FetchCallbacks cb = by_index();
  cb.on_chunk = [&](const pipeline::ChunkTimings& t) {
    std::lock_guard lock(mu);
    outcome[t.chunk] = t.status;
  };
  auto bad = (*gp)->fetch(req, cb);
  ASSERT_TRUE(bad.ok());
  EXPECT_FALSE((*bad)->wait().ok());
  std::lock_guard lock(mu);
  ASSERT_TRUE(outcome.count(2));
  EXPECT_EQ(outcome[2].code(), StatusCode::corrupt_data) << outcome[2].to_string();
}

}  // namespace

}  // namespace kvstream::test_pipeline_gpu
