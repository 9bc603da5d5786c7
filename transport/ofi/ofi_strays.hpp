// Stray messages on a libfabric endpoint: tagged messages no receive of ours will
// ever take. ofi_rxm keeps a message that matches no posted receive in the
// endpoint's unexpected queue until one does, and anyone that can reach the endpoint
// can send under any tag (a hello is not even needed), so without a sweep such
// messages stay for the endpoint's life: those a client sent on a connection the node
// has since closed, and those of a peer that sends under guessed tags (a node's memory
// grew 4x the strays' bytes and stayed there: perf/RESULTS.md).
//
// A message is a stray when its tag names
//  * a kind this endpoint never receives unasked: a hello or a liveness probe on an
//    endpoint that does not listen; a hello-ack or a probe's answer, whose receive is
//    always posted before the message they answer goes out; a kind we never send;
//  * a connection id no open connection of this endpoint has (never given, or closed),
//    unless a handshake of the endpoint is under way;
//  * an open connection's header outside [from, from + kMaxLead) of its sequence
//    (behind what it consumed, or too far ahead), or a body outside
//    [from - 1, from + kMaxLead) (the body of the header just read comes after it).
// A connection that failed still counts as open (what arrived before it failed is
// still handed out); one that closed does not.
//
// The sweep (Endpoint::sweep_strays, on the endpoint's progress thread) peeks at the
// oldest waiting message (fi_trecvmsg with FI_PEEK) and, while it is a stray, drops it
// (FI_PEEK | FI_DISCARD under its exact tag) and counts it. Strays behind a message
// kept for its connection are reached by peeking with each filter of stray_cover.
// Providers without FI_PEEK (shm: a peek never completes there) are not swept.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "transport/common/tag_cover.hpp"
#include "transport/ofi/ofi_wire.hpp"

namespace kvstream::transport::ofi {

/// What one open connection will still receive: headers under its id whose sequence
/// is in [from, from + kMaxLead), bodies in [from - 1, from + kMaxLead), and its
/// peer's bye. `from` is the sequence of the next header it will read.
struct ExpectedSpace {
  uint32_t conn = 0;
  uint32_t from = 0;
};

/// What an endpoint will still receive: hellos and probes under any id where it
/// listens (a listener keeps receives posted for them, and takes every one), and its
/// open connections' spaces, sorted by id. An id may be there twice: a client
/// endpoint is shared by connections to several listeners, each of which gives out
/// its own ids.
struct Expected {
  bool listening = false;
  std::vector<ExpectedSpace> open;
  /// A client's handshake is under way on the endpoint: its connection does not
  /// exist yet, and the peer may speak first (a storage node's challenge can arrive
  /// before the hello-ack's reader has made the connection), so no message of a
  /// connection's kinds is a stray until it is made.
  bool greeting = false;
};

/// Whether a message under `tag` is a stray for an endpoint that expects `e`.
[[nodiscard]] bool is_stray(uint64_t tag, const Expected& e);

/// Filters that together match exactly the stray tags of `e`, but for the sequences
/// of an id open twice (none of its tags is matched there). About 220 filters per
/// open connection.
[[nodiscard]] std::vector<TagFilter> stray_cover(const Expected& e);

}  // namespace kvstream::transport::ofi
