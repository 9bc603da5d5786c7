// CUDA kernels of the GPU chunk decoder (see include/kvstream/gpu_decoder.hpp and
// docs/bitstream.md). Bit-exact with codec/chunk_decoder.cpp (and, with
// cuda_layered.cu, with codec/layered_decoder.cpp):
//  * rANS: one warp per coded matrix, lane j = rANS state j (the format has exactly 32
//    lanes). Words are consumed in lane order within a step, so a lane that needs a
//    word takes the one at (its rank among the needing lanes), found with
//    __ballot_sync + __popc; escapes are replaced by raw bytes the same way.
//  * reconstruction: f32 arithmetic through __fmul_rn / __fadd_rn only (never
//    contracted into FMA), in the CPU's order; RoPE from host-built tables; the
//    f16/bf16 conversions are the CPU's integer routines (core dtype.hpp), so even
//    NaN payloads agree.
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/cuda_kernels.hpp"

namespace kvstream::gpu::detail {
namespace {

constexpr uint32_t kProbMask = (1u << kProbBits) - 1;
constexpr uint32_t kStateLow = 1u << 16;
constexpr uint32_t kEscapeByte = 0x80;
constexpr int kWarpsPerBlock = 4;
constexpr uint32_t kRowsPerBlock = 16;
constexpr int kReconThreads = 256;

__device__ __forceinline__ uint32_t load_u16(const uint8_t* p) { return uint32_t(p[0]) | (uint32_t(p[1]) << 8); }

// ---- rANS ---------------------------------------------------------------------------

__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    rans_kernel(const uint8_t* __restrict__ chunk, const MatDesc* __restrict__ mats, uint32_t n_mats,
                const uint32_t* __restrict__ dec, const uint8_t* __restrict__ table_of_all, int8_t* __restrict__ syms,
                uint32_t* __restrict__ err_out) {
  const uint32_t m_id = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (m_id >= n_mats) return;  // whole warp leaves together
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t lt_mask = (1u << lane) - 1;
  const MatDesc& m = mats[m_id];
  const uint8_t* __restrict__ words = chunk + m.words_off;
  const uint8_t* __restrict__ raw = chunk + m.escapes_off;
  const uint8_t* __restrict__ table_of = table_of_all + m.table_of_off;
  int8_t* __restrict__ out = syms + m.sym_off;
  const uint32_t cols = m.cols, n_words = m.n_words, n_esc = m.n_escapes;
  const uint64_t n = uint64_t(m.rows) * cols;
  const uint64_t steps = (n + 31) / 32;
  const uint32_t step_mod = 32 % cols;  // column advance per step
  uint32_t col = lane % cols;
  uint32_t x = m.state[lane];
  uint32_t wp = 0, esc_used = 0;
  bool overrun = false, esc_bad = false;

  for (uint64_t s = 0; s < steps; ++s) {
    const uint64_t i = s * 32 + lane;
    const bool active = i < n;
    uint32_t sym = 0;
    bool need = false;
    if (active) {
      const uint32_t tid = __ldg(table_of + col);
      const uint32_t e = __ldg(dec + ((tid << kProbBits) | (x & kProbMask)));
      sym = e & 0xFFu;
      x = (e >> (8 + kProbBits)) * (x >> kProbBits) + ((e >> 8) & kProbMask);
      need = x < kStateLow;
    }
    const uint32_t need_mask = __ballot_sync(0xFFFFFFFFu, need);
    if (need) {
      const uint32_t w_idx = wp + __popc(need_mask & lt_mask);
      uint32_t w = 0;
      if (w_idx < n_words)
        w = load_u16(words + 2 * size_t(w_idx));
      else
        overrun = true;
      x = (x << 16) | w;
    }
    wp += __popc(need_mask);
    const bool is_esc = active && sym == kEscapeByte;
    const uint32_t esc_mask = __ballot_sync(0xFFFFFFFFu, is_esc);
    if (is_esc) {
      const uint32_t e_idx = esc_used + __popc(esc_mask & lt_mask);
      if (e_idx < n_esc)
        sym = raw[e_idx];
      else
        esc_bad = true;
    }
    esc_used += __popc(esc_mask);
    if (active) out[i] = int8_t(uint8_t(sym));
    col += step_mod;
    if (col >= cols) col -= cols;
  }
  uint32_t err = 0;
  if (__any_sync(0xFFFFFFFFu, overrun) || wp != n_words) err |= kErrWords;
  if (__any_sync(0xFFFFFFFFu, esc_bad) || esc_used != n_esc) err |= kErrEscapes;
  if (__any_sync(0xFFFFFFFFu, x != kStateLow)) err |= kErrState;
  if (lane == 0) err_out[m_id] = err;
}

// ---- conversions (the CPU's f32_to_f16 / f32_to_bf16, bit for bit) -------------------------

__device__ __forceinline__ uint16_t f32_to_f16(float f) {
  const uint32_t x = __float_as_uint(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0u));
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);
  if (ax < 0x38800000u) {
    const float mag = __fmul_rn(__uint_as_float(ax), 0x1p24f);
    const float rounded = __fadd_rn(__fadd_rn(mag, 0x1p23f), -0x1p23f);
    return uint16_t(sign | uint16_t(rounded));
  }
  uint32_t h = ((ax >> 13) - (112u << 10));
  const uint32_t rest = ax & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return uint16_t(sign | h);
}

__device__ __forceinline__ uint16_t f32_to_bf16(float f) {
  uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

__device__ __forceinline__ void store_out(uint8_t* at, int dtype, float v) {
  if (dtype == 0)
    *reinterpret_cast<float*>(at) = v;
  else if (dtype == 1)
    *reinterpret_cast<uint16_t*>(at) = f32_to_f16(v);
  else
    *reinterpret_cast<uint16_t*>(at) = f32_to_bf16(v);
}

// First position in the sorted index[begin, begin+count) with index >= key.
__device__ __forceinline__ uint32_t lower_bound(const uint32_t* index, uint32_t begin, uint32_t count, uint64_t key) {
  uint32_t lo = begin, hi = begin + count;
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (uint64_t(index[mid]) < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Writes list entries of row t (flat indices [t*C, (t+1)*C)) into buf.
__device__ __forceinline__ void apply_list(const uint32_t* index, const float* value, uint32_t begin, uint32_t count,
                                           uint32_t t, uint32_t C, float* buf) {
  if (count == 0) return;
  const uint64_t row0 = uint64_t(t) * C;
  const uint32_t lo = lower_bound(index, begin, count, row0);
  const uint32_t hi = lower_bound(index, begin, count, row0 + C);
  for (uint32_t k = lo + threadIdx.x; k < hi; k += blockDim.x) buf[index[k] - row0] = value[k];
}

// ---- reconstruction -----------------------------------------------------------------

template <typename Idx>
__device__ __forceinline__ const Idx* indices(const ChunkLaunch& c);
template <>
__device__ __forceinline__ const int8_t* indices<int8_t>(const ChunkLaunch& c) {
  return c.syms;
}
template <>
__device__ __forceinline__ const int32_t* indices<int32_t>(const ChunkLaunch& c) {
  return c.q;
}

// Block (tile of kRowsPerBlock tokens, one (layer, plane)). Shared: row (dequantized /
// KLT components), res (KLT output), arow (the group's reconstructed anchor row).
// Idx: int8_t for a single-level chunk's symbols, int32_t for a progressive stream's
// refined indices (c.q); anchors exist only in single-level chunks.
template <typename Idx>
__global__ void __launch_bounds__(kReconThreads) reconstruct_kernel(ChunkLaunch c) {
  extern __shared__ float smem[];
  const uint32_t C = c.channels, T = c.tokens, G = c.group;
  float* row = smem;
  float* res = smem + C;
  float* arow = smem + 2 * size_t(C);
  const PlaneDesc pd = c.planes[blockIdx.y];
  const uint32_t t0 = blockIdx.x * kRowsPerBlock;
  const uint32_t t1 = min(T, t0 + kRowsPerBlock);
  const float* mean = c.prof.mean + pd.chan_off;
  const float* sscale = c.prof.step_scale + pd.chan_off;
  const uint8_t* pred = c.prof.predictor + pd.chan_off;
  const Idx* plain = indices<Idx>(c) + pd.plain_sym_off;
  const int8_t* anchors = c.syms + pd.anchor_sym_off;
  const float* ut = c.prof.transform_t + pd.ut_off;
  const uint32_t B = pd.block;
  uint32_t cur_group = 0xFFFFFFFFu;
  const uint64_t out_row0 = c.out_row0[pd.plane_index];

  for (uint32_t t = t0; t < t1; ++t) {
    const float s0 = t < pd.split ? pd.step : pd.recent_step;
    // 1. dequantize: x = pred + float(q) * step
    if (pd.has_anchor) {
      const uint32_t g = t / G;
      if (g != cur_group) {
        __syncthreads();  // arow may still be read by the previous row
        const int8_t* qa = anchors + size_t(g) * C;
        for (uint32_t ch = threadIdx.x; ch < C; ch += blockDim.x) {
          const float step = __fmul_rn(s0, sscale[ch]);
          const float base = pred[ch] == 0 ? 0.0f : mean[ch];
          arow[ch] = __fadd_rn(base, __fmul_rn(float(qa[ch]), step));
        }
        __syncthreads();
        apply_list(c.list_index, c.list_value, pd.out_begin, pd.out_count, g * G, C, arow);
        __syncthreads();
        cur_group = g;
      }
      const bool is_anchor_row = t % G == 0;
      const Idx* q = is_anchor_row ? plain : plain + size_t(t - (t / G + 1)) * C;
      for (uint32_t ch = threadIdx.x; ch < C; ch += blockDim.x) {
        if (is_anchor_row) {
          row[ch] = arow[ch];
        } else {
          const float step = __fmul_rn(s0, sscale[ch]);
          const float base = pred[ch] == 2 ? arow[ch] : (pred[ch] == 0 ? 0.0f : mean[ch]);
          row[ch] = __fadd_rn(base, __fmul_rn(float(q[ch]), step));
        }
      }
      __syncthreads();
      if (!is_anchor_row) apply_list(c.list_index, c.list_value, pd.out_begin, pd.out_count, t, C, row);
    } else {
      const Idx* q = plain + size_t(t) * C;
      for (uint32_t ch = threadIdx.x; ch < C; ch += blockDim.x) {
        float step, base;
        if (B) {
          step = s0, base = 0.0f;
        } else {
          step = __fmul_rn(s0, sscale[ch]);
          base = pred[ch] == 0 ? 0.0f : mean[ch];
        }
        row[ch] = __fadd_rn(base, __fmul_rn(float(q[ch]), step));
      }
      __syncthreads();
      apply_list(c.list_index, c.list_value, pd.out_begin, pd.out_count, t, C, row);
    }
    __syncthreads();
    const float* src = row;
    // 2. KLT inverse: z = sum over nonzero j (increasing) of ut[j][c] * y[j]; then
    //    x = (mean + scale * z) + 0.
    if (B) {
      for (uint32_t ch = threadIdx.x; ch < C; ch += blockDim.x) {
        const uint32_t b0 = ch - ch % B;
        const float* blk = ut + size_t(b0) * B + (ch - b0);
        float z = 0.0f;
        for (uint32_t j = 0; j < B; ++j) {
          const float y = row[b0 + j];
          if (y != 0.0f) z = __fadd_rn(z, __fmul_rn(blk[size_t(j) * B], y));
        }
        res[ch] = __fadd_rn(__fadd_rn(mean[ch], __fmul_rn(sscale[ch], z)), 0.0f);
      }
      __syncthreads();
      apply_list(c.list_index, c.list_value, pd.exact_begin, pd.exact_count, t, C, res);
      __syncthreads();
      src = res;
    }
    // 3. RoPE (forward, host tables) and store in the output type.
    const float* ec = c.rope_ec + size_t(t) * c.rot;
    const float* es = c.rope_es + size_t(t) * c.rot;
    uint8_t* const o = reinterpret_cast<uint8_t*>(out_row0 + uint64_t(c.out_token[t]));
    for (uint32_t ch = threadIdx.x; ch < C; ch += blockDim.x) {
      float v = src[ch];
      if (pd.rotate) {
        const uint32_t d = ch % c.head_dim;
        if (d < c.rot) {
          const float vp = src[ch - d + c.rope_partner[d]];
          v = __fadd_rn(__fmul_rn(v, ec[d]), __fmul_rn(vp, es[d]));
        }
      }
      store_out(o + c.out_chan[ch], c.dtype, v);
    }
    __syncthreads();  // row/res are rewritten by the next token
  }
}

// ---- integrity verdict ----------------------------------------------------------------

// One thread: a chunk has a few hundred matrices at most, and the first failing one is
// what the error names (the CPU decoder stops at it too).
__global__ void verdict_kernel(const uint32_t* __restrict__ mat_err, uint32_t n_mats, uint32_t* __restrict__ verdict) {
  uint32_t first = 0, bits = 0;
  for (uint32_t i = 0; i < n_mats; ++i)
    if (mat_err[i] != 0) {
      first = i + 1, bits = mat_err[i];
      break;
    }
  verdict[0] = first;
  verdict[1] = bits;
}

}  // namespace

size_t reconstruct_shared_bytes(uint32_t channels) { return 3 * size_t(channels) * sizeof(float); }

int prepare_reconstruct(size_t bytes) {
  const cudaError_t e = cudaFuncSetAttribute(reconstruct_kernel<int8_t>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             int(bytes));
  if (e != cudaSuccess) return int(e);
  return int(
      cudaFuncSetAttribute(reconstruct_kernel<int32_t>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

int launch_rans_mats(const uint8_t* chunk, const MatDesc* mats, uint32_t n, const uint32_t* dec,
                     const uint8_t* table_of, int8_t* syms, uint32_t* err, void* stream_ptr) {
  if (n == 0) return 0;
  const uint32_t blocks = (n + kWarpsPerBlock - 1) / kWarpsPerBlock;
  rans_kernel<<<blocks, kWarpsPerBlock * 32, 0, static_cast<cudaStream_t>(stream_ptr)>>>(chunk, mats, n, dec, table_of,
                                                                                         syms, err);
  return int(cudaGetLastError());
}

int launch_rans(const ChunkLaunch& c, void* stream_ptr) {
  return launch_rans_mats(c.chunk, c.mats, c.n_mats, c.level.dec, c.level.table_of, c.syms, c.mat_err, stream_ptr);
}

int launch_reconstruct(const ChunkLaunch& c, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (c.n_planes && c.tokens) {
    const dim3 grid((c.tokens + kRowsPerBlock - 1) / kRowsPerBlock, c.n_planes);
    if (c.q)
      reconstruct_kernel<int32_t><<<grid, kReconThreads, reconstruct_shared_bytes(c.channels), stream>>>(c);
    else
      reconstruct_kernel<int8_t><<<grid, kReconThreads, reconstruct_shared_bytes(c.channels), stream>>>(c);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return int(e);
  }
  return 0;
}

int launch_verdict(const ChunkLaunch& c, void* stream_ptr) {
  verdict_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream_ptr)>>>(c.mat_err, c.n_mats, c.verdict);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return int(e);
  return 0;
}

}  // namespace kvstream::gpu::detail
