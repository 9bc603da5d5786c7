// The GPU decoder on progressive streams (bitstream version 2).
//  * Here, without a GPU: the host half (gpu/layered_descriptors) executed on the CPU
//    with the codec's own pieces (rANS decode per matrix with the descriptors' tables
//    and table ids, the refinement, the reconstruction at each plane's level) equals
//    codec::decode_chunk for every prefix of streams with one and two plane groups,
//    with and without recent rows, KLT planes and RoPE; defects found without decoding
//    are the CPU's errors.
//  * On a GPU: every prefix decoded on the device equals the CPU's, packed and paged;
//    refine(kept, more) equals decoding the longer prefix; a refinement substream
//    altered and resealed fails on the device, named. These skip without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <vector>

#include "codec/entropy/rans.hpp"
#include "codec/impl_access.hpp"
#include "codec/layered_quant.hpp"
#include "codec/plane_reconstruct.hpp"
#include "codec/profile_impl.hpp"
#include "gpu/layered_descriptors.hpp"
#include "kvstream/codec.hpp"
#include "kvstream/gpu.hpp"
#include "kvstream/gpu_decoder.hpp"
#include "kvstream/gpu_resources.hpp"
#include "kvstream/log.hpp"
#include "tests/codec/synthetic_kv.hpp"
#include "tests/fuzz/fuzz_common.hpp"

namespace kvstream::gpu::test_gpu_progressive {
namespace {

using codec::Profile;

struct PCase {
  const char* name;
  KvGeometry geom;
  RopeParams rope;
  uint64_t tokens;    // of the test chunk: 600 x 8 channels gives two plane groups
  uint32_t recent;    // recent rows (EncodeOptions::recent_tokens)
  bool klt;
  bool lead = false;  // the recent rows stay ahead in every refinement layer
};

const std::vector<PCase>& pcases() {
  static const std::vector<PCase> c = {
      {"grouped_recent", {8, 1, 8, 2, AttentionKind::gqa}, {true, 10000.0f, 0, RopePairing::interleaved}, 600, 40, false},
      {"grouped_plain", {8, 1, 8, 2, AttentionKind::gqa}, {true, 10000.0f, 0, RopePairing::interleaved}, 600, 0, true},
      {"one_group_klt_recent", {2, 2, 32, 4, AttentionKind::gqa}, {true, 500000.0f, 16, RopePairing::half}, 77, 13, true},
      {"whole_chunk_recent", {2, 2, 16, 2, AttentionKind::mha}, {}, 9, 9, false},
      {"grouped_lead", {8, 1, 8, 2, AttentionKind::gqa}, {true, 10000.0f, 0, RopePairing::interleaved}, 600, 40, false, true},
      {"one_group_klt_lead", {2, 2, 32, 4, AttentionKind::gqa}, {true, 500000.0f, 16, RopePairing::half}, 77, 13, true, true},
  };
  return c;
}

const Profile& pprofile(const PCase& cs) {
  static std::map<std::string, Profile> built;
  if (auto it = built.find(cs.name); it != built.end()) return it->second;
  set_log_level(LogLevel::warn);
  const KvCache a = test_util::synthetic_cache(cs.geom, DType::f32, 160, 0, cs.rope, 11);
  const KvCache b = test_util::synthetic_cache(cs.geom, DType::f32, 96, 500, cs.rope, 12);
  const std::vector<KvView> views = {a.view(), b.view()};
  codec::ProfileOptions opt;
  opt.progressive = true;
  opt.progressive_layers = 3;
  opt.progressive_base_step = 2.0f;
  opt.recent_tokens = 64;
  opt.recent_layers = 1;
  opt.recent_lead = cs.lead;
  opt.allow_transform = cs.klt;
  opt.transform_min_gain = 0.0;
  opt.max_tables_per_level = 8;
  auto p = codec::ProfileBuilder::build(views, cs.rope, opt);
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return built.emplace(cs.name, std::move(p).value()).first->second;
}

std::vector<uint8_t> encode(const Profile& p, const PCase& cs, uint64_t seed) {
  const KvCache src = test_util::synthetic_cache(cs.geom, DType::f32, cs.tokens, 1000, cs.rope, seed);
  std::vector<uint8_t> bytes;
  const Status st = codec::encode_chunk(p, src.view(), 0, {cs.recent}, bytes);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return bytes;
}

// What the kernels do, done on the CPU with the codec's pieces, from the descriptors
// alone: each step's matrices decoded with the tables and table ids the descriptors
// name, the indices widened and refined, each plane reconstructed at its levels.
Status execute_on_cpu(const Profile& prof, std::span<const uint8_t> bytes, const detail::LayeredDescriptors& d,
                      const KvView& out) {
  const Profile::Impl& p = codec::ProfileAccess::of(prof);
  const uint32_t C = p.geom.channels(), T = d.header.info.tokens, S = uint32_t(d.planes.size()), P = p.geom.planes();
  const size_t E = size_t(S) * T * C;
  std::vector<int8_t> syms(E), rsyms(E);
  std::vector<uint8_t> ids(E);
  std::vector<int32_t> q(E);
  for (const auto& st : d.steps) {
    const Profile::Impl::Level& lv = p.levels[st.level];
    auto for_each = [&](auto fn) {
      for (uint32_t pl = 0; pl < st.planes; ++pl)
        for (uint32_t r = 0; r < st.rows; ++r)
          for (uint32_t c = 0; c < C; ++c)
            fn((size_t(pl) * st.rows + r) * C + c, (size_t(pl) * T + st.row0 + r) * C + c, size_t(pl) * C + c);
    };
    if (st.refine)
      for_each([&](size_t i, size_t qi, size_t t) {
        ids[i] = q[qi] != 0 ? lv.table_of[codec::kRoleCoarseNonzero][t] : lv.table_of[codec::kRoleCoarseZero][t];
      });
    for (uint32_t k = st.first_mat; k < st.first_mat + st.n_mats; ++k) {
      const detail::MatDesc& m = d.mats[k];
      const size_t len = 12 + 2 * size_t(m.n_words) + m.n_escapes + 4 * detail::kLanes;
      const auto in = bytes.subspan(m.words_off - 12, len);
      const std::span<const uint8_t> tid =
          st.refine ? std::span<const uint8_t>(ids.data() + m.table_of_off, m.cols)
                    : std::span<const uint8_t>(lv.table_of[codec::kRolePlain].data() + m.table_of_off, m.cols);
      KVS_RETURN_IF_ERROR(
          codec::rans_decode(*lv.rans, tid, in, (st.refine ? rsyms : syms).data() + m.sym_off, m.rows, m.cols));
    }
    if (!st.refine) {
      for (size_t i = 0; i < E; ++i) q[i] = syms[i];
      continue;
    }
    for_each([&](size_t i, size_t qi, size_t) { q[qi] = codec::refine_index(q[qi], rsyms[i]); });
  }
  codec::RopeTable rope;
  const uint64_t rope_row = codec::unrotates(p, 0) ? rope.ensure(p.rope, p.geom.head_dim, d.header.info.first_position, T) : 0;
  codec::PlaneScratch scratch;
  codec::MatrixPlan plan;
  auto level_of_step = [&](float step) {
    for (uint32_t l = 0; l < p.levels.size(); ++l)
      if (p.levels[l].info.step == step) return l;
    return uint32_t(0);
  };
  for (const detail::PlaneDesc& pd : d.planes) {
    codec::ExactValues ex;
    ex.out_index.assign(d.list_index.begin() + pd.out_begin, d.list_index.begin() + pd.out_begin + pd.out_count);
    ex.out_value.assign(d.list_value.begin() + pd.out_begin, d.list_value.begin() + pd.out_begin + pd.out_count);
    ex.direct_index.assign(d.list_index.begin() + pd.exact_begin,
                           d.list_index.begin() + pd.exact_begin + pd.exact_count);
    ex.direct_value.assign(d.list_value.begin() + pd.exact_begin,
                           d.list_value.begin() + pd.exact_begin + pd.exact_count);
    const uint32_t l = pd.plane_index / P, pl = pd.plane_index % P;
    const int32_t* qp = q.data() + pd.plain_sym_off;
    if (pd.split > 0) {
      plan.build(p, level_of_step(pd.step), l, pl);
      codec::reconstruct_rows(p, plan, l, pl, 0, pd.split, qp, ex, scratch, rope, rope_row, out);
    }
    if (pd.split < T) {
      plan.build(p, level_of_step(pd.recent_step), l, pl);
      codec::reconstruct_rows(p, plan, l, pl, pd.split, T, qp + size_t(pd.split) * C, ex, scratch, rope, rope_row,
                              out);
    }
  }
  return {};
}

std::vector<uint64_t> prefix_ends(const std::vector<uint8_t>& bytes) {
  std::vector<uint64_t> e;
  for (const codec::ChunkPrefix& pf : codec::chunk_prefixes(bytes).value()) e.push_back(pf.end);
  return e;
}

std::vector<uint64_t> ut_offsets(const Profile& prof) {
  const Profile::Impl& p = codec::ProfileAccess::of(prof);
  std::vector<uint64_t> off;
  uint64_t at = 0;
  for (uint32_t lp = 0; lp < p.geom.layers * p.geom.planes(); ++lp) {
    off.push_back(at);
    if (p.block_of(lp)) at += p.transform_t[lp].size();
  }
  return off;
}

class ProgressiveCase : public ::testing::TestWithParam<std::string> {
 protected:
  const PCase& cs() const {
    for (const PCase& c : pcases())
      if (GetParam() == c.name) return c;
    std::abort();
  }
};

TEST_P(ProgressiveCase, DescriptorsExecutedOnTheCpuEqualTheCodecEveryPrefix) {
  const Profile& p = pprofile(cs());
  const std::vector<uint8_t> bytes = encode(p, cs(), 5);
  const std::vector<uint64_t> ends = prefix_ends(bytes);
  const auto ut = ut_offsets(p);
  bool grouped = false;
  for (uint64_t end : ends) {
    const std::span<const uint8_t> prefix(bytes.data(), end);
    detail::LayeredDescriptors d;
    const Status st = detail::parse_layered_chunk(p, ut, prefix, d);
    ASSERT_TRUE(st.ok()) << "prefix " << end << ": " << st.to_string();
    grouped |= d.header.grouping.groups > 1 && d.extent.partial_groups > 0;
    KvCache want = KvCache::create(cs().geom, DType::f32, cs().tokens, 1000).value();
    KvCache got = KvCache::create(cs().geom, DType::f32, cs().tokens, 1000).value();
    std::memset(got.bytes().data(), 0x7f, got.bytes().size());
    ASSERT_TRUE(codec::decode_chunk(p, prefix, want.view()).ok());
    const Status ex = execute_on_cpu(p, prefix, d, got.view());
    ASSERT_TRUE(ex.ok()) << "prefix " << end << ": " << ex.to_string();
    EXPECT_EQ(0, std::memcmp(want.bytes().data(), got.bytes().data(), want.bytes().size())) << "prefix " << end;
  }
  if (cs().geom.channels() == 8) EXPECT_TRUE(grouped) << "no prefix ended inside a layer";
  if (cs().recent) EXPECT_EQ(codec::inspect_chunk(bytes)->recent_tokens, cs().recent);
}

TEST_P(ProgressiveCase, DefectsFoundWithoutDecodingAreTheCpusErrors) {
  const Profile& p = pprofile(cs());
  const std::vector<uint8_t> bytes = encode(p, cs(), 6);
  const auto ut = ut_offsets(p);
  KvCache out = KvCache::create(cs().geom, DType::f32, cs().tokens, 1000).value();
  detail::LayeredDescriptors d;
  // Cut inside the last substream, and a flipped byte there.
  const std::span<const uint8_t> cut(bytes.data(), bytes.size() - 3);
  EXPECT_EQ(detail::parse_layered_chunk(p, ut, cut, d).code(), codec::decode_chunk(p, cut, out.view()).code());
  EXPECT_EQ(detail::parse_layered_chunk(p, ut, cut, d).code(), StatusCode::corrupt_data);
  std::vector<uint8_t> flipped = bytes;
  flipped[bytes.size() - 40] ^= 0x04;
  EXPECT_EQ(detail::parse_layered_chunk(p, ut, flipped, d).code(), StatusCode::corrupt_data);
  EXPECT_EQ(codec::decode_chunk(p, flipped, out.view()).code(), StatusCode::corrupt_data);
  // Another profile's stream.
  const PCase& other = pcases()[(&cs() - pcases().data() + 2) % pcases().size()];
  if (!(other.geom == cs().geom)) {
    const Profile& q = pprofile(other);
    const std::vector<uint8_t> foreign = encode(q, other, 7);
    EXPECT_FALSE(detail::parse_layered_chunk(p, ut, foreign, d).ok());
  }
}

// The GPU test below alters a refinement substream and reseals the stream, so that
// only the device's rANS checks can see the defect. Here: resealing leaves a genuine
// stream as it is (every layout, the recent rows' lead included), the altered stream
// passes the host's checks, and the CPU decoder names the layer it fails in.
TEST_P(ProgressiveCase, AResealedRefinementDefectPassesTheHostChecksAndNamesItsLayer) {
  const Profile& p = pprofile(cs());
  const std::vector<uint8_t> bytes = encode(p, cs(), 8);
  std::vector<uint8_t> same = bytes;
  fuzz::progressive_reseal(same);
  EXPECT_TRUE(same == bytes) << "resealing changed a genuine stream";
  std::vector<uint8_t> bad = bytes;
  bad[bad.size() - 200] ^= 0x21;
  fuzz::progressive_reseal(bad);
  detail::LayeredDescriptors d;
  const Status host = detail::parse_layered_chunk(p, ut_offsets(p), bad, d);
  EXPECT_TRUE(host.ok()) << host.to_string();
  KvCache out = KvCache::create(cs().geom, DType::f16, cs().tokens, 1000).value();
  const Status st = codec::decode_chunk(p, bad, out.view());
  if (!st.ok()) {
    EXPECT_EQ(st.code(), StatusCode::corrupt_data) << st.to_string();
    EXPECT_NE(st.message().find("refinement layer"), std::string::npos) << st.to_string();
  }
}

// ---- on a GPU ------------------------------------------------------------------------

TEST_P(ProgressiveCase, OnTheGpuEveryPrefixAndEveryRefinementEqualTheCpu) {
  const Profile& p = pprofile(cs());
  auto gpu = GpuDecoder::create(p);
  if (!gpu.ok()) GTEST_SKIP() << "no usable GPU: " << gpu.status().to_string();
  const std::vector<uint8_t> bytes = encode(p, cs(), 8);
  const std::vector<uint64_t> ends = prefix_ends(bytes);
  const uint64_t out_bytes = GpuDecoder::output_bytes(cs().geom, cs().tokens, DType::f16);
  DeviceBuffer dev = DeviceBuffer::allocate(out_bytes).value();
  const KvView view = KvView::packed(dev.data(), DType::f16, cs().geom, cs().tokens, 1000).value();
  auto cpu_of = [&](uint64_t end) {
    KvCache c = KvCache::create(cs().geom, DType::f16, cs().tokens, 1000).value();
    EXPECT_TRUE(codec::decode_chunk(p, std::span(bytes.data(), end), c.view()).ok());
    return c;
  };
  auto device_bytes = [&] {
    std::vector<std::byte> b(out_bytes);
    EXPECT_TRUE(copy_to_host(b.data(), dev.data(), out_bytes).ok());
    return b;
  };
  for (uint64_t end : ends) {
    const KvCache want = cpu_of(end);
    KvCache got = KvCache::create(cs().geom, DType::f16, cs().tokens, 1000).value();
    ASSERT_TRUE((*gpu)->decode_to_host(std::span(bytes.data(), end), got.view()).ok());
    EXPECT_EQ(0, std::memcmp(want.bytes().data(), got.bytes().data(), want.bytes().size())) << "prefix " << end;
  }
  // Refinement from every prefix to every longer one, in device memory.
  for (size_t a = 0; a < ends.size(); ++a)
    for (size_t b = a + 1; b < ends.size(); ++b) {
      ASSERT_TRUE((*gpu)->decode(std::span(bytes.data(), ends[a]), view).ok());
      const Status st = (*gpu)->refine(std::span(bytes.data(), ends[a]),
                                       std::span(bytes.data() + ends[a], ends[b] - ends[a]), view);
      ASSERT_TRUE(st.ok()) << st.to_string();
      const KvCache want = cpu_of(ends[b]);
      EXPECT_EQ(0, std::memcmp(device_bytes().data(), want.bytes().data(), out_bytes)) << ends[a] << " -> " << ends[b];
    }
  // A refinement substream altered and resealed: only the device's checks see it.
  std::vector<uint8_t> bad = bytes;
  bad[bad.size() - 200] ^= 0x21;
  fuzz::progressive_reseal(bad);
  KvCache probe = KvCache::create(cs().geom, DType::f16, cs().tokens, 1000).value();
  const Status cpu_st = codec::decode_chunk(p, bad, probe.view());
  if (cpu_st.code() == StatusCode::corrupt_data) {
    const Status st = (*gpu)->decode(bad, view);
    EXPECT_EQ(st.code(), StatusCode::corrupt_data) << st.to_string();
    EXPECT_NE(st.message().find("refinement layer"), std::string::npos) << st.to_string();
  }
}

std::vector<std::string> pnames() {
  std::vector<std::string> n;
  for (const PCase& c : pcases()) n.emplace_back(c.name);
  return n;
}
INSTANTIATE_TEST_SUITE_P(Streams, ProgressiveCase, ::testing::ValuesIn(pnames()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace kvstream::gpu::test_gpu_progressive
