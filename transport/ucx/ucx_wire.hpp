// What two kvstream UCX peers put on the wire.
//
// Every connection has, on each side, a receive tag space chosen by that side (rx_id,
// unique within its worker) and announced to the peer in a small "hello" active
// message sent on connect/accept (ucx_handshake.cpp; UCP tag matching is per worker,
// not per endpoint). A message is then
//   header: tag = kHeader | peer_rx_id | seq, payload = u64 body size + header bytes
//   body:   tag = kBody   | peer_rx_id | seq, payload = the body (absent when empty)
// so header and body of one message pair up and many messages can be in flight.
// A small body (header + body <= kMaxHeaderBytes) rides inside the header message
// instead (prefix bit 63 set; the body follows the header bytes; one message per
// round trip leg instead of two). Only where both engines are host-only: the hello
// carries a third word, flag kHelloInlineOk, and the copy is a memcpy.
//
// Connection keys. UCP tag receives cannot name their sender, so any peer of a worker
// can send under any rx id. Each side therefore draws a 64-bit key per connection
// (getrandom(2)) and announces it in its hello (flag kHelloKeyed, words 3 and 4). On
// a keyed connection every header message starts with the receiver's key, and a
// header receive that holds anything else (or was truncated: no peer of ours sends
// more than kHeaderMessageBytes) is dropped and posted again; bodies travel under
// sequence numbers XORed with the key's high half, so a body under a guessed tag
// matches no receive. A connection is keyed when both hellos set the flag: a peer
// from before 2026-12-05 reads only the first three words and sends no key.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvstream/transport.hpp"
#include "transport/common/tag.hpp"

namespace kvstream::transport::ucx_detail {

/// kind (8 bits) | receiver's rx id (24) | sequence (32), kind most significant.
using Tag = TagLayout<8, 24, 32, 0>;

constexpr uint64_t kHeaderKind = 1;
constexpr uint64_t kBodyKind = 2;
/// Every receive is for one piece of one message of one connection: all tag bits match.
constexpr uint64_t kExactTag = ~uint64_t(0);
/// rx ids are allocated below the tag's connection field.
constexpr uint32_t kRxIdMask = uint32_t(Tag::kConnMask);

constexpr uint64_t make_tag(uint32_t rx_id, uint64_t kind, uint32_t seq) { return Tag::pack({kind, rx_id, seq, 0}); }

/// A body's tag: its sequence number XORed with the high half of the receiver's key
/// (0 on a connection without keys).
constexpr uint64_t make_body_tag(uint32_t rx_id, uint32_t seq, uint64_t key) {
  return make_tag(rx_id, kBodyKind, seq ^ uint32_t(key >> 32));
}

constexpr size_t kKeyBytes = 8;                      // the receiver's key, first in a keyed header message
constexpr size_t kPrefix = 8;                        // u64 body size in front of the header bytes
constexpr uint64_t kInlineFlag = uint64_t(1) << 63;  // in the prefix: the body follows the header bytes
constexpr size_t kHeaderMessageBytes = kKeyBytes + kPrefix + kMaxHeaderBytes;

constexpr unsigned kHelloAmId = 7;
constexpr uint32_t kHelloMagic = 0x4b565543;  // "KVUC"
constexpr uint32_t kHelloInlineOk = 1;        // hello flag: this side accepts inline bodies (host-only)
constexpr uint32_t kHelloKeyed = 2;           // hello flag: headers to this side carry its key (words 3, 4)
/// Words of a hello: magic, the sender's rx id, flags, the sender's key (low, high).
constexpr size_t kHelloWords = 5;

}  // namespace kvstream::transport::ucx_detail
