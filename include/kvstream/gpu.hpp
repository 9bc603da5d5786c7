// GPU discovery. kvstream uses a GPU only when one is really usable: without a driver
// (every CUDA call returns cudaErrorInsufficientDriver, 35) it says so once and the
// caller takes the CPU path.
#pragma once

#include <cstddef>
#include <string>

#include "kvstream/status.hpp"

namespace kvstream::gpu {

/// What the probe found about device 0.
struct DeviceInfo {
  int device = 0;
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  size_t total_memory = 0;
  int driver_version = 0;   ///< CUDA driver API version (e.g. 13000)
  int runtime_version = 0;  ///< CUDA runtime the library was built with
};

/// True when this build of kvstream contains CUDA code.
bool built_with_cuda() noexcept;

/// Looks for a usable CUDA device once per process and caches the answer. Errors:
/// `unsupported` when built without CUDA, `unavailable` when no driver or device is
/// present (the message names the CUDA error). The first failure is logged once.
Result<DeviceInfo> probe_device();

}  // namespace kvstream::gpu
