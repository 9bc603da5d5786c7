#include <mutex>

#include "core/log.hpp"
#include "kvstream/gpu.hpp"

#if KVSTREAM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvstream::gpu {

bool built_with_cuda() noexcept { return KVSTREAM_HAVE_CUDA != 0; }

namespace {

// Its errors are not logged where they are made: probe_device() logs the one line a
// process gets about its GPU, with what follows from it ("say so once").
Result<DeviceInfo> probe_once() {
#if KVSTREAM_HAVE_CUDA
  DeviceInfo info;
  cudaRuntimeGetVersion(&info.runtime_version);
  // cudaDriverGetVersion succeeds with 0 when no driver is installed, so it is not
  // enough on its own; cudaGetDeviceCount reports the real reason (35 here).
  cudaDriverGetVersion(&info.driver_version);
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess)
    return detail::unlogged_status(StatusCode::unavailable, "no usable GPU: cudaGetDeviceCount failed with {} ({}): {}",
                                   int(err), cudaGetErrorName(err), cudaGetErrorString(err));
  if (count == 0)
    return detail::unlogged_status(StatusCode::unavailable, "no usable GPU: the CUDA driver reports 0 devices");
  cudaDeviceProp prop{};
  const cudaError_t perr = cudaGetDeviceProperties(&prop, 0);
  if (perr != cudaSuccess)
    return detail::unlogged_status(StatusCode::unavailable,
                                   "no usable GPU: cudaGetDeviceProperties failed with {} ({})", int(perr),
                                   cudaGetErrorName(perr));
  info.device = 0;
  info.name = prop.name;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  info.total_memory = prop.totalGlobalMem;
  return info;
#else
  return detail::unlogged_status(StatusCode::unsupported, "kvstream was built without CUDA (KVSTREAM_WITH_CUDA)");
#endif
}

}  // namespace

Result<DeviceInfo> probe_device() {
  static const Result<DeviceInfo> cached = [] {
    Result<DeviceInfo> r = probe_once();
    if (r.ok())
      KVS_LOG_INFO("GPU 0: {} (sm_{}{}, {:.1f} GiB, driver {}, runtime {})", r->name, r->compute_major,
                   r->compute_minor, double(r->total_memory) / (1 << 30), r->driver_version, r->runtime_version);
    else
      KVS_LOG_WARN("{}; using the CPU path", r.status().message());
    return r;
  }();
  return cached;
}

}  // namespace kvstream::gpu
