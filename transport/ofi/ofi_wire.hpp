// What the libfabric backend puts on the wire: the tag every message carries and the
// fixed structs of the handshake, the message header and the remote key.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvstream/transport.hpp"
#include "transport/common/tag.hpp"

namespace kvstream::transport::ofi {

/// | kind:4 | connection id:20 | sequence:24 | segment:16 |: many connections share a
/// listener's endpoint, and a receive names exactly the piece it wants.
using Tag = TagLayout<4, 20, 24, 16>;

/// `clear`: the receiver of a message whose body is larger than the provider's inject
/// size tells its sender to send that body (tagged with the message's sequence), once
/// the body's receives are posted (Core::cleared_bodies).
enum class MsgType : uint64_t {
  hello = 1,
  hello_ack = 2,
  header = 3,
  body = 4,
  bye = 5,
  probe = 6,
  probe_ack = 7,
  clear = 8
};

constexpr uint64_t make_tag(MsgType t, uint64_t conn, uint64_t seq = 0, uint64_t seg = 0) {
  return Tag::pack({uint64_t(t), conn, seq, seg});
}
static_assert(make_tag(MsgType::body, 1, 2, 3) == ((uint64_t(4) << 60) | (uint64_t(1) << 40) | (uint64_t(2) << 16) | 3),
              "the tag layout is part of the wire format");

/// A hello-ack carries the client's nonce in every bit below the kind, so the ack
/// receive a client posts before its hello matches its own ack only.
constexpr uint64_t kNonceMask = Tag::kBelowKind;
constexpr uint64_t hello_ack_tag(uint64_t nonce) { return make_tag(MsgType::hello_ack, 0) | (nonce & kNonceMask); }

/// Largest single tagged message, whatever the provider allows.
inline constexpr size_t kMaxSegmentBytes = size_t(1) << 30;

/// The hello of this wire version: bodies larger than the inject size wait for the
/// receiver's clear. A listener refuses hellos of the version before it (kHelloMagicV1,
/// bodies sent at once, which a receiver of this version would take for strays).
inline constexpr uint32_t kHelloMagic = 0x6b764f49;    // "kvOI"
inline constexpr uint32_t kHelloMagicV1 = 0x6b764f48;  // "kvOH"
/// A Hello with this magic, tagged (hello, connection id), asks a listener whether it
/// still knows that connection (ofi_liveness.hpp); one that does not (a node that
/// restarted) answers a HelloAck with kUnknownMagic under the connection's ack tag.
/// Listeners older than the question take it for junk: a client asks only a listener
/// whose hello-ack says it answers (kAnswersQuestions).
inline constexpr uint32_t kVerifyMagic = 0x6b764f56;   // "kvOV"
inline constexpr uint32_t kUnknownMagic = 0x6b764f55;  // "kvOU"
inline constexpr uint32_t kHeaderMagic = 0x6b764f4d;  // "kvOM"
inline constexpr size_t kMaxAddrBytes = 256;

/// A client's connection request: its endpoint's address (fi_getname) and the nonce
/// its ack will be tagged with.
struct Hello {
  uint32_t magic;
  uint32_t addr_len;
  uint64_t nonce;
  unsigned char addr[kMaxAddrBytes];
};
/// The listener's answer: the connection id the client tags its messages with.
struct HelloAck {
  uint32_t magic;
  uint32_t conn_id;
};
/// Set in a HelloAck's conn_id (ids fit the tag's 20 bits) by a listener that
/// answers kVerifyMagic questions. A client asks only such a listener: an older one
/// takes a question for junk, and did not replace the hello receive it used up.
inline constexpr uint32_t kAnswersQuestions = uint32_t(1) << 31;
static_assert(Tag::kConnMask < kAnswersQuestions, "the flag lies above every connection id");
/// A liveness probe (ofi_liveness.hpp), tagged with the connection and the probe's
/// number, and its answer (the same bytes): the nonce of the connection's hello, so
/// only the endpoint that made the connection answers for it.
struct Probe {
  uint64_t nonce;
};
/// Starts a header message; the header follows it, the body comes as separate segments.
struct HeaderPrefix {
  uint32_t magic;
  uint32_t header_len;  // with kWaitsForClear where the body is sent on the receiver's clear
  uint64_t body_size;
};
/// Set in HeaderPrefix::header_len (headers are at most kMaxHeaderBytes): the sender
/// sends the body once the receiver sends a clear for this message.
inline constexpr uint32_t kWaitsForClear = uint32_t(1) << 31;
static_assert(kMaxHeaderBytes < kWaitsForClear, "the flag lies above every header length");
inline constexpr size_t kHeaderBufBytes = sizeof(HeaderPrefix) + kMaxHeaderBytes;

/// Wire form of a libfabric remote key (RemoteRegion::key): u64 key, then one byte
/// saying how the reader addresses the region (1: by virtual address, FI_MR_VIRT_ADDR;
/// 0: by offset from its start). The reader checks the byte against its own domain,
/// so two ends that disagree fail clearly instead of reading the wrong bytes.
inline constexpr size_t kRemoteKeyBytes = 9;

}  // namespace kvstream::transport::ofi
