// The chunk protocol: request and response headers as they travel inside transport
// message headers, with every field bounded. Documented in docs/protocol.md.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kvstream/storage.hpp"

namespace kvstream::storage {

// `data` carries one further segment of a put's or a get's body (docs/protocol.md).
// `touch` and `usage` are spoken only to a node whose hello declares kFeatureUsage.
enum class Op : uint8_t {
  hello = 1,
  auth = 2,
  put = 3,
  get = 4,
  stat = 5,
  remove = 6,
  list = 7,
  data = 8,
  touch = 9,
  usage = 10
};
/// Feature bits a node declares in its hello (the u64 in the checksum's place; nodes
/// from before them send 0, and clients from before them ignore it).
inline constexpr uint64_t kFeatureUsage = 1;  ///< touch and usage requests
inline constexpr uint64_t kFeatureVersions = 2;  ///< a stat with kStatVersions answers each object's write version
/// A remove with kRemoveUpTo deletes only the objects written at or before its version.
inline constexpr uint64_t kFeatureRemoveUpTo = 4;
/// The node takes a connection's requests only under ids from first_request_id(its
/// hello's nonce) up (kRequestIdWindow of them), or from 1 up (clients from before
/// it): a request of another connection (a transport that let a dead connection's
/// message into this one, which on libfabric may belong to another namespace) is
/// refused, and the connection ends.
inline constexpr uint64_t kFeatureIdWindow = 8;
/// The node takes batches of removes (a remove with kRemoveBatch).
inline constexpr uint64_t kFeatureRemoveBatch = 16;
/// The node's list and usage name only what it serves: objects behind its fence
/// (held from before it rejoined) are left out, as from get and stat, and a context
/// with nothing else is not named (nodes before it named them).
inline constexpr uint64_t kFeatureServedOnly = 32;
/// The node reads a request's member-set revision (kMembersRevision) and says in its
/// answer when its own member set is newer (Response::members_newer).
inline constexpr uint64_t kFeatureMembersCheck = 64;
/// Request flags (the u16 after the op; clients from before flags send 0 there, and
/// nodes from before them ignore it). A stat may carry kStatVersions (to a node that
/// declares kFeatureVersions), a remove kRemoveUpTo or kRemoveBatch; any request but
/// hello, auth and data kMembersRevision beside those (kFeatureMembersCheck).
inline constexpr uint16_t kStatVersions = 1;
/// On a remove, to a node that declares kFeatureRemoveUpTo: a u64 version follows
/// the level, and the objects of the context written after it stay (a newer write
/// wins over the remove, as over an older put; and the remove can be sent twice).
inline constexpr uint16_t kRemoveUpTo = 2;
/// On a remove, to a node that declares kFeatureRemoveBatch (alone, instead of
/// kRemoveUpTo): the request names no context; a body follows (its total and checksum
/// after the level) of removes, each a context and the version it is removed up to,
/// each done as a remove with kRemoveUpTo (a context not stored included).
inline constexpr uint16_t kRemoveBatch = 4;
/// To a node that declares kFeatureMembersCheck: a u64 follows the level, the etcd
/// revision the client's member set is current as of (> 0); the node answers with
/// Response::members_newer set where its own set is as of a newer one.
inline constexpr uint16_t kMembersRevision = 8;
/// Bound on a batch of removes' body: one segment.
inline constexpr uint64_t kMaxRemoveBatchBytes = uint64_t(1) << 20;
/// Bound on a touch request's body: one segment.
inline constexpr uint64_t kMaxTouchBodyBytes = uint64_t(1) << 20;
/// Most entries one usage reply may carry, and the bytes a node fills one with (it
/// stops adding entries once the body reaches them; so a page with fewer entries than
/// asked for and a body under them is the last, and a client stops there).
inline constexpr uint32_t kMaxUsagePage = 65536;
inline constexpr uint64_t kMaxUsageBodyBytes = uint64_t(8) << 20;
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
/// Bound on a response's error text (nothing else: the other header fields have
/// their own bounds, and the whole header that of the transport, kMaxHeaderBytes).
inline constexpr size_t kMaxMessageBytes = 512;
inline constexpr uint32_t kMaxChunksPerContext = 1u << 20;
/// Bytes of one part of a put's parts table on the wire: u64 end, f64 score.
inline constexpr size_t kPartWireBytes = 16;
/// The largest request header: a put's fixed fields (32 + the member-set revision +
/// total, checksum, version), its full parts table (u8 count + 224 parts) and the
/// longest context (u8 + 200). It travels in one transport header, so it must fit
/// that bound.
inline constexpr size_t kMaxRequestHeaderBytes =
    4 + 1 + 1 + 2 + 8 + 4 + 4 + 8 + 3 * 8 + 1 + kMaxObjectParts * kPartWireBytes + 1 + kMaxContextBytes;
static_assert(kMaxRequestHeaderBytes <= transport::kMaxHeaderBytes,
              "a put's parts table must fit one transport header");
/// Put and get bodies travel in segments of this size (the last may be shorter): the
/// node never holds more than a segment or two of a transfer in memory, whatever size
/// the header declares.
inline constexpr uint64_t kSegmentBytes = uint64_t(1) << 20;
/// Number of segments of a body of `total` bytes (at least one message: the first).
inline uint64_t segment_count(uint64_t total) { return total == 0 ? 1 : (total + kSegmentBytes - 1) / kSegmentBytes; }
/// Bytes of segment `i` of a body of `total` bytes.
inline uint64_t segment_bytes(uint64_t total, uint64_t i) {
  const uint64_t at = i * kSegmentBytes;
  return at >= total ? 0 : std::min(kSegmentBytes, total - at);
}

struct Request {
  Op op = Op::get;
  uint16_t flags = 0;                   // kStatVersions, kRemoveUpTo, kRemoveBatch, kMembersRevision
  int64_t members_revision = 0;         // with kMembersRevision: the client's member set's revision
  uint64_t id = 0;
  uint32_t chunk = 0;                   // data: the segment's index; usage: most entries to return
  uint32_t level = 0;
  uint64_t total = 0;                   // put, touch: body bytes in all segments
  uint64_t checksum = 0;                // put, touch: xxh3-64 of the whole body
  uint64_t version = 0;                 // put: the write's version (0: unversioned); touch: the stamp
  std::vector<ObjectPart> parts;        // put: the parts table (validate_parts against total)
  uint64_t range_offset = 0;            // get: first byte of the range
  uint64_t range_length = 0;            // get: bytes of the range; 0 = the whole object (offset 0)
  std::string context;                  // put/get/stat/remove; usage: the prefix (may be empty)
  std::string after;                    // usage: list names after this one (empty: from the first)
  std::string name_space;               // auth
  std::array<uint8_t, kMacBytes> mac{};  // auth
};

struct Response {
  Op op = Op::get;
  uint64_t id = 0;
  StatusCode code = StatusCode::ok;
  std::string message;                      // error text, bounded
  uint64_t checksum = 0;                    // xxh3-64 of the whole body (all segments; a range get: of the range)
  uint64_t total = 0;                       // body bytes in all segments (get: the object's, or the range's)
  std::array<uint8_t, kNonceBytes> nonce{};  // hello
  uint64_t features = 0;                     // hello: kFeature* bits (travels in the checksum's place)
  /// The node's member set is newer than the one the request named (kMembersRevision);
  /// travels as the detail byte's top bit, never sent to a request without the flag.
  bool members_newer = false;
};

std::vector<std::byte> encode(const Request& r);
std::vector<std::byte> encode(const Response& r);
/// Parse untrusted headers. Errors: corrupt_data (bad magic, version, op, bounds),
/// invalid_argument (ids that fail validate_id). Only the node parses requests, and it
/// notes a malformed one in its rate-limited log, so decode_request does not log its
/// corrupt_data errors: a peer could otherwise write a line per message it sends.
Result<Request> decode_request(std::span<const std::byte> header);
Result<Response> decode_response(std::span<const std::byte> header);

/// Header of the `data` message that carries segment `index` of request `id`'s body.
std::vector<std::byte> data_request_header(uint64_t id, uint32_t index);
/// Header of a `data` message of response `id`.
std::vector<std::byte> data_response_header(uint64_t id);

/// Sends `first_header` with the first segment of `body` (registered memory), then
/// one `data` message per further segment with headers from `data_header(i)`, all
/// posted before waiting once (rendezvous transports keep the link busy). Errors:
/// those of the connection; on any the connection is broken.
Status send_segmented(transport::Connection& c, std::span<const std::byte> first_header,
                      std::span<const std::byte> body,
                      const std::function<std::vector<std::byte>(uint32_t)>& data_header,
                      transport::Deadline deadline, const transport::CancelToken& cancel);

/// Receives the body of message `id`, `total` bytes in segments, once its first header
/// (announcing `first_len`) has been read: checks each further segment's `data` header
/// (a request's when `of_request`, with its index) and size, lands segment i in
/// `dest(i, len)` (an empty span discards it) and hands what landed to `landed`. Each
/// segment has `per_segment` to arrive. Errors: corrupt_data (framing: the connection
/// can no longer be trusted), the connection's.
///
/// Segment i's receive is posted ahead (Connection::post_recv) once segment
/// i - 1 - `ahead` has landed, before its header is read, so a transport that holds a
/// body until the receiver is ready (libfabric over ofi_rxm) or lands it on arrival
/// (UCX) need not wait for this side to reach it: `dest(i, len)` is asked for then,
/// and must not be memory that segments i - 1 - ahead + 1 .. i - 1 still use (with
/// `ahead` 0 one buffer serves; with 1, two in turn). On an error the receives posted
/// and not yet taken are withdrawn (Connection::abandon_posts) before returning, so
/// no memory `dest` gave out is written afterwards.
Status recv_segmented(transport::Connection& c, bool of_request, uint64_t id, uint64_t total, size_t first_len,
                      const std::function<std::span<std::byte>(uint64_t i, uint64_t len)>& dest,
                      const std::function<void(std::span<std::byte>)>& landed,
                      std::chrono::milliseconds per_segment, const transport::CancelToken& cancel,
                      uint64_t ahead = 0);

/// Body of a stat response: per chunk its level sizes, then per level its parts, and
/// with `versions` (a stat asked with kStatVersions) per level its write version
/// (docs/protocol.md). decode_stats checks every level's parts against its size
/// (validate_parts) and returns ChunkStat::level_parts trimmed as documented, and
/// level_versions as long as level_bytes with `versions`, empty without.
std::vector<std::byte> encode_stats(const std::vector<ChunkStat>& stats, bool versions = false);
Result<std::vector<ChunkStat>> decode_stats(std::span<const std::byte> body, bool versions = false);
/// Drops the trailing levels without parts (ChunkStat::level_parts as every client returns it).
void trim_level_parts(std::vector<std::vector<ObjectPart>>& level_parts);
/// A parts table without its count: (u64 end, f64 score) per part, little-endian (the
/// Redis client's stored form). decode_parts checks the length and the count bound
/// only (corrupt_data); validate_parts checks the rest.
std::vector<std::byte> encode_parts(std::span<const ObjectPart> parts);
Result<std::vector<ObjectPart>> decode_parts(std::span<const std::byte> bytes);
/// Body of a touch request: u32 n, then per context u32 depth, u8 length, bytes.
std::vector<std::byte> encode_touches(std::span<const ContextTouch> touches);
/// Errors: corrupt_data (framing, counts), invalid_argument (a name that fails validate_id).
Result<std::vector<ContextTouch>> decode_touches(std::span<const std::byte> body);
/// Body of a batch of removes: u32 n, then per context u64 version (not 0), u8
/// length, bytes.
std::vector<std::byte> encode_removes(std::span<const ContextRemove> removes);
/// Errors: corrupt_data (framing, counts, a version 0), invalid_argument (a context id).
Result<std::vector<ContextRemove>> decode_removes(std::span<const std::byte> body);
/// Bytes one entry of a batch of removes takes.
inline size_t remove_wire_bytes(const ContextRemove& r) { return 8 + 1 + r.context.size(); }
/// Bytes one entry of a touch body takes.
inline size_t touch_wire_bytes(const ContextTouch& t) { return 4 + 1 + t.context.size(); }
/// Body of a usage response: u32 n, then per context u8 length, bytes, u64 bytes,
/// u64 written, u64 used, u32 depth, u32 chunk count, u32 chunk ids (ascending).
std::vector<std::byte> encode_usage(const std::vector<ContextUsage>& usage);
/// Bytes one entry of a usage body takes.
inline size_t usage_wire_bytes(const ContextUsage& u) {
  return 1 + u.context.size() + 8 + 8 + 8 + 4 + 4 + 4 * u.chunks.size();
}
Result<std::vector<ContextUsage>> decode_usage(std::span<const std::byte> body);
/// Body of a list response.
std::vector<std::byte> encode_names(const std::vector<std::string>& names);
Result<std::vector<std::string>> decode_names(std::span<const std::byte> body);

/// A fresh write version from this process's clock: microseconds since the epoch,
/// and always above every version it returned before (so writes issued one after
/// another by this process are ordered as issued, whatever the wall clock does).
uint64_t next_write_version();

/// xxh3-64 of a body.
uint64_t body_checksum(std::span<const std::byte> body);

/// HMAC-SHA256(secret, nonce || namespace): what a client proves it knows.
std::array<uint8_t, kMacBytes> auth_mac(const std::string& secret, std::span<const uint8_t> nonce,
                                        const std::string& name_space);
/// A fresh random nonce (from the OS).
Result<std::array<uint8_t, kNonceBytes>> make_nonce();
/// How many request ids a connection may use (kFeatureIdWindow): at a million
/// requests a second, twelve days of them; a connection past it is ended by the node
/// and made again by the client.
inline constexpr uint64_t kRequestIdWindow = uint64_t(1) << 40;
/// The first request id of a connection whose hello carried `nonce`: from 2^63 up,
/// so no window of it meets the ids from 1 of clients from before kFeatureIdWindow.
uint64_t first_request_id(std::span<const uint8_t> nonce);
/// Whether a node takes request `id` on a connection whose ids start at `first`.
[[nodiscard]] inline bool request_id_in_window(uint64_t id, uint64_t first) {
  return (id >= 1 && id < kRequestIdWindow) || (id >= first && id - first < kRequestIdWindow);
}
/// Constant-time comparison.
bool mac_equal(std::span<const uint8_t> a, std::span<const uint8_t> b);

}  // namespace kvstream::storage
