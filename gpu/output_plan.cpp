// OutputPlan: a KV view reduced to the kernel's three address tables (output_plan.hpp).
#include "gpu/output_plan.hpp"

namespace kvstream::gpu::detail {

Result<OutputPlan> plan_output(const KvView& out) {
  const KvGeometry& g = out.geometry();
  const uint64_t T = out.tokens();
  const uint32_t P = g.planes(), C = g.channels();
  if (T == 0) return make_status(StatusCode::invalid_argument, "GPU decode output view has no tokens");
  OutputPlan plan;
  plan.dtype = out.dtype();
  plan.elem_bytes = uint32_t(dtype_size(out.dtype()));
  auto addr = [&](uint32_t l, uint32_t p, uint64_t t) { return reinterpret_cast<uintptr_t>(out.row(l, p, t)); };
  plan.row0.resize(size_t(g.layers) * P);
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < P; ++p) plan.row0[size_t(l) * P + p] = addr(l, p, 0);
  plan.token.resize(T);
  for (uint64_t t = 0; t < T; ++t) plan.token[t] = int64_t(addr(0, 0, t) - addr(0, 0, 0));
  // Every layout KvView has offsets a token by the same bytes in every plane (the
  // block table and the block/slot strides are shared by all layers); checked, since
  // the kernel relies on it.
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < P; ++p)
      for (uint64_t t = 1; t < T; ++t)
        if (int64_t(addr(l, p, t) - addr(l, p, 0)) != plan.token[t])
          return make_status(StatusCode::invalid_argument,
                             "GPU decode output view: token {} of layer {} plane {} is not where the same token of "
                             "layer 0 plane 0 places it",
                             t, l, p);
  plan.channel.resize(C);
  for (uint32_t c = 0; c < C; ++c) plan.channel[c] = out.channel_offset(c) * int64_t(plan.elem_bytes);
  return plan;
}

}  // namespace kvstream::gpu::detail
