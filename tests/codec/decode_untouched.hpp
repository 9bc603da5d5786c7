// Decoding bad input must fail before anything reaches the output: this decodes into
// a sentinel-filled f32 cache and says whether any byte of it changed. Shared by the
// corrupt-input tests of single-level and progressive chunks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "kvstream/codec.hpp"
#include "kvstream/kv_model.hpp"

namespace kvstream::codec::test {

inline Status decode_untouched(const Profile& prof, std::span<const uint8_t> bytes, const KvGeometry& g,
                               uint64_t tokens, bool* touched) {
  KvCache out = KvCache::create(g, DType::f32, tokens).value();
  const size_t n = out.bytes().size();
  // The sentinel kept beside it, so the check is one memcmp: the corrupt-input tests
  // decode thousands of cut and flipped streams, and a byte loop through a pointer
  // (std::byte may alias the flag) made most of their time.
  static thread_local std::vector<std::byte> sentinel;
  if (sentinel.size() < n) sentinel.assign(n, std::byte{0x7b});
  std::memcpy(out.bytes().data(), sentinel.data(), n);
  const Status st = decode_chunk(prof, bytes, out.view());
  *touched = std::memcmp(out.bytes().data(), sentinel.data(), n) != 0;
  return st;
}

}  // namespace kvstream::codec::test
