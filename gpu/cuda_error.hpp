// One mapping from CUDA's error codes to Status, and the early-return macro around a
// runtime call, for every gpu/ source that calls CUDA. CUDA builds only. Internal to gpu/.
#pragma once

#include <cuda_runtime_api.h>

#include <string_view>

#include "kvstream/status.hpp"

namespace kvstream::gpu::detail {

// Out of memory is the caller's to handle (resource_exhausted); a bad argument or a
// host range registered twice is the caller's mistake; the rest (no device, a failed
// launch, a lost context) leaves the GPU unavailable.
inline Status cuda_error(cudaError_t e, std::string_view what) {
  StatusCode code = StatusCode::unavailable;
  if (e == cudaErrorMemoryAllocation) code = StatusCode::resource_exhausted;
  if (e == cudaErrorInvalidValue || e == cudaErrorHostMemoryAlreadyRegistered) code = StatusCode::invalid_argument;
  return make_status(code, "{}: CUDA error {} ({}): {}", what, int(e), cudaGetErrorName(e), cudaGetErrorString(e));
}

}  // namespace kvstream::gpu::detail

// Returns the mapped Status from the enclosing function when `expr` fails.
#define KVS_CUDA(expr, what)                                               \
  do {                                                                     \
    if (const cudaError_t kvs_e_ = (expr); kvs_e_ != cudaSuccess)          \
      return ::kvstream::gpu::detail::cuda_error(kvs_e_, what);            \
  } while (0)
