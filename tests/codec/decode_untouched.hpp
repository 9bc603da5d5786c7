// Decoding bad input must fail before anything reaches the output: this decodes into
// a sentinel-filled f32 cache and says whether any byte of it changed. Shared by the
// corrupt-input tests of single-level and progressive chunks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "kvstream/codec.hpp"
#include "kvstream/kv_model.hpp"

namespace kvstream::codec::test {

inline Status decode_untouched(const Profile& prof, std::span<const uint8_t> bytes, const KvGeometry& g,
                               uint64_t tokens, bool* touched) {
  KvCache out = KvCache::create(g, DType::f32, tokens).value();
  std::memset(out.bytes().data(), 0x7b, out.bytes().size());
  const Status st = decode_chunk(prof, bytes, out.view());
  *touched = false;
  for (std::byte x : out.bytes()) *touched |= x != std::byte{0x7b};
  return st;
}

}  // namespace kvstream::codec::test
