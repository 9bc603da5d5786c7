// Stray messages: tag messages no receive of this worker will ever take. UCP keeps a
// message that matches no posted receive in the worker's unexpected queue until one
// does, and any peer of the worker can send under any tag, so without a sweep such
// messages stay for the worker's life: those a client sent to a connection that has
// since closed (a request cut short by a reconnection), and those of a peer that
// sends under guessed tags (memory a peer could fill at will).
//
// A message is a stray when its tag names no open connection (an rx id nobody uses,
// one of a closed connection, a kind we never send), or names an open one under a
// sequence number that connection will never receive: behind what it has consumed,
// or kMaxLead or more ahead of it. A body's sequence is read through the connection's
// key (ucx_wire.hpp), so a guessed body tag decodes to a sequence far off the window.
// The sweep (Engine::sweep_strays_locked, on each pass of the engine's background
// thread) receives each stray into a small buffer (UCX completes the receive
// truncated, a rendezvous one included, and tells the sender its send is done) and
// counts it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "transport/common/tag_cover.hpp"

namespace kvstream::transport::ucx_detail {

using transport::kMaxLead;
using transport::TagFilter;

/// What one open connection will still receive: messages under its rx id whose
/// sequence number (a body's read through `body_xor`, the high half of its key, 0
/// without keys) is in [from, from + kMaxLead) (transport/common/tag_cover.hpp).
struct ExpectedSpace {
  uint32_t rx_id = 0;
  uint32_t from = 0;
  uint32_t body_xor = 0;
};

/// Whether a message under `tag` is a stray, given the open connections' spaces
/// (sorted by rx id, one each).
bool is_stray(uint64_t tag, std::span<const ExpectedSpace> open);

/// Filters that together match exactly the stray tags (`open` as for is_stray): a
/// sweep that probes each of them reaches a stray that waits behind a kept message,
/// which a probe for any tag (it returns the oldest message) cannot. At most about
/// 200 filters per open connection.
std::vector<TagFilter> stray_cover(std::span<const ExpectedSpace> open);

}  // namespace kvstream::transport::ucx_detail
