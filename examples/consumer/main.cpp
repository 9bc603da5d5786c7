// Uses kvstream from its installed package: builds a GQA cache, scatters it into a
// paged (vLLM-style) layout and gathers it back, and asks for a GPU.
#include <cstdio>
#include <vector>

#include <kvstream/gpu.hpp>
#include <kvstream/kv_model.hpp>

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

  auto gpu = kvstream::gpu::probe_device();
  std::printf("consumer ok: paged round trip of %llu tokens; gpu: %s\n", (unsigned long long)back->tokens(),
              gpu.ok() ? gpu->name.c_str() : gpu.status().to_string().c_str());
  return 0;
}
