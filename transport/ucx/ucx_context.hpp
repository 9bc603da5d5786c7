// The UCP context a backend's worker and registrations live in, created from
// UcxSettings: which transports, whether endpoints detect peer failures (and what
// UCX 1.13 then needs to keep shared memory fast), which memory types it handles.
#pragma once

#include <ucp/api/ucp.h>

#include <memory>
#include <mutex>
#include <string>

#include "kvstream/transport.hpp"

namespace kvstream::transport::ucx_detail {

struct Context {
  ucp_context_h h = nullptr;
  /// Guards the context and its one worker (UCS_THREAD_MODE_SERIALIZED, and a
  /// context without UCP_PARAM_FIELD_MT_WORKERS_SHARED): every UCX call, including
  /// a registration's map and unmap, which touch state the worker's progress uses.
  /// It lives here, not in the engine, because regions may outlive the engine.
  std::mutex mu;
  /// "UCX_TLS=shm,tcp" or "UCX default": what the transports were chosen by.
  std::string provider;
  /// The context handles cuda memory (UCX was built with a cuda transport).
  bool cuda = false;

  Context() = default;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ~Context() {
    if (h) ucp_cleanup(h);
  }

  /// A context with the tag, active message, RMA and wakeup features. Errors:
  /// invalid_argument (a UCX_TLS value UCX rejects), unsupported (`memory` is cuda
  /// and this UCX has no cuda transport), unavailable (UCX failed).
  static Result<std::shared_ptr<Context>> create(const UcxSettings& settings, MemoryType memory);
};

}  // namespace kvstream::transport::ucx_detail
