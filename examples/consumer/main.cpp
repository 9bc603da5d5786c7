// Uses kvstream from its installed package: builds a GQA cache, scatters it into a
// paged (vLLM-style) layout and gathers it back, asks for a GPU, and calls into the
// codec, the storage client, the pipeline and the front door, so that every library
// of the package links (with the shared and with the static build).
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <kvstream/codec.hpp>
#include <kvstream/gpu.hpp>
#include <kvstream/kv_model.hpp>
#include <kvstream/kv_store.hpp>
#include <kvstream/log.hpp>
#include <kvstream/pipeline.hpp>
#include <kvstream/storage.hpp>

// Each call must fail cleanly with the code named: nothing here has a server or profile.
static int expect_error(const kvstream::Status& s, kvstream::StatusCode want, const char* what) {
  if (s.code() == want) return 0;
  std::printf("%s: expected %s, got %s\n", what, std::string(kvstream::status_code_name(want)).c_str(),
              s.to_string().c_str());
  return 1;
}

int main() {
  const kvstream::KvGeometry g{2, 2, 4, 4, kvstream::AttentionKind::gqa};
  auto cache = kvstream::KvCache::create(g, kvstream::DType::f16, 6);
  if (!cache.ok()) return std::printf("%s\n", cache.status().to_string().c_str()), 1;
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < 2; ++p)
      for (uint64_t t = 0; t < 6; ++t)
        for (uint32_t c = 0; c < g.channels(); ++c) cache->set(l, p, t, c, float(l + p + t + c));

  std::vector<uint16_t> l0(2 * 4 * 4 * g.channels()), l1(l0.size());
  kvstream::PagedLayout pl;
  pl.layer_base = {l0.data(), l1.data()};
  pl.block_size = 4;
  pl.plane_stride = 4 * 4 * g.channels();
  pl.block_stride = 4 * g.channels();
  pl.slot_stride = g.channels();
  pl.num_blocks = 4;
  pl.block_table = {3, 1};
  auto paged = kvstream::KvView::paged(pl, kvstream::DType::f16, g, 6);
  if (!paged.ok()) return std::printf("%s\n", paged.status().to_string().c_str()), 1;
  if (auto s = kvstream::copy_kv(cache->view(), *paged); !s.ok()) return std::printf("%s\n", s.to_string().c_str()), 1;
  auto back = kvstream::KvCache::create(g, kvstream::DType::f32, 6);
  if (auto s = kvstream::copy_kv(*paged, back->view()); !s.ok()) return 1;
  for (uint32_t c = 0; c < g.channels(); ++c)
    if (back->at(1, 1, 5, c) != float(1 + 1 + 5 + c)) return std::printf("mismatch at channel %u\n", c), 1;

  int bad = 0;
  int log_lines = 0;
  kvstream::set_log_sink([&](kvstream::LogLevel, std::string_view) { ++log_lines; });
  const std::vector<uint8_t> junk(64, 0x5a);
  bad += expect_error(kvstream::codec::Profile::load(junk).status(), kvstream::StatusCode::corrupt_data, "codec");
  auto on = kvstream::pipeline::parse_decode_on("cpu");
  if (!on.ok()) return std::printf("pipeline: %s\n", on.status().to_string().c_str()), 1;
  kvstream::storage::ClientConfig cc;
  cc.address = "127.0.0.1:1";  // nothing listens on port 1
  cc.name_space = "consumer";
  cc.secret = "a secret of at least sixteen bytes";
  auto client = kvstream::storage::Client::connect(cc, kvstream::transport::deadline_in(std::chrono::seconds(5)), {});
  if (client.ok()) return std::printf("storage: connected to port 1?\n"), 1;
  kvstream::StoreConfig config;
  bad += expect_error(kvstream::KvStore::open(config).status(), kvstream::StatusCode::invalid_argument, "store");
  kvstream::set_log_sink({});
  if (bad) return 1;

  auto gpu = kvstream::gpu::probe_device();
  std::printf("consumer ok: paged round trip of %llu tokens; codec, storage (%s), pipeline and store answered; "
              "%d log lines to the host's sink; gpu: %s\n",
              (unsigned long long)back->tokens(), std::string(kvstream::status_code_name(client.status().code())).c_str(),
              log_lines, gpu.ok() ? gpu->name.c_str() : gpu.status().to_string().c_str());
  return 0;
}
