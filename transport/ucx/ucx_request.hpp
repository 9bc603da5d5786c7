// One UCX request the backend waits for, and the request parameters its posts use.
#pragma once

#include <ucp/api/ucp.h>

#include <cstddef>
#include <cstdint>

#include "transport/ucx/ucx_wire.hpp"

namespace kvstream::transport::ucx_detail {

/// One UCX request we wait for. Completion fields are written by callbacks, which run
/// inside ucp_worker_progress with the engine mutex held; the Op must therefore stay
/// at its address until `done` (or until the worker is destroyed).
struct Op {
  void* req = nullptr;  // UCX request while pending
  bool done = true;
  ucs_status_t status = UCS_OK;
  size_t length = 0;
  ucp_tag_recv_info_t info{};

  void complete(ucs_status_t s) {
    done = true;
    status = s;  // no clock read here: it sits on every message's critical path
  }
  /// Takes the outcome of a *_nbx call. Returns false when it failed at once.
  bool track(ucs_status_ptr_t p) {
    if (p == nullptr) {
      complete(UCS_OK);
      length = info.length;
      return true;
    }
    if (UCS_PTR_IS_ERR(p)) {
      complete(UCS_PTR_STATUS(p));
      return false;
    }
    req = p;
    return true;
  }
  /// Frees the request of a completed op.
  void release() {
    if (req) ucp_request_free(req);
    req = nullptr;
  }
  void arm() {
    done = false;
    status = UCS_INPROGRESS;
    length = 0;
    req = nullptr;
  }
};

inline void send_cb(void* /*request*/, ucs_status_t status, void* user) { static_cast<Op*>(user)->complete(status); }

inline void recv_cb(void* /*request*/, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  auto* op = static_cast<Op*>(user);
  if (info) op->length = info->length;
  op->complete(status);
}

/// Parameters of a send (tag, active message, get, close) that completes into `op`.
inline ucp_request_param_t send_param(Op& op) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = send_cb;
  p.user_data = &op;
  return p;
}

/// Posts a tag receive of exactly `tag` into `buf` that completes into `op` (armed
/// here). Returns false when UCX refused it at once (op.status says why).
inline bool post_tag_recv(ucp_worker_h worker, void* buf, size_t size, uint64_t tag, Op& op) {
  op.arm();
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_RECV_INFO |
                   UCP_OP_ATTR_FLAG_NO_IMM_CMPL;  // 1.13 leaves tag_info unset on immediate completion
  p.cb.recv = recv_cb;
  p.user_data = &op;
  p.recv_info.tag_info = &op.info;
  return op.track(ucp_tag_recv_nbx(worker, buf, size, tag, kExactTag, &p));
}

}  // namespace kvstream::transport::ucx_detail
