// libFuzzer target: codec::inspect_chunk / decode_chunk / decode_chunk_parallel on
// untrusted bytes (framing in fuzz_common.hpp). Besides memory safety (ASan, UBSan)
// it checks invariants:
//   * decode_chunk, decode_chunk with a reused scratch and decode_chunk_parallel agree
//     (same status, and bit-identical output on success);
//   * a failed decode leaves the output untouched when the error is found before the
//     payload checksum passed (always the case without reseal);
//   * re-encoding a successful f32 decode either fails with invalid_argument (values
//     the encoder refuses, e.g. overflowed to inf) or yields a chunk that decodes.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "fuzz_common.hpp"

using namespace kvstream;
using namespace kvstream::codec;

namespace {

std::vector<Profile>* g_profiles = nullptr;
bool g_reseal_ok = false;

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

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_profiles = new std::vector<Profile>(kvstream::fuzz::build_profiles());
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
  std::fprintf(stderr, "fuzz_chunk_decoder: %zu profiles, reseal %s\n", g_profiles->size(),
               g_reseal_ok ? "on" : "OFF (chunk header layout changed: update fuzz_common.hpp)");
  for (const Profile& p : *g_profiles) std::fprintf(stderr, "  profile %016llx\n", (unsigned long long)p.hash());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t ctl = data[0];
  const Profile& prof = (*g_profiles)[(ctl & 3u) % g_profiles->size()];
  const KvGeometry& g = prof.geometry();
  std::vector<uint8_t> bytes(data + 1, data + size);
  const bool resealed = (ctl & kvstream::fuzz::kReseal) && g_reseal_ok;
  if (resealed) kvstream::fuzz::chunk_reseal(bytes, substreams(prof));
  const DType dt = DType(((ctl >> 3) & 3u) % 3);

  auto info = inspect_chunk(bytes);
  uint64_t tokens = 7;
  if (info.ok()) {
    if (info->total_bytes != bytes.size()) fail("inspect_chunk total_bytes");
    if (info->geometry == g && info->tokens <= 2048) tokens = info->tokens;
  }
  Out out = make_out(g, dt, tokens, ctl & kvstream::fuzz::kPaged);
  const Status st = decode_chunk(prof, bytes, out.view);
  if (!info.ok() && st.ok()) fail("decode succeeded where inspect_chunk failed");
  if (!st.ok()) {
    if (st.code() == StatusCode::internal) fail("internal error", st);
    if (!resealed && !untouched(out)) fail("failed decode wrote the output", st);
  }

  if (ctl & kvstream::fuzz::kScratch) {
    static DecodeScratch* scratch = new DecodeScratch();
    Out again = make_out(g, dt, tokens, false);
    const Status st2 = decode_chunk(prof, bytes, again.view, scratch);
    if (st2.ok() != st.ok()) fail("scratch decode status differs", st2);
    if (st.ok() && contents(again) != contents(out)) fail("scratch decode output differs");
  }
  if (ctl & kvstream::fuzz::kParallel) {
    Out par = make_out(g, dt, tokens, false);
    const Status st3 = decode_chunk_parallel(prof, bytes, par.view, 3);
    if (st3.ok() != st.ok()) fail("parallel decode status differs", st3);
    if (st.ok() && contents(par) != contents(out)) fail("parallel decode output differs");
  }

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
  }
  return 0;
}
