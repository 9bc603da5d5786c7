// The backend factories behind create_backend (each present only when its library
// was found at configure time).
#pragma once

#include <memory>

#include "kvstream/transport.hpp"

namespace kvstream::transport {

Result<std::unique_ptr<Backend>> make_tcp_backend(const BackendConfig& config);
Result<std::unique_ptr<Backend>> make_ucx_backend(const BackendConfig& config);
Result<std::unique_ptr<Backend>> make_ofi_backend(const BackendConfig& config);

}  // namespace kvstream::transport
