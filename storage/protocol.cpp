#include "storage/protocol.hpp"
#include "storage/wire_status.hpp"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <xxhash.h>

#include "core/log.hpp"

namespace kvstream::storage {

namespace {
constexpr uint32_t kRequestMagic = 0x5153564b;   // "KVSQ"
constexpr uint32_t kResponseMagic = 0x5253564b;  // "KVSR"
// 2: segmented bodies, put checksums. 3: parts tables (put, stat), range gets. The
// touch and usage requests came later under 3: a node declares them in its hello
// (kFeatureUsage), so peers from before them never meet them.
constexpr uint8_t kVersion = 3;
// The detail byte's top bit: Response::members_newer (the rest refines the code).
constexpr uint8_t kDetailMembersNewer = 0x80;

class Writer {
 public:
  template <typename T>
  void put(T v) {
    // Appended through a local copy: resize-then-memcpy trips GCC 12's
    // -Wstringop-overflow false positive at -O2 and above.
    std::array<std::byte, sizeof v> b;
    std::memcpy(b.data(), &v, sizeof v);
    out.insert(out.end(), b.begin(), b.end());
  }
  void put_str8(const std::string& s) {  // callers bound the length to < 256
    put(uint8_t(s.size()));
    put_bytes(s.data(), s.size());
  }
  void put_str16(const std::string& s) {
    put(uint16_t(s.size()));
    put_bytes(s.data(), s.size());
  }
  void put_bytes(const void* p, size_t n) {
    const size_t at = out.size();
    out.resize(at + n);
    if (n) std::memcpy(out.data() + at, p, n);
  }
  std::vector<std::byte> out;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  template <typename T>
  T get() {
    T v{};
    if (!ok_ || in_.size() - pos_ < sizeof v) return ok_ = false, v;
    std::memcpy(&v, in_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::string get_str(size_t n, size_t max) {
    if (!ok_ || n > max || in_.size() - pos_ < n) return ok_ = false, std::string();
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  void get_bytes(void* p, size_t n) {
    if (!ok_ || in_.size() - pos_ < n) return void(ok_ = false);
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
  }
  [[nodiscard]] bool ok() const { return ok_; }
  [[nodiscard]] bool done() const { return ok_ && pos_ == in_.size(); }

 private:
  std::span<const std::byte> in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

void put_parts_table(Writer& w, std::span<const ObjectPart> parts) {  // callers bound the count
  w.put(uint8_t(parts.size()));
  for (const ObjectPart& p : parts) w.put(p.end), w.put(p.score);
}

// A parts table as it travels: u8 count (<= kMaxObjectParts), then (u64 end, f64 score)
// each. Only the count is checked here; the caller validates the table against its
// object's size.
bool get_parts_table(Reader& rd, std::vector<ObjectPart>& parts) {
  const uint8_t n = rd.get<uint8_t>();
  if (!rd.ok() || n > kMaxObjectParts) return false;
  parts.resize(n);
  for (ObjectPart& p : parts) p.end = rd.get<uint64_t>(), p.score = rd.get<double>();
  return rd.ok();
}

Status version_error(std::string_view what, uint8_t version) {
  return make_status(StatusCode::unsupported,
                     "{} speaks chunk protocol version {}, this build speaks {} (upgrade nodes and clients together)",
                     what, version, kVersion);
}

bool op_valid(uint8_t op) { return op >= uint8_t(Op::hello) && op <= uint8_t(Op::usage); }
bool has_context(Op op) { return op == Op::put || op == Op::get || op == Op::stat || op == Op::remove; }
}  // namespace

Status validate_parts(std::span<const ObjectPart> parts, uint64_t size) {
  if (parts.size() > kMaxObjectParts)
    return make_status(StatusCode::invalid_argument, "{} parts (limit {})", parts.size(), kMaxObjectParts);
  uint64_t prev = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].end <= prev)
      return make_status(StatusCode::invalid_argument, "part {} ends at byte {}, not after {}", i, parts[i].end, prev);
    if (!std::isfinite(parts[i].score))
      return make_status(StatusCode::invalid_argument, "part {} has a score that is not finite", i);
    prev = parts[i].end;
  }
  if (!parts.empty() && prev != size)
    return make_status(StatusCode::invalid_argument, "the last part ends at byte {}, the object has {}", prev, size);
  return {};
}

void trim_level_parts(std::vector<std::vector<ObjectPart>>& level_parts) {
  while (!level_parts.empty() && level_parts.back().empty()) level_parts.pop_back();
}

std::vector<std::byte> encode_parts(std::span<const ObjectPart> parts) {
  Writer w;
  for (const ObjectPart& p : parts) w.put(p.end), w.put(p.score);
  return std::move(w.out);
}

Result<std::vector<ObjectPart>> decode_parts(std::span<const std::byte> bytes) {
  if (bytes.size() % kPartWireBytes != 0 || bytes.size() / kPartWireBytes > kMaxObjectParts)
    return make_status(StatusCode::corrupt_data, "a parts table of {} bytes", bytes.size());
  Reader rd(bytes);
  std::vector<ObjectPart> parts(bytes.size() / kPartWireBytes);
  for (ObjectPart& p : parts) p.end = rd.get<uint64_t>(), p.score = rd.get<double>();
  return parts;
}

Status validate_id(std::string_view id, size_t max_bytes, std::string_view what) {
  if (id.empty() || id.size() > max_bytes)
    return make_status(StatusCode::invalid_argument, "{} must be 1..{} bytes", what, max_bytes);
  // A leading dot is the store's own (.tmp, .quarantine, .lock), and rules out "." and "..".
  if (id.front() == '.') return make_status(StatusCode::invalid_argument, "{} may not start with '.'", what);
  for (char c : id)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
          c == '-'))
      return make_status(StatusCode::invalid_argument, "{} may hold only [A-Za-z0-9._-]", what);
  return {};
}

std::vector<std::byte> encode(const Request& r) {
  Writer w;
  w.put(kRequestMagic), w.put(kVersion), w.put(uint8_t(r.op)), w.put(r.flags);
  w.put(r.id), w.put(r.chunk), w.put(r.level);
  if (r.flags & kMembersRevision) w.put(r.members_revision);
  if (r.op == Op::put) {
    w.put(r.total), w.put(r.checksum), w.put(r.version);
    put_parts_table(w, std::span(r.parts).first(std::min(r.parts.size(), kMaxObjectParts)));
  }
  if (r.op == Op::get) w.put(r.range_offset), w.put(r.range_length);
  if (r.op == Op::touch) w.put(r.total), w.put(r.checksum), w.put(r.version);
  if (r.op == Op::remove && (r.flags & kRemoveUpTo)) w.put(r.version);
  if (r.op == Op::remove && (r.flags & kRemoveBatch)) w.put(r.total), w.put(r.checksum);
  if (has_context(r.op)) w.put_str8(r.context);
  if (r.op == Op::usage) w.put_str8(r.context), w.put_str8(r.after);
  if (r.op == Op::auth) {
    w.put_str8(r.name_space);
    w.put_bytes(r.mac.data(), r.mac.size());
  }
  return std::move(w.out);
}

Result<Request> decode_request(std::span<const std::byte> header) {
  Reader rd(header);
  Request r;
  const uint32_t magic = rd.get<uint32_t>();
  const uint8_t version = rd.get<uint8_t>(), op = rd.get<uint8_t>();
  r.flags = rd.get<uint16_t>();
  r.id = rd.get<uint64_t>(), r.chunk = rd.get<uint32_t>(), r.level = rd.get<uint32_t>();
  if (!rd.ok() || magic != kRequestMagic)
    return detail::unlogged_status(StatusCode::corrupt_data, "not a kvstream request");
  if (version != kVersion) return version_error("the client", version);
  if (!op_valid(op) || Op(op) == Op::hello)
    return detail::unlogged_status(StatusCode::corrupt_data, "request op {}", op);
  r.op = Op(op);
  // The op's own flag (one at most), and the member-set revision beside it on any
  // request that is not part of the login or a body segment.
  const uint16_t own = r.flags & ~kMembersRevision;
  const bool members = (r.flags & kMembersRevision) && r.op != Op::auth && r.op != Op::data;
  if ((r.flags & kMembersRevision && !members) ||
      (own != 0 && !(r.op == Op::stat && own == kStatVersions) &&
       !(r.op == Op::remove && (own == kRemoveUpTo || own == kRemoveBatch))))
    return detail::unlogged_status(StatusCode::corrupt_data, "request flags {:#x} on op {}", r.flags, op);
  if (members) {
    r.members_revision = rd.get<int64_t>();
    if (rd.ok() && r.members_revision <= 0)
      return detail::unlogged_status(StatusCode::corrupt_data, "member-set revision {}", r.members_revision);
  }
  bool parts_ok = true;
  if (r.op == Op::put) {
    r.total = rd.get<uint64_t>(), r.checksum = rd.get<uint64_t>(), r.version = rd.get<uint64_t>();
    parts_ok = get_parts_table(rd, r.parts);
  }
  if (r.op == Op::get) r.range_offset = rd.get<uint64_t>(), r.range_length = rd.get<uint64_t>();
  if (r.op == Op::touch) r.total = rd.get<uint64_t>(), r.checksum = rd.get<uint64_t>(), r.version = rd.get<uint64_t>();
  if (r.op == Op::remove && (r.flags & kRemoveUpTo)) r.version = rd.get<uint64_t>();
  if (r.op == Op::remove && (r.flags & kRemoveBatch)) r.total = rd.get<uint64_t>(), r.checksum = rd.get<uint64_t>();
  if (has_context(r.op) || r.op == Op::usage) {
    const uint8_t n = rd.get<uint8_t>();
    r.context = rd.get_str(n, kMaxContextBytes);
  }
  if (r.op == Op::usage) {
    const uint8_t n = rd.get<uint8_t>();
    r.after = rd.get_str(n, kMaxContextBytes);
  }
  if (r.op == Op::auth) {
    const uint8_t n = rd.get<uint8_t>();
    r.name_space = rd.get_str(n, kMaxNamespaceBytes);
    rd.get_bytes(r.mac.data(), r.mac.size());
  }
  if (!parts_ok || !rd.done()) return detail::unlogged_status(StatusCode::corrupt_data, "malformed request header");
  if (r.total > kMaxChunkBytes)
    return make_status(StatusCode::out_of_range, "body of {} bytes (limit {})", r.total, kMaxChunkBytes);
  if (r.op == Op::touch && (r.total == 0 || r.total > kMaxTouchBodyBytes))
    return detail::unlogged_status(StatusCode::corrupt_data, "touch with a body of {} bytes (1..{})", r.total,
                                   kMaxTouchBodyBytes);
  if (r.op == Op::remove && (r.flags & kRemoveBatch) &&
      (r.total == 0 || r.total > kMaxRemoveBatchBytes || !r.context.empty()))
    return detail::unlogged_status(StatusCode::corrupt_data,
                                   "batch of removes with a body of {} bytes (1..{}) and a context of {}", r.total,
                                   kMaxRemoveBatchBytes, r.context.size());
  if (r.op == Op::usage && (r.chunk == 0 || r.chunk > kMaxUsagePage))
    return detail::unlogged_status(StatusCode::corrupt_data, "usage page of {} entries (1..{})", r.chunk,
                                   kMaxUsagePage);
  if (Status s = validate_parts(r.parts, r.total); !s.ok())
    return detail::unlogged_status(StatusCode::corrupt_data, "put with a bad parts table: {}", s.message());
  if (r.range_length == 0 && r.range_offset != 0)
    return detail::unlogged_status(StatusCode::corrupt_data, "range at byte {} of no length", r.range_offset);
  if (r.range_offset > kMaxChunkBytes || r.range_length > kMaxChunkBytes - r.range_offset)
    return make_status(StatusCode::out_of_range, "range [{}, +{}) past the largest object ({} bytes)", r.range_offset,
                       r.range_length, kMaxChunkBytes);
  if (r.level >= kMaxLevels) return make_status(StatusCode::out_of_range, "level {} (limit {})", r.level, kMaxLevels);
  if (r.chunk >= kMaxChunksPerContext)
    return make_status(StatusCode::out_of_range, "chunk {} (limit {})", r.chunk, kMaxChunksPerContext);
  if (has_context(r.op) && !(r.op == Op::remove && (r.flags & kRemoveBatch)))
    KVS_RETURN_IF_ERROR(validate_id(r.context, kMaxContextBytes, "context id"));
  // A prefix or a name to list after need not be a whole id ("model." is a prefix of
  // every id of that model), but it holds only the ids' characters.
  if (r.op == Op::usage)
    for (const std::string* part : {&r.context, &r.after})
      if (!part->empty()) KVS_RETURN_IF_ERROR(validate_id(*part, kMaxContextBytes, "usage prefix or start"));
  if (r.op == Op::auth) KVS_RETURN_IF_ERROR(validate_id(r.name_space, kMaxNamespaceBytes, "namespace"));
  return r;
}

std::vector<std::byte> encode(const Response& r) {
  Writer w;
  const WireCode wire = to_wire(r.code);
  const uint8_t detail = uint8_t(wire.detail) | (r.members_newer ? kDetailMembersNewer : 0);
  w.put(kResponseMagic), w.put(kVersion), w.put(uint8_t(r.op)), w.put(uint8_t(wire.code)), w.put(detail);
  w.put(r.id), w.put(r.op == Op::hello ? r.features : r.checksum), w.put(r.total);
  std::string msg = r.message.substr(0, kMaxMessageBytes);
  w.put_str16(msg);
  if (r.op == Op::hello) w.put_bytes(r.nonce.data(), r.nonce.size());
  return std::move(w.out);
}

Result<Response> decode_response(std::span<const std::byte> header) {
  Reader rd(header);
  Response r;
  const uint32_t magic = rd.get<uint32_t>();
  const uint8_t version = rd.get<uint8_t>(), op = rd.get<uint8_t>(), code = rd.get<uint8_t>();
  const uint8_t detail = rd.get<uint8_t>();
  r.id = rd.get<uint64_t>(), r.checksum = rd.get<uint64_t>(), r.total = rd.get<uint64_t>();
  const uint16_t n = rd.get<uint16_t>();
  r.message = rd.get_str(n, kMaxMessageBytes);
  if (!rd.ok() || magic != kResponseMagic) return make_status(StatusCode::corrupt_data, "not a kvstream response");
  if (version != kVersion) return version_error("the storage node", version);
  auto api_code = from_wire(code, detail & ~kDetailMembersNewer);
  r.members_newer = detail & kDetailMembersNewer;
  if (!op_valid(op) || !api_code.ok())
    return make_status(StatusCode::corrupt_data, "response op {} code {}", op, code);
  r.op = Op(op);
  r.code = *api_code;
  if (r.op == Op::hello) {
    rd.get_bytes(r.nonce.data(), r.nonce.size());
    r.features = std::exchange(r.checksum, 0);
  }
  if (!rd.done()) return make_status(StatusCode::corrupt_data, "malformed response header");
  if (r.total > kMaxChunkBytes) return make_status(StatusCode::corrupt_data, "response body of {} bytes", r.total);
  return r;
}

std::vector<std::byte> encode_stats(const std::vector<ChunkStat>& stats, bool versions) {
  Writer w;
  w.put(uint32_t(stats.size()));
  for (const ChunkStat& s : stats) {
    w.put(s.chunk), w.put(uint8_t(s.level_bytes.size()));
    for (uint64_t b : s.level_bytes) w.put(b);
    for (size_t l = 0; l < s.level_bytes.size(); ++l) {
      const std::span<const ObjectPart> parts =
          l < s.level_parts.size() ? std::span<const ObjectPart>(s.level_parts[l]) : std::span<const ObjectPart>();
      put_parts_table(w, parts.first(std::min(parts.size(), kMaxObjectParts)));
    }
    if (versions)
      for (size_t l = 0; l < s.level_bytes.size(); ++l) w.put(l < s.level_versions.size() ? s.level_versions[l] : 0);
  }
  return std::move(w.out);
}

Result<std::vector<ChunkStat>> decode_stats(std::span<const std::byte> body, bool versions) {
  Reader rd(body);
  const uint32_t n = rd.get<uint32_t>();
  if (!rd.ok() || n > kMaxChunksPerContext || n > body.size() / 5)
    return make_status(StatusCode::corrupt_data, "stat body: {} chunks", n);
  std::vector<ChunkStat> out(n);
  for (ChunkStat& s : out) {
    s.chunk = rd.get<uint32_t>();
    const uint8_t levels = rd.get<uint8_t>();
    if (levels > kMaxLevels) return make_status(StatusCode::corrupt_data, "stat body: {} levels", levels);
    s.level_bytes.resize(levels);
    for (uint64_t& b : s.level_bytes) {
      b = rd.get<uint64_t>();
      if (b > kMaxChunkBytes) return make_status(StatusCode::corrupt_data, "stat body: level of {} bytes", b);
    }
    s.level_parts.resize(levels);
    for (uint8_t l = 0; l < levels; ++l) {
      if (!get_parts_table(rd, s.level_parts[l]))
        return make_status(StatusCode::corrupt_data, "stat body: chunk {} level {}: malformed parts table", s.chunk, l);
      if (Status v = validate_parts(s.level_parts[l], s.level_bytes[l]); !v.ok())
        return make_status(StatusCode::corrupt_data, "stat body: chunk {} level {}: {}", s.chunk, l, v.message());
    }
    trim_level_parts(s.level_parts);
    if (versions) {
      s.level_versions.resize(levels);
      for (uint64_t& v : s.level_versions) v = rd.get<uint64_t>();
    }
  }
  if (!rd.done()) return make_status(StatusCode::corrupt_data, "malformed stat body");
  return out;
}

namespace {

// The bodies that list contexts, each after a number of its own (a touch's depths, a
// batch of removes' versions): u32 n, then per context the number, u8 length, bytes.
template <typename T, typename N>
std::vector<std::byte> encode_context_list(std::span<const T> items, N T::*number) {
  Writer w;
  w.put(uint32_t(items.size()));
  for (const T& item : items) w.put(item.*number), w.put_str8(item.context);
  return std::move(w.out);
}

// `what` names the body in errors, `id_what` its context ids; `check` looks at each
// entry before its id is validated.
template <typename T, typename N, typename Check>
Result<std::vector<T>> decode_context_list(std::span<const std::byte> body, N T::*number, std::string_view what,
                                           std::string_view id_what, Check check) {
  Reader rd(body);
  const uint32_t n = rd.get<uint32_t>();
  // Each entry takes at least its number, a length and one byte.
  if (!rd.ok() || n == 0 || n > body.size() / (sizeof(N) + 2))
    return make_status(StatusCode::corrupt_data, "{}: {} contexts", what, n);
  std::vector<T> out(n);
  for (T& item : out) {
    item.*number = rd.get<N>();
    const uint8_t len = rd.get<uint8_t>();
    item.context = rd.get_str(len, kMaxContextBytes);
    if (!rd.ok()) break;
    KVS_RETURN_IF_ERROR(check(item));
    KVS_RETURN_IF_ERROR(validate_id(item.context, kMaxContextBytes, id_what));
  }
  if (!rd.done()) return make_status(StatusCode::corrupt_data, "malformed {}", what);
  return out;
}

}  // namespace

std::vector<std::byte> encode_touches(std::span<const ContextTouch> touches) {
  return encode_context_list(touches, &ContextTouch::depth);
}

Result<std::vector<ContextTouch>> decode_touches(std::span<const std::byte> body) {
  return decode_context_list(body, &ContextTouch::depth, "touch body", "touched context id",
                             [](const ContextTouch&) { return Status{}; });
}

std::vector<std::byte> encode_removes(std::span<const ContextRemove> removes) {
  return encode_context_list(removes, &ContextRemove::version);
}

Result<std::vector<ContextRemove>> decode_removes(std::span<const std::byte> body) {
  return decode_context_list(body, &ContextRemove::version, "batch of removes", "removed context id",
                             [](const ContextRemove& r) {
                               return r.version != 0 ? Status{}
                                                     : make_status(StatusCode::corrupt_data,
                                                                   "a remove of '{}' up to version 0", r.context);
                             });
}

std::vector<std::byte> encode_usage(const std::vector<ContextUsage>& usage) {
  Writer w;
  w.put(uint32_t(usage.size()));
  for (const ContextUsage& u : usage) {
    w.put_str8(u.context);
    w.put(u.bytes), w.put(u.written), w.put(u.used), w.put(u.depth);
    w.put(uint32_t(u.chunks.size()));
    for (uint32_t c : u.chunks) w.put(c);
  }
  return std::move(w.out);
}

Result<std::vector<ContextUsage>> decode_usage(std::span<const std::byte> body) {
  Reader rd(body);
  const uint32_t n = rd.get<uint32_t>();
  // Each entry takes at least 34 bytes (a 1-byte name, no chunks).
  if (!rd.ok() || n > kMaxUsagePage || n > body.size() / 34)
    return make_status(StatusCode::corrupt_data, "usage body: {} contexts", n);
  std::vector<ContextUsage> out(n);
  for (ContextUsage& u : out) {
    const uint8_t len = rd.get<uint8_t>();
    u.context = rd.get_str(len, kMaxContextBytes);
    u.bytes = rd.get<uint64_t>(), u.written = rd.get<uint64_t>(), u.used = rd.get<uint64_t>();
    u.depth = rd.get<uint32_t>();
    const uint32_t chunks = rd.get<uint32_t>();
    if (!rd.ok() || chunks > kMaxChunksPerContext || chunks > body.size() / 4)
      return make_status(StatusCode::corrupt_data, "malformed usage body");
    KVS_RETURN_IF_ERROR(validate_id(u.context, kMaxContextBytes, "listed context id"));
    u.chunks.resize(chunks);
    for (uint32_t& c : u.chunks) c = rd.get<uint32_t>();
    if (!rd.ok() || !std::is_sorted(u.chunks.begin(), u.chunks.end()) ||
        std::adjacent_find(u.chunks.begin(), u.chunks.end()) != u.chunks.end() ||
        (!u.chunks.empty() && u.chunks.back() >= kMaxChunksPerContext))
      return make_status(StatusCode::corrupt_data, "usage body: context '{}': malformed chunk list", u.context);
  }
  if (!rd.done()) return make_status(StatusCode::corrupt_data, "malformed usage body");
  for (size_t i = 1; i < out.size(); ++i)
    if (!(out[i - 1].context < out[i].context))
      return make_status(StatusCode::corrupt_data, "usage body: contexts out of order at '{}'", out[i].context);
  return out;
}

std::vector<std::byte> encode_names(const std::vector<std::string>& names) {
  Writer w;
  w.put(uint32_t(names.size()));
  for (const std::string& s : names) w.put_str8(s);
  return std::move(w.out);
}

Result<std::vector<std::string>> decode_names(std::span<const std::byte> body) {
  Reader rd(body);
  const uint32_t n = rd.get<uint32_t>();
  if (!rd.ok() || n > body.size()) return make_status(StatusCode::corrupt_data, "list body: {} names", n);
  std::vector<std::string> out(n);
  for (std::string& s : out) {
    const uint8_t len = rd.get<uint8_t>();
    s = rd.get_str(len, kMaxContextBytes);
    if (rd.ok()) KVS_RETURN_IF_ERROR(validate_id(s, kMaxContextBytes, "listed context id"));
  }
  if (!rd.done()) return make_status(StatusCode::corrupt_data, "malformed list body");
  return out;
}

std::vector<std::byte> data_request_header(uint64_t id, uint32_t index) {
  Request d;
  d.op = Op::data, d.id = id, d.chunk = index;
  return encode(d);
}

std::vector<std::byte> data_response_header(uint64_t id) {
  Response d;
  d.op = Op::data, d.id = id;
  return encode(d);
}

uint64_t next_write_version() {
  static std::atomic<uint64_t> last{0};
  const uint64_t now = uint64_t(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  uint64_t prev = last.load(std::memory_order_relaxed), next;
  do next = std::max(now, prev + 1);
  while (!last.compare_exchange_weak(prev, next, std::memory_order_relaxed));
  return next;
}

uint64_t body_checksum(std::span<const std::byte> body) { return XXH3_64bits(body.data(), body.size()); }

std::array<uint8_t, kMacBytes> auth_mac(const std::string& secret, std::span<const uint8_t> nonce,
                                        const std::string& name_space) {
  std::vector<uint8_t> msg(nonce.begin(), nonce.end());
  msg.insert(msg.end(), name_space.begin(), name_space.end());
  std::array<uint8_t, kMacBytes> mac{};
  unsigned len = 0;
  HMAC(EVP_sha256(), secret.data(), int(secret.size()), msg.data(), msg.size(), mac.data(), &len);
  return mac;
}

Result<std::array<uint8_t, kNonceBytes>> make_nonce() {
  std::array<uint8_t, kNonceBytes> n{};
  if (RAND_bytes(n.data(), int(n.size())) != 1)
    return make_status(StatusCode::internal, "no randomness for the authentication nonce");
  return n;
}

uint64_t first_request_id(std::span<const uint8_t> nonce) {
  constexpr uint64_t kHalf = uint64_t(1) << 63;
  return kHalf + XXH3_64bits(nonce.data(), nonce.size()) % (kHalf - kRequestIdWindow);
}

bool mac_equal(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace kvstream::storage
