#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "kvstream/kv_model.hpp"

namespace kvstream::test_kv_model {

namespace {
KvGeometry gqa() { return {3, 2, 8, 4, AttentionKind::gqa}; }

float value_of(uint32_t l, uint32_t p, uint64_t t, uint32_t c) { return float(l * 1000 + p * 100 + t) + c / 64.0f; }

void fill(const KvView& v) {
  const auto& g = v.geometry();
  std::vector<float> row(g.channels());
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < g.planes(); ++p)
      for (uint64_t t = 0; t < v.tokens(); ++t) {
        for (uint32_t c = 0; c < g.channels(); ++c) row[c] = value_of(l, p, t, c);
        v.store_row(l, p, t, row.data());
      }
}
}  // namespace

TEST(KvGeometry, Validates) {
  EXPECT_TRUE(gqa().validate().ok());
  EXPECT_TRUE((KvGeometry{32, 32, 128, 32, AttentionKind::mha}).validate().ok());
  EXPECT_TRUE((KvGeometry{61, 1, 576, 128, AttentionKind::mla}).validate().ok());
  EXPECT_EQ((KvGeometry{61, 1, 576, 128, AttentionKind::mla}).planes(), 1u);
  EXPECT_FALSE((KvGeometry{0, 2, 8, 4, AttentionKind::gqa}).validate().ok());
  EXPECT_FALSE((KvGeometry{2, 3, 8, 4, AttentionKind::gqa}).validate().ok());   // 4 % 3
  EXPECT_FALSE((KvGeometry{2, 2, 8, 4, AttentionKind::mla}).validate().ok());   // MLA has one head
  EXPECT_FALSE((KvGeometry{2, 2, 8, 4, AttentionKind::mha}).validate().ok());   // MHA q == kv
}

TEST(KvView, PackedRowsAndSlice) {
  auto cache = KvCache::create(gqa(), DType::f16, 10, 100);
  ASSERT_TRUE(cache.ok());
  fill(cache->view());
  auto h = [](float v) { return f16_to_f32(f32_to_f16(v)); };
  EXPECT_EQ(cache->at(2, 1, 9, 15), h(value_of(2, 1, 9, 15)));
  auto s = cache->view().slice({4, 7});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->tokens(), 3u);
  EXPECT_EQ(s->first_position(), 104u);
  std::vector<float> row(16);
  s->load_row(1, 0, 2, row.data());
  EXPECT_EQ(row[3], h(value_of(1, 0, 6, 3)));
  EXPECT_FALSE(cache->view().slice({5, 11}).ok());
}

TEST(KvView, PagedMatchesPackedBothWays) {
  const KvGeometry g = gqa();
  const uint64_t tokens = 37;
  const uint32_t block = 8, num_blocks = 12;
  // vLLM flash layout per layer: [2][num_blocks][block][kv_heads][head_dim], bf16.
  const int64_t C = g.channels();
  std::vector<std::vector<uint16_t>> layers(g.layers, std::vector<uint16_t>(2 * num_blocks * block * C, 0xffff));
  PagedLayout pl;
  for (auto& l : layers) pl.layer_base.push_back(l.data());
  pl.block_size = block;
  pl.plane_stride = int64_t(num_blocks) * block * C;
  pl.block_stride = int64_t(block) * C;
  pl.slot_stride = C;
  pl.num_blocks = num_blocks;
  pl.block_table = {7, 2, 11, 0, 5};  // scattered on purpose
  auto paged = KvView::paged(pl, DType::bf16, g, tokens, 0);
  ASSERT_TRUE(paged.ok()) << paged.status().to_string();

  auto src = KvCache::create(g, DType::f32, tokens);
  ASSERT_TRUE(src.ok());
  fill(src->view());
  ASSERT_TRUE(copy_kv(src->view(), *paged).ok());  // scatter
  auto back = KvCache::create(g, DType::f32, tokens);
  ASSERT_TRUE(copy_kv(*paged, back->view()).ok());  // gather
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < 2; ++p)
      for (uint64_t t = 0; t < tokens; ++t)
        for (uint32_t c = 0; c < C; ++c)
          ASSERT_EQ(back->at(l, p, t, c), bf16_to_f32(f32_to_bf16(value_of(l, p, t, c))));
  // Token 9 lives in physical block 2, slot 1.
  const uint16_t* expect = layers[1].data() + 1 * pl.plane_stride + 2 * pl.block_stride + 1 * C + 5;
  EXPECT_EQ(*expect, f32_to_bf16(value_of(1, 1, 9, 5)));
  // Block 3 (unused by the table) stays untouched.
  EXPECT_EQ(layers[0][3 * pl.block_stride], 0xffff);

  // A paged slice sees the right tokens.
  auto s = paged->slice({9, 20});
  ASSERT_TRUE(s.ok());
  std::vector<float> row(C);
  s->load_row(2, 0, 0, row.data());
  EXPECT_EQ(row[0], bf16_to_f32(f32_to_bf16(value_of(2, 0, 9, 0))));
}

// vLLM's layouts with K and V in tensors of their own, per layer
// [num_blocks][block][kv_heads][head_dim] (NHD) or [num_blocks][kv_heads][block][head_dim]
// (HND, where a token's heads lie block*head_dim apart): the same scatter and gather,
// and each element where the layout puts it.
TEST(KvView, PagedBlocksWithSeparateKAndVInBothOrders) {
  const KvGeometry g = gqa();
  const uint64_t tokens = 37;
  const uint32_t block = 8, num_blocks = 12, H = g.kv_heads, D = g.head_dim;
  const int64_t C = g.channels();
  const std::vector<uint32_t> table = {7, 2, 11, 0, 5};
  auto src = KvCache::create(g, DType::f32, tokens);
  ASSERT_TRUE(src.ok());
  fill(src->view());
  for (PagedOrder order : {PagedOrder::nhd, PagedOrder::hnd}) {
    SCOPED_TRACE(order == PagedOrder::nhd ? "NHD" : "HND");
    std::vector<std::vector<uint16_t>> k(g.layers, std::vector<uint16_t>(num_blocks * block * C, 0xffff));
    auto v = k;
    std::vector<void*> kp, vp;
    for (uint32_t l = 0; l < g.layers; ++l) kp.push_back(k[l].data()), vp.push_back(v[l].data());
    auto paged = KvView::paged(PagedLayout::blocks(order, g, block, num_blocks, kp, vp, table), DType::f16, g, tokens);
    ASSERT_TRUE(paged.ok()) << paged.status().to_string();
    EXPECT_EQ(paged->rows_dense(), order == PagedOrder::nhd);
    ASSERT_TRUE(copy_kv(src->view(), *paged).ok());
    auto back = KvCache::create(g, DType::f32, tokens);
    ASSERT_TRUE(copy_kv(*paged, back->view()).ok());
    for (uint32_t l = 0; l < g.layers; ++l)
      for (uint32_t p = 0; p < 2; ++p)
        for (uint64_t t = 0; t < tokens; ++t)
          for (uint32_t c = 0; c < C; ++c)
            ASSERT_EQ(back->at(l, p, t, c), f16_to_f32(f32_to_f16(value_of(l, p, t, c))));
    // Token 9 is in physical block 2, slot 1; channel 13 is head 1, dim 5.
    const size_t at = order == PagedOrder::nhd ? size_t(2 * block * C + 1 * C + 1 * D + 5)
                                               : size_t(2 * block * C + 1 * block * D + 1 * D + 5);
    EXPECT_EQ(v[1][at], f32_to_f16(value_of(1, 1, 9, 13)));
    EXPECT_EQ(k[2][at], f32_to_f16(value_of(2, 0, 9, 13)));
    EXPECT_EQ(k[0][3 * block * C], 0xffff);  // block 3 is not in the table
    (void)H;
  }
}

TEST(KvView, PagedRejectsBadValuePointers) {
  const KvGeometry g = gqa();
  std::vector<float> mem(4096);
  std::vector<void*> three(3, mem.data()), two(2, mem.data());
  auto pl = PagedLayout::blocks(PagedOrder::hnd, g, 4, 2, three, two, {0, 1});
  EXPECT_EQ(KvView::paged(pl, DType::f32, g, 8).status().code(), StatusCode::invalid_argument);  // 2 for 3 layers
  pl.value_base = {mem.data(), nullptr, mem.data()};
  EXPECT_EQ(KvView::paged(pl, DType::f32, g, 8).status().code(), StatusCode::invalid_argument);  // null
  const KvGeometry mla{2, 1, 16, 4, AttentionKind::mla};
  auto one_plane = PagedLayout::blocks(PagedOrder::nhd, mla, 4, 2, two, two, {0, 1});
  EXPECT_EQ(KvView::paged(one_plane, DType::f32, mla, 8).status().code(), StatusCode::invalid_argument);
  one_plane.value_base.clear();
  EXPECT_TRUE(KvView::paged(one_plane, DType::f32, mla, 8).ok());
}

TEST(KvView, PagedRejectsBadTables) {
  const KvGeometry g = gqa();
  std::vector<float> mem(1000);
  PagedLayout pl;
  pl.layer_base = {mem.data(), mem.data(), mem.data()};
  pl.block_size = 4;
  pl.slot_stride = 16;
  pl.block_stride = 64;
  pl.num_blocks = 2;
  pl.block_table = {0, 1};
  EXPECT_FALSE(KvView::paged(pl, DType::f32, g, 9, 0).ok());  // needs 3 blocks
  pl.block_table = {0, 5, 1};
  EXPECT_FALSE(KvView::paged(pl, DType::f32, g, 9, 0).ok());  // 5 >= num_blocks
  pl.layer_base.pop_back();
  pl.block_table = {0, 1};
  EXPECT_FALSE(KvView::paged(pl, DType::f32, g, 8, 0).ok());  // layer count
}

TEST(KvView, StridedTokenMajorLayout) {
  // [token][layer][plane][channel], a layout some runtimes use for host staging.
  const KvGeometry g = gqa();
  const uint64_t tokens = 5;
  std::vector<float> mem(tokens * g.elements_per_token());
  KvStrides st{int64_t(2 * g.channels()), int64_t(g.channels()), int64_t(g.elements_per_token()), 1};
  auto v = KvView::strided(mem.data(), DType::f32, g, tokens, st);
  ASSERT_TRUE(v.ok());
  fill(*v);
  EXPECT_EQ(mem[3 * g.elements_per_token() + 2 * 2 * 16 + 16 + 4], value_of(2, 1, 3, 4));
}

TEST(KvCache, Truncate) {
  auto c = KvCache::create(gqa(), DType::f32, 10);
  fill(c->view());
  ASSERT_TRUE(c->truncate(4).ok());
  EXPECT_EQ(c->tokens(), 4u);
  EXPECT_EQ(c->at(2, 1, 3, 7), value_of(2, 1, 3, 7));
  EXPECT_FALSE(c->truncate(5).ok());
}

TEST(Rope, InverseUndoesForward) {
  for (RopePairing pairing : {RopePairing::interleaved, RopePairing::half}) {
    RopeParams r{true, 10000.0f, 0, pairing};
    std::mt19937 rng(1);
    std::normal_distribution<float> d;
    std::vector<float> x(64), y;
    for (auto& v : x) v = d(rng);
    y = x;
    rope_rotate(y.data(), 64, 377, r, false);
    EXPECT_NE(x, y);
    // Rotation keeps each pair's norm.
    const uint32_t stride = pairing == RopePairing::interleaved ? 1 : 32;
    for (uint32_t i = 0; i < 32; ++i) {
      const uint32_t a = pairing == RopePairing::interleaved ? 2 * i : i, b = a + stride;
      EXPECT_NEAR(x[a] * x[a] + x[b] * x[b], y[a] * y[a] + y[b] * y[b], 1e-4);
    }
    rope_rotate(y.data(), 64, 377, r, true);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], y[i], 1e-4);
  }
  // Partial rotary dims leave the tail alone.
  RopeParams partial{true, 10000.0f, 16, RopePairing::half};
  std::vector<float> z(64, 1.0f);
  rope_rotate(z.data(), 64, 5, partial, false);
  for (size_t i = 16; i < 64; ++i) EXPECT_EQ(z[i], 1.0f);
}

}  // namespace kvstream::test_kv_model
