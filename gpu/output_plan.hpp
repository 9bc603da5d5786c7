// Where the GPU decoder's reconstruction kernel writes each element of a chunk: any
// KV view (packed, strided, or paged through a block table, over device memory)
// reduced to three small tables, so that the kernel computes
//   address(layer/plane lp, token t, channel c) = row0[lp] + token[t] + channel[c]
// and writes a runtime's paged KV blocks directly, with no packed intermediate and no
// scatter pass. The tables come from KvView's own addressing (row(), channel_offset()),
// so the kernel cannot disagree with the CPU decoder on where an element goes. Plain
// C++: built and tested without CUDA. Internal to gpu/.
#pragma once

#include <cstdint>
#include <vector>

#include "kvstream/kv_model.hpp"
#include "kvstream/status.hpp"

namespace kvstream::gpu::detail {

struct OutputPlan {
  std::vector<uint64_t> row0;     // per (layer, plane), in layer-major order: address of token 0's row
  std::vector<int64_t> token;     // per token: bytes from token 0's row to token t's (the same in every plane)
  std::vector<int64_t> channel;   // per channel: bytes from a row's address to the channel's element
  uint32_t elem_bytes = 0;
  DType dtype = DType::f32;

  /// Address of one element (what the kernel computes).
  [[nodiscard]] uint64_t address(uint32_t lp, uint64_t t, uint32_t c) const noexcept {
    return row0[lp] + uint64_t(token[t]) + uint64_t(channel[c]);
  }
};

/// The tables of `out`. Errors: invalid_argument when the view has no tokens, or when
/// its token offsets differ between planes (none of KvView's layouts do: the check
/// guards the kernel's assumption rather than any known view).
Result<OutputPlan> plan_output(const KvView& out);

}  // namespace kvstream::gpu::detail
