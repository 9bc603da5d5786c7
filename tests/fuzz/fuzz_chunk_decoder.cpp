// libFuzzer target: codec::inspect_chunk / decode_chunk / decode_chunk_parallel on
// untrusted bytes, and for progressive (version 2) streams chunk_header_bytes /
// chunk_prefixes / refine_chunk (framing in fuzz_common.hpp). Besides memory safety
// (ASan, UBSan) it checks invariants:
//   * decode_chunk, decode_chunk with a reused scratch and decode_chunk_parallel agree
//     (same status, and bit-identical output on success);
//   * a failed decode leaves the output untouched when the error is found before the
//     payload checksum passed (always the case without reseal);
//   * re-encoding a successful f32 decode either fails with invalid_argument (values
//     the encoder refuses, e.g. overflowed to inf) or yields a chunk that decodes; with
//     the progressive profile that chunk is the prefix of the level-0 stream that ends
//     at the level's whole-layer prefix point.
// Progressive streams (the fourth profile; its inputs carry two selectors that pick
// the prefix under test and a refine split point):
//   * chunk_header_bytes reads only the first 64 bytes; chunk_prefixes needs exactly
//     that many, and its points are ordered (ends non-decreasing, levels stepping down
//     by one at each whole-layer point, the last the whole stream at level 0), each
//     accepted by inspect_chunk at the level it names;
//   * inspect_chunk accepts a version-2 prefix only at a prefix point;
//   * refine_chunk(kept, more) after decode_chunk(kept) gives decode_chunk(kept + more)
//     bit for bit, fails exactly when that decode fails where `kept` ends at a prefix
//     point, and a failed refine leaves the output as the decode of `kept` left it.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "fuzz_common.hpp"

using namespace kvstream;
using namespace kvstream::codec;

namespace {

std::vector<Profile>* g_profiles = nullptr;
bool g_reseal_ok = false;
bool g_progressive_reseal_ok = false;
DecodeScratch* g_scratch = nullptr;

[[noreturn]] void fail(const char* what, const Status& st = {}) {
  std::fprintf(stderr, "fuzz_chunk_decoder: invariant broken: %s %s\n", what, st.to_string().c_str());
  std::abort();
}

uint32_t substreams(const Profile& p) { return p.geometry().layers * p.geometry().planes(); }

struct Out {
  KvCache packed;
  std::vector<std::vector<std::byte>> layers;
  KvView view;
};

Out make_out(const KvGeometry& g, DType dt, uint64_t tokens, bool paged) {
  Out o;
  o.packed = KvCache::create(g, dt, tokens).value();
  std::memset(o.packed.bytes().data(), 0xa5, o.packed.bytes().size());
  if (!paged) {
    o.view = o.packed.view();
    return o;
  }
  const uint32_t bs = 4;
  const uint64_t blocks = (tokens + bs - 1) / bs + 1;
  PagedLayout pl;
  pl.block_size = bs;
  pl.slot_stride = g.channels();
  pl.block_stride = int64_t(bs) * g.channels();
  pl.plane_stride = int64_t(blocks) * pl.block_stride;
  pl.num_blocks = blocks;
  for (uint64_t i = 0; i < blocks - 1; ++i) pl.block_table.push_back(uint32_t(blocks - 1 - i));  // reversed
  for (uint32_t l = 0; l < g.layers; ++l) {
    o.layers.emplace_back(size_t(pl.plane_stride) * g.planes() * dtype_size(dt), std::byte{0xa5});
    pl.layer_base.push_back(o.layers.back().data());
  }
  o.view = KvView::paged(std::move(pl), dt, g, tokens).value();
  return o;
}

// Output content as packed bytes (gathers a paged view).
std::vector<std::byte> contents(const Out& o) {
  if (!o.view.is_paged()) return {o.packed.bytes().begin(), o.packed.bytes().end()};
  KvCache tmp = KvCache::create(o.view.geometry(), o.view.dtype(), o.view.tokens()).value();
  if (!copy_kv(o.view, tmp.view()).ok()) fail("copy_kv");
  return {tmp.bytes().begin(), tmp.bytes().end()};
}

bool untouched(const Out& o) {
  const auto check = [](std::span<const std::byte> b) {
    for (std::byte x : b)
      if (x != std::byte{0xa5}) return false;
    return true;
  };
  if (!o.view.is_paged()) return check(o.packed.bytes());
  for (const auto& l : o.layers)
    if (!check(l)) return false;
  return true;
}

// (The header parsers report a geometry that fails KvGeometry::validate with its code,
// invalid_argument or out_of_range, besides the documented corrupt_data and
// unsupported; only internal means a bug.)
bool bad_code(const Status& st) { return !st.ok() && st.code() == StatusCode::internal; }

uint64_t load_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// chunk_header_bytes and chunk_prefixes on arbitrary bytes, and what they promise about
// each other and inspect_chunk. Returns the prefix points (empty when chunk_prefixes
// refuses the bytes).
std::vector<ChunkPrefix> check_header_queries(std::span<const uint8_t> b) {
  const auto hb = chunk_header_bytes(b);
  const auto hb64 = chunk_header_bytes(b.first(std::min<size_t>(b.size(), kvstream::fuzz::kHdr)));
  if (hb.ok() != hb64.ok() || (hb.ok() && *hb != *hb64)) fail("chunk_header_bytes reads past the first 64 bytes");
  if (bad_code(hb.status())) fail("chunk_header_bytes error code", hb.status());
  if (hb.ok() && *hb < kvstream::fuzz::kHdr) fail("chunk_header_bytes below the fixed header");
  auto pf = chunk_prefixes(b);
  if (!pf.ok()) {
    if (bad_code(pf.status())) fail("chunk_prefixes error code", pf.status());
    return {};
  }
  if (!hb.ok()) fail("chunk_prefixes accepted a header that chunk_header_bytes refuses", hb.status());
  const size_t H = *hb;
  if (b.size() < H) fail("chunk_prefixes accepted fewer bytes than chunk_header_bytes asks for");
  const auto exact = chunk_prefixes(b.first(H));
  if (!exact.ok() || *exact != *pf) fail("chunk_prefixes needs more than chunk_header_bytes", exact.status());
  if (chunk_prefixes(b.first(H - 1)).ok()) fail("chunk_prefixes accepted a truncated header");
  const std::vector<ChunkPrefix>& ps = *pf;
  if (ps.empty()) fail("no prefix points");
  uint32_t whole = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    const ChunkPrefix& p = ps[i];
    if (!(p.distortion >= 0) || !std::isfinite(p.distortion)) fail("prefix distortion");
    if (p.end < H) fail("a prefix point inside the header");
    whole += p.whole_layer;
    if (i == 0) {
      if (!p.whole_layer) fail("the first prefix point (the base) is not a whole layer");
      continue;
    }
    const ChunkPrefix& q = ps[i - 1];
    if (p.end < q.end) fail("prefix points out of order");
    if (p.level != q.level - (p.whole_layer ? 1 : 0) || (p.whole_layer && q.level == 0))
      fail("prefix levels do not step down by whole layers");
  }
  if (ps.back().level != 0 || !ps.back().whole_layer) fail("the last prefix point is not level 0");
  if (ps.back().end != load_u64(b.data() + kvstream::fuzz::kOffStreamBytes)) fail("the last prefix is not the stream");
  if (ps.front().level + 1 != whole) fail("whole-layer points and the base level disagree");
  for (size_t i = 0; i < ps.size(); ++i) {
    const ChunkPrefix& p = ps[i];
    if (p.end > b.size()) break;
    const auto info = inspect_chunk(b.first(p.end));
    if (!info.ok()) fail("inspect_chunk refuses a prefix point", info.status());
    if (!info->progressive || info->total_bytes != p.end || info->stream_bytes != ps.back().end ||
        info->coded_layers != whole)
      fail("inspect_chunk of a prefix point");
    // (Crafted tables may hold empty substreams, whose points share one end; the
    // extent of such an end is that of its last point.)
    if ((i + 1 == ps.size() || ps[i + 1].end != p.end) && info->level != p.level) fail("inspect_chunk level");
  }
  return ps;
}

bool is_point(std::span<const ChunkPrefix> ps, size_t end) {
  for (const ChunkPrefix& p : ps)
    if (p.end == end) return true;
  return false;
}

// refine_chunk(in[0, s), in[s, len)) on the output of decode_chunk(in[0, s)), against
// decode_chunk(in) (`whole`, its status and output).
void check_refine(const Profile& prof, std::span<const uint8_t> in, uint16_t split_sel,
                  std::span<const ChunkPrefix> points, DType dt, uint64_t tokens, bool paged, bool use_scratch,
                  bool resealed, const Status& whole_st, const Out& whole) {
  const size_t s = kvstream::fuzz::select_length(split_sel, in.size(), points);
  // Two separate allocations, as a runtime holds them (ASan sees a read past either).
  const std::vector<uint8_t> kept_bytes(in.begin(), in.begin() + s), more_bytes(in.begin() + s, in.end());
  const std::span<const uint8_t> kept = kept_bytes, more = more_bytes;
  Out r = make_out(prof.geometry(), dt, tokens, paged);
  const Status sk = decode_chunk(prof, kept, r.view);  // what a runtime holds before it refines
  if (!sk.ok()) {
    if (sk.code() == StatusCode::internal) fail("internal error (kept prefix)", sk);
    if (!resealed && !untouched(r)) fail("failed decode of the kept prefix wrote the output", sk);
  }
  const std::vector<std::byte> before = contents(r);
  const Status sr = refine_chunk(prof, kept, more, r.view, use_scratch ? g_scratch : nullptr);
  if (sr.code() == StatusCode::internal) fail("refine_chunk internal error", sr);
  if (sr.ok()) {
    if (!whole_st.ok()) fail("refine_chunk succeeded where decode_chunk of the whole prefix failed", whole_st);
    if (contents(r) != contents(whole)) fail("refine_chunk output differs from decode_chunk");
    return;
  }
  if (!resealed && contents(r) != before) fail("failed refine_chunk wrote the output", sr);
  if (!kvstream::fuzz::is_progressive_bytes(kept) && sr.code() != StatusCode::invalid_argument)
    fail("refine_chunk of a stream that is not progressive", sr);
  if (whole_st.ok() && is_point(points, s)) fail("refine_chunk failed where decode_chunk succeeded", sr);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_profiles = new std::vector<Profile>(kvstream::fuzz::build_profiles());
  g_scratch = new DecodeScratch();
  // Check that resealing reproduces a genuine chunk's checksums.
  const auto& spec = kvstream::fuzz::profile_specs()[0];
  const KvCache c = kvstream::fuzz::synthetic_cache(spec.geom, spec.rope, DType::f16, 9, 5, 77);
  std::vector<uint8_t> chunk;
  if (!encode_chunk((*g_profiles)[0], c.view(), 0, chunk).ok()) fail("encode at init");
  std::vector<uint8_t> zeroed = chunk;
  if (zeroed.size() > kvstream::fuzz::kHdr) {
    std::memset(zeroed.data() + kvstream::fuzz::kOffPayloadSum, 0, 16);
    kvstream::fuzz::chunk_reseal(zeroed, substreams((*g_profiles)[0]));
  }
  g_reseal_ok = zeroed == chunk;
  // Likewise for a progressive stream: stream size, header and substream checksums.
  for (size_t i = 0; i < g_profiles->size(); ++i) {
    if (!(*g_profiles)[i].progressive()) continue;
    const auto& ps = kvstream::fuzz::profile_specs()[i];
    const KvCache pc = kvstream::fuzz::synthetic_cache(ps.geom, ps.rope, DType::f16, 9, 5, 78);
    std::vector<uint8_t> stream;
    // With recent rows, so that the check covers the header's optional field.
    if (!encode_chunk((*g_profiles)[i], pc.view(), 0, EncodeOptions{4}, stream).ok())
      fail("progressive encode at init");
    std::vector<uint8_t> z = stream;
    const kvstream::fuzz::ProgressiveTables t = kvstream::fuzz::progressive_tables(z);
    if (t.header_bytes == 0) break;
    std::memset(z.data() + kvstream::fuzz::kOffStreamBytes, 0, 16);
    for (uint64_t j = 0; j < t.substreams; ++j) std::memset(z.data() + t.table + 8 * j + 4, 0, 4);
    kvstream::fuzz::progressive_reseal(z);
    g_progressive_reseal_ok = z == stream;
  }
  std::fprintf(stderr, "fuzz_chunk_decoder: %zu profiles, reseal %s, progressive reseal %s\n", g_profiles->size(),
               g_reseal_ok ? "on" : "OFF (chunk header layout changed: update fuzz_common.hpp)",
               g_progressive_reseal_ok ? "on" : "OFF (progressive header layout changed: update fuzz_common.hpp)");
  for (const Profile& p : *g_profiles)
    std::fprintf(stderr, "  profile %016llx%s\n", (unsigned long long)p.hash(), p.progressive() ? " (progressive)" : "");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t ctl = data[0];
  const Profile& prof = (*g_profiles)[(ctl & 3u) % g_profiles->size()];
  const KvGeometry& g = prof.geometry();
  size_t at = 1;
  uint16_t cut_sel = 0, split_sel = 0;
  if (prof.progressive()) {
    if (size < 1 + kvstream::fuzz::kSelectorBytes) return 0;
    std::memcpy(&cut_sel, data + 1, 2);
    std::memcpy(&split_sel, data + 3, 2);
    at += kvstream::fuzz::kSelectorBytes;
  }
  std::vector<uint8_t> bytes(data + at, data + size);
  bool resealed = false;
  if (ctl & kvstream::fuzz::kReseal) {
    if (kvstream::fuzz::is_progressive_bytes(bytes)) {
      if ((resealed = g_progressive_reseal_ok)) kvstream::fuzz::progressive_reseal(bytes);
    } else if ((resealed = g_reseal_ok)) {
      kvstream::fuzz::chunk_reseal(bytes, substreams(prof));
    }
  }
  const DType dt = DType(((ctl >> 3) & 3u) % 3);
  const bool paged = ctl & kvstream::fuzz::kPaged;

  // The stream, then the prefix of it under test (the whole input unless the profile is
  // progressive and the cut selector says otherwise).
  std::vector<ChunkPrefix> points = check_header_queries(bytes);
  const size_t len = prof.progressive() ? kvstream::fuzz::select_length(cut_sel, bytes.size(), points) : bytes.size();
  const std::span<const uint8_t> in(bytes.data(), len);
  if (len != bytes.size()) points = check_header_queries(in);

  auto info = inspect_chunk(in);
  uint64_t tokens = 7;
  if (info.ok()) {
    if (info->total_bytes != in.size()) fail("inspect_chunk total_bytes");
    if (info->geometry == g && info->tokens <= 2048) tokens = info->tokens;
    if (info->progressive && !is_point(points, in.size())) fail("inspect_chunk accepted a prefix at no prefix point");
  } else if (!points.empty()) {
    // Not a decodable prefix, but its header parses: size the output by it, so that
    // the refine check's kept prefix can decode.
    uint32_t t;
    std::memcpy(&t, in.data() + 28, 4);
    if (t <= 2048) tokens = t;
  }
  Out out = make_out(g, dt, tokens, paged);
  const Status st = decode_chunk(prof, in, out.view);
  if (!info.ok() && st.ok()) fail("decode succeeded where inspect_chunk failed");
  if (!st.ok()) {
    if (st.code() == StatusCode::internal) fail("internal error", st);
    if (!resealed && !untouched(out)) fail("failed decode wrote the output", st);
  }

  if (ctl & kvstream::fuzz::kScratch) {
    Out again = make_out(g, dt, tokens, false);
    const Status st2 = decode_chunk(prof, in, again.view, g_scratch);
    if (st2.ok() != st.ok()) fail("scratch decode status differs", st2);
    if (st.ok() && contents(again) != contents(out)) fail("scratch decode output differs");
  }
  if (ctl & kvstream::fuzz::kParallel) {
    Out par = make_out(g, dt, tokens, false);
    const Status st3 = decode_chunk_parallel(prof, in, par.view, 3);
    if (st3.ok() != st.ok()) fail("parallel decode status differs", st3);
    if (st.ok() && contents(par) != contents(out)) fail("parallel decode output differs");
  }
  if (prof.progressive() && (split_sel >> 14) != 0)
    check_refine(prof, in, split_sel, points, dt, tokens, paged, ctl & kvstream::fuzz::kScratch, resealed, st, out);

  // A successful decode re-encodes (unless the encoder refuses its values) and the new
  // chunk must decode.
  if (st.ok() && dt == DType::f32 && !out.view.is_paged()) {
    std::vector<uint8_t> re;
    const Status se = encode_chunk(prof, out.view, info->level, re);
    if (!se.ok() && se.code() != StatusCode::invalid_argument) fail("re-encode", se);
    if (se.ok()) {
      Out dec = make_out(g, DType::f32, tokens, false);
      const Status sd = decode_chunk(prof, re, dec.view);
      if (!sd.ok()) fail("a freshly encoded chunk does not decode", sd);
    }
    if (se.ok() && prof.progressive()) {
      // encode_chunk(level) is the prefix of encode_chunk(0) through that level.
      std::vector<uint8_t> full;
      const Status s0 = encode_chunk(prof, out.view, 0, full);
      if (!s0.ok()) fail("re-encode at level 0", s0);
      if (full.size() < re.size() || !std::equal(re.begin(), re.end(), full.begin()))
        fail("a level's stream is not a prefix of the level-0 stream");
      const auto ps = chunk_prefixes(full);
      if (!ps.ok()) fail("chunk_prefixes of a fresh stream", ps.status());
      bool found = false;
      for (const ChunkPrefix& p : *ps) found |= p.end == re.size() && p.whole_layer && p.level == info->level;
      if (!found) fail("a level's stream ends at no whole-layer prefix point of its level");
    }
  }
  return 0;
}
