#include <cmath>

#include "kvstream/kv_model.hpp"

namespace kvstream {

void rope_rotate(float* head, uint32_t head_dim, int64_t position, const RopeParams& rope, bool inverse) noexcept {
  if (!rope.enabled) return;
  const uint32_t rot = rope.rotary_dim == 0 || rope.rotary_dim > head_dim ? head_dim : rope.rotary_dim;
  const uint32_t pairs = rot / 2;
  for (uint32_t i = 0; i < pairs; ++i) {
    // Same formula as llama2.c so a runtime's cache and ours agree to the last bit.
    const float freq = 1.0f / std::pow(rope.base, float(2 * i) / float(rot));
    const float angle = float(position) * freq;
    const float c = std::cos(angle);
    const float s = inverse ? -std::sin(angle) : std::sin(angle);
    const uint32_t a = rope.pairing == RopePairing::interleaved ? 2 * i : i;
    const uint32_t b = rope.pairing == RopePairing::interleaved ? 2 * i + 1 : i + pairs;
    const float x0 = head[a], x1 = head[b];
    head[a] = x0 * c - x1 * s;
    head[b] = x0 * s + x1 * c;
  }
}

}  // namespace kvstream
