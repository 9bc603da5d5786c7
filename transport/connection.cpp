// What every connection does the same way, whatever carries it.
#include "core/log.hpp"
#include "transport/common/wait.hpp"

namespace kvstream::transport {

Status Connection::send(std::span<const std::byte> header, std::span<const std::byte> body, Deadline deadline,
                        const CancelToken& cancel) {
  if (header.size() > kMaxHeaderBytes)
    return make_status(StatusCode::invalid_argument, "send to {}: header of {} bytes exceeds {}", describe(),
                       header.size(), kMaxHeaderBytes);
  // Nothing of this message is queued yet: a deadline or cancel here leaves the
  // stream intact (earlier posted messages, if any, are left to their wait_sends).
  // describe() formats a string: only a refused send pays for it.
  if (cancel.cancelled() || Clock::now() >= deadline) return wait_verdict(deadline, &cancel, describe(), "send");
  // A small message usually completes inside the post; wait_sends then returns at once.
  KVS_ASSIGN_OR_RETURN(uint64_t seq, post_send(header, body));
  return wait_sends(seq, deadline, cancel);
}

}  // namespace kvstream::transport
