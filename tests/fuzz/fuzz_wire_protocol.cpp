// libFuzzer target: the storage protocol's parsers on untrusted bytes: request and
// response headers, stat, list, touch, usage and batch-of-removes bodies (the first
// input byte picks which).
// Invariants besides memory safety: a parser never returns `internal`; whatever it
// accepts re-encodes to bytes it parses back to the same fields, every one compared
// (a put's total, checksum, version and parts table, a get's range, a response's total,
// a stat body's level sizes and parts, scores bit for bit), and those bytes re-encode
// to themselves: nothing accepted is lost or invented on the way. What it accepts is
// also valid: a put's parts table fits its body, a range lies within the largest
// object, fields of other ops are zero, a stat body's parts are trimmed and each
// level's fits its size, a touch's body is within a segment, a usage page's names and
// chunk ids are in order.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "storage/protocol.hpp"

using namespace kvstream;
using namespace kvstream::storage;

namespace {
[[noreturn]] void fail(const char* what, const Status& st = {}) {
  std::fprintf(stderr, "fuzz_wire_protocol: invariant broken: %s %s\n", what, st.to_string().c_str());
  std::abort();
}
template <typename T>
void no_internal(const Result<T>& r, const char* what) {
  if (!r.ok() && r.status().code() == StatusCode::internal) fail(what, r.status());
}
// Scores compare bit for bit (a round trip must not even turn -0.0 into 0.0).
bool same(std::span<const ObjectPart> a, std::span<const ObjectPart> b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].end != b[i].end || std::memcmp(&a[i].score, &b[i].score, sizeof(double)) != 0) return false;
  return true;
}
bool same(const Request& a, const Request& b) {
  return a.op == b.op && a.flags == b.flags && a.members_revision == b.members_revision && a.id == b.id &&
         a.chunk == b.chunk && a.level == b.level && a.total == b.total &&
         a.checksum == b.checksum && a.version == b.version && same(a.parts, b.parts) &&
         a.range_offset == b.range_offset && a.range_length == b.range_length && a.context == b.context &&
         a.name_space == b.name_space && a.mac == b.mac && a.after == b.after;
}
bool same(const Response& a, const Response& b) {
  return a.op == b.op && a.id == b.id && a.code == b.code && a.message == b.message && a.checksum == b.checksum &&
         a.total == b.total && a.nonce == b.nonce && a.features == b.features && a.members_newer == b.members_newer;
}
bool same(const ChunkStat& a, const ChunkStat& b) {
  if (a.chunk != b.chunk || a.level_bytes != b.level_bytes || a.level_versions != b.level_versions ||
      a.level_parts.size() != b.level_parts.size())
    return false;
  for (size_t l = 0; l < a.level_parts.size(); ++l)
    if (!same(a.level_parts[l], b.level_parts[l])) return false;
  return true;
}
bool same(const std::vector<ChunkStat>& a, const std::vector<ChunkStat>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same(a[i], b[i])) return false;
  return true;
}
// What an accepted request promises its handler: a put's parts table is valid for its
// body, a range lies within the largest object, fields of other ops are zero.
void check_accepted(const Request& r) {
  if (Status s = validate_parts(r.parts, r.total); !s.ok()) fail("accepted a put whose parts table is invalid", s);
  const uint16_t own = r.flags & ~kMembersRevision;  // the op's flag; the member-set revision may go beside it
  const bool batch = r.op == Op::remove && own == kRemoveBatch;
  const bool has_body = r.op == Op::put || r.op == Op::touch || batch;
  const bool versioned_remove = r.op == Op::remove && own == kRemoveUpTo;
  if ((r.flags & kMembersRevision) ? r.members_revision <= 0 : r.members_revision != 0)
    fail("a member-set revision out of bounds, or without its flag");
  if (!has_body && (r.total != 0 || r.checksum != 0 || (r.version != 0 && !versioned_remove)))
    fail("put fields on another op");
  if (r.op != Op::put && !r.parts.empty()) fail("a parts table on another op");
  if (r.op == Op::touch && (r.total == 0 || r.total > kMaxTouchBodyBytes)) fail("accepted a touch body out of bounds");
  if (batch && (r.total == 0 || r.total > kMaxRemoveBatchBytes || !r.context.empty() || r.version != 0))
    fail("accepted a batch of removes out of bounds, or naming a context");
  if (r.op != Op::usage && !r.after.empty()) fail("a usage start on another op");
  if (r.op == Op::usage && (r.chunk == 0 || r.chunk > kMaxUsagePage)) fail("accepted a usage page out of bounds");
  if (r.op != Op::get && (r.range_offset != 0 || r.range_length != 0)) fail("range fields on another op");
  if (own != 0 && !(r.op == Op::stat && own == kStatVersions) && !versioned_remove && !batch)
    fail("accepted a flag no node knows");
  if (r.range_length == 0 && r.range_offset != 0) fail("accepted a range of no length");
  if (r.range_offset > kMaxChunkBytes || r.range_length > kMaxChunkBytes - r.range_offset)
    fail("accepted a range past the largest object");
}
// What an accepted stat body promises: level_parts no longer than level_bytes, trimmed
// (it ends at a level with parts), each level's table valid for its size.
void check_accepted(const std::vector<ChunkStat>& stats) {
  for (const ChunkStat& s : stats) {
    if (s.level_parts.size() > s.level_bytes.size()) fail("stat: more levels of parts than levels");
    if (!s.level_parts.empty() && s.level_parts.back().empty()) fail("stat: level_parts not trimmed");
    if (!s.level_versions.empty() && s.level_versions.size() != s.level_bytes.size())
      fail("stat: versions not one per level");
    for (size_t l = 0; l < s.level_parts.size(); ++l)
      if (Status v = validate_parts(s.level_parts[l], s.level_bytes[l]); !v.ok()) fail("stat: invalid parts", v);
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto in = std::as_bytes(std::span(data + 1, size - 1));
  switch (data[0] % 6) {
    case 0: {
      auto r = decode_request(in);
      no_internal(r, "decode_request");
      if (r.ok()) {
        check_accepted(*r);
        const auto bytes = encode(*r);
        auto again = decode_request(bytes);
        if (!again.ok() || !same(*r, *again)) fail("request round trip", again.status());
        if (encode(*again) != bytes) fail("request re-encodes differently");
      }
      break;
    }
    case 1: {
      auto r = decode_response(in);
      no_internal(r, "decode_response");
      if (r.ok()) {
        const auto bytes = encode(*r);
        auto again = decode_response(bytes);
        if (!again.ok() || !same(*r, *again)) fail("response round trip", again.status());
        if (encode(*again) != bytes) fail("response re-encodes differently");
      }
      break;
    }
    case 2: {
      // The stat body with write versions (a stat asked with kStatVersions) or without.
      const bool versions = (data[0] / 6) & 1;
      auto r = decode_stats(in, versions);
      no_internal(r, "decode_stats");
      if (r.ok()) {
        check_accepted(*r);
        for (const ChunkStat& s : *r)
          if (s.level_versions.empty() == versions && !s.level_bytes.empty()) fail("stat: versions not as asked");
        const auto bytes = encode_stats(*r, versions);
        auto again = decode_stats(bytes, versions);
        if (!again.ok() || !same(*r, *again)) fail("stats round trip", again.status());
        if (encode_stats(*again, versions) != bytes) fail("stats re-encode differently");
      }
      break;
    }
    case 4: {
      auto r = decode_touches(in);
      no_internal(r, "decode_touches");
      if (r.ok()) {
        if (r->empty()) fail("accepted a touch of nothing");
        const auto bytes = encode_touches(*r);
        auto again = decode_touches(bytes);
        if (!again.ok() || *again != *r) fail("touches round trip", again.status());
        if (encode_touches(*again) != bytes) fail("touches re-encode differently");
      }
      break;
    }
    case 5: {
      auto r = decode_usage(in);
      no_internal(r, "decode_usage");
      if (r.ok()) {
        for (size_t i = 0; i < r->size(); ++i) {
          const auto& c = (*r)[i].chunks;
          if (i > 0 && !((*r)[i - 1].context < (*r)[i].context)) fail("usage: names out of order");
          for (size_t k = 1; k < c.size(); ++k)
            if (c[k - 1] >= c[k]) fail("usage: chunk ids out of order");
        }
        const auto bytes = encode_usage(*r);
        auto again = decode_usage(bytes);
        if (!again.ok() || *again != *r) fail("usage round trip", again.status());
        if (encode_usage(*again) != bytes) fail("usage re-encodes differently");
      }
      break;
    }
    case 3:
      if ((data[0] / 6) & 1) {  // half of this case's inputs: a batch of removes' body
        auto r = decode_removes(in);
        no_internal(r, "decode_removes");
        if (r.ok()) {
          for (const ContextRemove& x : *r)
            if (x.version == 0 || !validate_id(x.context, kMaxContextBytes, "id").ok()) fail("accepted a bad remove");
          const auto bytes = encode_removes(*r);
          auto again = decode_removes(bytes);
          if (!again.ok() || *again != *r) fail("removes round trip", again.status());
          if (encode_removes(*again) != bytes) fail("removes re-encode differently");
        }
        break;
      }
      [[fallthrough]];
    default: {
      auto r = decode_names(in);
      no_internal(r, "decode_names");
      if (r.ok()) {
        auto again = decode_names(encode_names(*r));
        if (!again.ok() || *again != *r) fail("names round trip", again.status());
      }
      break;
    }
  }
  return 0;
}
