// CacheGen's 8-bit baseline as the benchmarks move it: per (layer, plane, token) row
// a fp32 scale, then one int8 per channel (absmax / 127).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "kvstream/kv_model.hpp"
#include "kvstream/status.hpp"

namespace kvstream::bench {

/// Quantizes a chunk to the 8-bit baseline.
inline std::vector<uint8_t> quantize_int8(const KvView& v) {
  const auto& g = v.geometry();
  const uint32_t C = g.channels();
  std::vector<uint8_t> out;
  out.reserve(size_t(g.layers) * g.planes() * v.tokens() * (4 + C));
  std::vector<float> row(C);
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < g.planes(); ++p)
      for (uint64_t t = 0; t < v.tokens(); ++t) {
        v.load_row(l, p, t, row.data());
        float amax = 0;
        for (float x : row) amax = std::max(amax, std::fabs(x));
        const float scale = amax > 0 ? amax / 127.0f : 1.0f;
        const size_t at = out.size();
        out.resize(at + 4 + C);
        std::memcpy(out.data() + at, &scale, 4);
        for (uint32_t c = 0; c < C; ++c) out[at + 4 + c] = uint8_t(int8_t(std::lrint(row[c] / scale)));
      }
  return out;
}

/// Dequantizes what quantize_int8 wrote into `dest` (the runtime's fp16 memory).
inline Status dequantize_int8(std::span<const std::byte> in, const KvView& dest) {
  const auto& g = dest.geometry();
  const uint32_t C = g.channels();
  std::vector<float> row(C);
  size_t at = 0;
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < g.planes(); ++p)
      for (uint64_t t = 0; t < dest.tokens(); ++t) {
        if (at + 4 + C > in.size()) return make_status(StatusCode::corrupt_data, "int8 chunk too short");
        float scale;
        std::memcpy(&scale, in.data() + at, 4);
        const auto* q = reinterpret_cast<const int8_t*>(in.data() + at + 4);
        for (uint32_t c = 0; c < C; ++c) row[c] = float(q[c]) * scale;
        dest.store_row(l, p, t, row.data());
        at += 4 + C;
      }
  return {};
}

}  // namespace kvstream::bench
