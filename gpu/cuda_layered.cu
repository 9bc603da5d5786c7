// CUDA kernels of a progressive stream's refinement layers (docs/bitstream.md,
// "Progressive streams"), bit-exact with codec/layered_decoder.cpp: the base layer's
// int8 indices widened to int32, then per refinement layer each symbol's table id from
// its coarser index (the rANS kernel of cuda_decoder.cu decodes the symbols with those
// ids), and the indices refined in place. Integer arithmetic only.
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/cuda_kernels.hpp"

namespace kvstream::gpu::detail {
namespace {

constexpr int kThreads = 256;

__global__ void widen_kernel(const int8_t* __restrict__ sym, int32_t* __restrict__ q, uint64_t n) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x)
    q[i] = sym[i];
}

// Element i of the layer's [plane][rows][C] symbols: its plane, row and channel, and
// where its index lies in q ([plane][tokens][C]).
struct At {
  uint32_t plane, c;
  uint64_t q;
};
__device__ __forceinline__ At locate(const RefineRows& r, uint64_t i) {
  const uint64_t per_plane = uint64_t(r.rows) * r.channels;
  const uint32_t plane = uint32_t(i / per_plane);
  const uint64_t in_plane = i - uint64_t(plane) * per_plane;
  const uint32_t row = uint32_t(in_plane / r.channels), c = uint32_t(in_plane - uint64_t(row) * r.channels);
  return {plane, c, (uint64_t(plane) * r.tokens + r.row0 + row) * r.channels + c};
}

__global__ void ids_kernel(RefineRows r) {
  const uint64_t n = uint64_t(r.planes) * r.rows * r.channels;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    const At a = locate(r, i);
    const size_t t = size_t(a.plane) * r.channels + a.c;
    r.ids[i] = r.q[a.q] != 0 ? r.nonzero_tables[t] : r.zero_tables[t];
  }
}

// q = 3 q + s, s mirrored when q < 0 (codec's refine_index).
__global__ void refine_kernel(RefineRows r) {
  const uint64_t n = uint64_t(r.planes) * r.rows * r.channels;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    const At a = locate(r, i);
    const int32_t q = r.q[a.q];
    const int32_t sgn = q >> 31;
    r.q[a.q] = 3 * q + ((int32_t(r.sym[i]) ^ sgn) - sgn);
  }
}

uint32_t blocks_for(uint64_t n) {
  const uint64_t b = (n + kThreads - 1) / kThreads;
  return uint32_t(b < 65535 ? (b ? b : 1) : 65535);  // grid-stride loops cover the rest
}

}  // namespace

int launch_widen(const int8_t* sym, int32_t* q, uint64_t n, void* stream) {
  if (n == 0) return 0;
  widen_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(sym, q, n);
  return int(cudaGetLastError());
}

int launch_refinement_ids(const RefineRows& r, void* stream) {
  const uint64_t n = uint64_t(r.planes) * r.rows * r.channels;
  if (n == 0) return 0;
  ids_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(r);
  return int(cudaGetLastError());
}

int launch_refine(const RefineRows& r, void* stream) {
  const uint64_t n = uint64_t(r.planes) * r.rows * r.channels;
  if (n == 0) return 0;
  refine_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(r);
  return int(cudaGetLastError());
}

}  // namespace kvstream::gpu::detail
