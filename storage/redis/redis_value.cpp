#include "storage/redis/redis_value.hpp"

#include <charconv>
#include <cstring>

#include <fmt/format.h>
#include <xxhash.h>

#include "storage/protocol.hpp"

namespace kvstream::redis::detail {

namespace {

// A value's checksum is seeded with its key, so a value copied or renamed to another
// key (another chunk or level) fails it, as the node's object headers do.
uint64_t bound_checksum(const std::string& key, std::span<const std::byte> payload) {
  return XXH3_64bits_withSeed(payload.data(), payload.size(), XXH3_64bits(key.data(), key.size()));
}
// Block i's sum is seeded with the key and i, so a block moved within a value, or a
// table copied to another key, fails it.
uint64_t block_checksum(uint64_t key_seed, uint64_t i, std::span<const std::byte> block) {
  return XXH3_64bits_withSeed(block.data(), block.size(), key_seed + i);
}
uint64_t load_le64(const char* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8; ++i) v |= uint64_t(uint8_t(p[i])) << (8 * i);
  return v;
}
void store_le64(char* p, uint64_t v) {
  for (size_t i = 0; i < 8; ++i) p[i] = char(uint8_t(v >> (8 * i)));
}
template <typename T>
bool parse_uint(std::string_view s, T& v) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}
bool parse_field(std::string_view f, uint32_t& chunk, uint32_t& level) {
  const size_t colon = f.find(':');
  return colon != std::string_view::npos && parse_uint(f.substr(0, colon), chunk) &&
         parse_uint(f.substr(colon + 1), level) && level < storage::kMaxLevels;
}
Status sealed_without_key(const std::string& key) {
  return make_status(StatusCode::permission_denied,
                     "{} is encrypted at rest: this client has no key file (RedisConfig::at_rest.key_file)", key);
}
Status clear_refused(const std::string& key) {
  return make_status(StatusCode::corrupt_data,
                     "{} is stored in clear, and this client reads sealed values only "
                     "(RedisConfig::read_clear_values)",
                     key);
}

}  // namespace

Result<EncodedValue> encode_value(const std::string& key, std::span<const std::byte> bytes, const Sealer* sealer) {
  if (sealer) {
    KVS_ASSIGN_OR_RETURN(std::string sealed, sealer->seal(key, bytes));
    return EncodedValue{std::make_shared<const std::string>(std::move(sealed)), nullptr};
  }
  auto value = std::make_shared<std::string>(kChecksumBytes + bytes.size(), '\0');
  store_le64(value->data(), bound_checksum(key, bytes));
  if (!bytes.empty()) std::memcpy(value->data() + kChecksumBytes, bytes.data(), bytes.size());
  const uint64_t blocks = (bytes.size() + kBlockBytes - 1) / kBlockBytes, seed = XXH3_64bits(key.data(), key.size());
  auto sums = std::make_shared<std::string>(blocks * 8, '\0');
  for (uint64_t i = 0; i < blocks; ++i)
    store_le64(sums->data() + i * 8,
               block_checksum(seed, i,
                              bytes.subspan(i * kBlockBytes, std::min(kBlockBytes, bytes.size() - i * kBlockBytes))));
  return EncodedValue{std::move(value), std::move(sums)};
}

Command sums_command(const EncodedValue& v, const std::string& blocks_key) {
  return v.sums ? Command{"SET", blocks_key, *v.sums} : Command{"DEL", blocks_key};
}

Result<std::span<const std::byte>> verified_payload(const std::string& key, redisReply* r, const Sealer* sealer) {
  if (r->type == REDIS_REPLY_NIL) return make_status(StatusCode::not_found, "no object {}", key);
  if (r->type != REDIS_REPLY_STRING) {
    Status e = reply_error(r, "get");
    return e.ok() ? make_status(StatusCode::corrupt_data, "{} is not a chunk (reply type {})", key, r->type) : e;
  }
  if (Sealer::is_sealed(reply_str(r))) {
    if (!sealer) return sealed_without_key(key);
    return sealer->open(key, std::span(reinterpret_cast<std::byte*>(r->str), size_t(r->len)));
  }
  if (sealer && !sealer->read_clear()) return clear_refused(key);
  if (size_t(r->len) < kChecksumBytes)
    return make_status(StatusCode::corrupt_data, "{} is {} bytes, shorter than its checksum", key, r->len);
  const auto* p = reinterpret_cast<const std::byte*>(r->str);
  const std::span<const std::byte> payload(p + kChecksumBytes, size_t(r->len) - kChecksumBytes);
  if (bound_checksum(key, payload) != load_le64(r->str))
    return make_status(StatusCode::corrupt_data, "{} failed its checksum", key);
  return payload;
}

namespace {

// A range of a clear value (read_range without a sealer, or a value stored before
// encryption was turned on).
Result<RangeRead> read_clear_range(const Runner& run, const std::string& key, const std::string& blocks_key,
                                   uint64_t offset, uint64_t length, const Sealer* sealer) {
  const uint64_t b0 = offset / kBlockBytes, b1 = (offset + length + kBlockBytes - 1) / kBlockBytes;
  const std::string from = std::to_string(kChecksumBytes + b0 * kBlockBytes),
                    to = std::to_string(kChecksumBytes + b1 * kBlockBytes - 1), sums_from = std::to_string(b0 * 8),
                    sums_to = std::to_string(b1 * 8 - 1);
  KVS_ASSIGN_OR_RETURN(auto rs, run({{"MULTI"},
                                     {"STRLEN", key},
                                     {"GETRANGE", key, from, to},
                                     {"GETRANGE", blocks_key, sums_from, sums_to},
                                     {"STRLEN", blocks_key},
                                     {"EXEC"}}));
  for (auto& x : rs) KVS_RETURN_IF_ERROR(reply_error(x.get(), "get range"));
  const redisReply* e = rs[5].get();
  if (e->type != REDIS_REPLY_ARRAY || e->elements != 4)
    return make_status(StatusCode::unavailable, "redis range transaction was aborted");
  for (size_t i = 0; i < 4; ++i) {
    Status s = reply_error(e->element[i], "get range");
    if (!s.ok()) return make_status(StatusCode::corrupt_data, "{} is not a chunk: {}", key, s.message());
  }
  if (e->element[0]->type != REDIS_REPLY_INTEGER || e->element[3]->type != REDIS_REPLY_INTEGER ||
      e->element[1]->type != REDIS_REPLY_STRING || e->element[2]->type != REDIS_REPLY_STRING)
    return make_status(StatusCode::corrupt_data, "{} is not a chunk", key);
  const long long stored = e->element[0]->integer;
  if (stored == 0) return make_status(StatusCode::not_found, "no object {}", key);
  if (stored < (long long)kChecksumBytes)
    return make_status(StatusCode::corrupt_data, "{} is {} bytes, shorter than its checksum", key, stored);
  const uint64_t size = uint64_t(stored) - kChecksumBytes;
  if (offset > size || length > size - offset)
    return make_status(StatusCode::out_of_range, "range [{}, {}) ends past the end of {} ({} bytes)", offset,
                       offset + length, key, size);
  const uint64_t blocks = (size + kBlockBytes - 1) / kBlockBytes;
  if (e->element[3]->integer == 0) {
    // No block sums: the whole value, under its own checksum.
    KVS_ASSIGN_OR_RETURN(auto whole, run({{"GET", key}}));
    KVS_ASSIGN_OR_RETURN(auto payload, verified_payload(key, whole[0].get(), sealer));
    if (offset > payload.size() || length > payload.size() - offset)  // replaced since
      return make_status(StatusCode::out_of_range, "range [{}, {}) ends past the end of {} ({} bytes)", offset,
                         offset + length, key, payload.size());
    return RangeRead{std::move(whole[0]), payload.subspan(offset, length)};
  }
  if (uint64_t(e->element[3]->integer) != blocks * 8)
    return make_status(StatusCode::corrupt_data, "{}: {} bytes of block sums for {} blocks", key,
                       e->element[3]->integer, blocks);
  const redisReply* data = e->element[1];
  const redisReply* sums = e->element[2];
  const uint64_t first = b0 * kBlockBytes, data_bytes = std::min(b1 * kBlockBytes, size) - first;
  if (uint64_t(data->len) != data_bytes || uint64_t(sums->len) != (b1 - b0) * 8)
    return make_status(StatusCode::corrupt_data, "{}: a range read returned {} bytes and {} sums", key, data->len,
                       sums->len);
  const auto* p = reinterpret_cast<const std::byte*>(data->str);
  const uint64_t seed = XXH3_64bits(key.data(), key.size());
  for (uint64_t i = b0; i < b1; ++i) {
    const uint64_t at = (i - b0) * kBlockBytes, n = std::min(kBlockBytes, data_bytes - at);
    if (block_checksum(seed, i, std::span(p + at, n)) != load_le64(sums->str + (i - b0) * 8))
      return make_status(StatusCode::corrupt_data, "{} failed its checksum (block {})", key, i);
  }
  return RangeRead{std::move(rs[5]), std::span<const std::byte>(p + (offset - first), length)};
}

// A range of a sealed value: its length, header and the sealed blocks the range
// crosses in one MULTI/EXEC, then those blocks opened in place.
Result<RangeRead> read_sealed_range(const Runner& run, const std::string& key, const std::string& blocks_key,
                                    uint64_t offset, uint64_t length, const Sealer& sealer) {
  const uint64_t b0 = offset / kBlockBytes, b1 = (offset + length + kBlockBytes - 1) / kBlockBytes;
  const std::string head_to = std::to_string(Sealer::kHeaderBytes - 1), from = std::to_string(Sealer::block_offset(b0)),
                    to = std::to_string(Sealer::block_offset(b1) - 1);
  KVS_ASSIGN_OR_RETURN(auto rs, run({{"MULTI"},
                                     {"STRLEN", key},
                                     {"GETRANGE", key, "0", head_to},
                                     {"GETRANGE", key, from, to},
                                     {"EXEC"}}));
  for (auto& x : rs) KVS_RETURN_IF_ERROR(reply_error(x.get(), "get range"));
  redisReply* e = rs[4].get();
  if (e->type != REDIS_REPLY_ARRAY || e->elements != 3)
    return make_status(StatusCode::unavailable, "redis range transaction was aborted");
  for (size_t i = 0; i < 3; ++i) {
    Status s = reply_error(e->element[i], "get range");
    if (!s.ok()) return make_status(StatusCode::corrupt_data, "{} is not a chunk: {}", key, s.message());
  }
  if (e->element[0]->type != REDIS_REPLY_INTEGER || e->element[1]->type != REDIS_REPLY_STRING ||
      e->element[2]->type != REDIS_REPLY_STRING)
    return make_status(StatusCode::corrupt_data, "{} is not a chunk", key);
  const long long stored = e->element[0]->integer;
  if (stored == 0) return make_status(StatusCode::not_found, "no object {}", key);
  const std::string_view head = reply_str(e->element[1]);
  if (!Sealer::is_sealed(head)) {
    if (!sealer.read_clear()) return clear_refused(key);
    return read_clear_range(run, key, blocks_key, offset, length, &sealer);  // stored before encryption
  }
  KVS_ASSIGN_OR_RETURN(const uint64_t size, Sealer::payload_size(uint64_t(stored)));
  if (offset > size || length > size - offset)
    return make_status(StatusCode::out_of_range, "range [{}, {}) ends past the end of {} ({} bytes)", offset,
                       offset + length, key, size);
  redisReply* data = e->element[2];
  const uint64_t want = std::min<uint64_t>(Sealer::block_offset(b1), uint64_t(stored)) - Sealer::block_offset(b0);
  if (uint64_t(data->len) != want)
    return make_status(StatusCode::corrupt_data, "{}: a range read returned {} bytes of {}", key, data->len, want);
  KVS_ASSIGN_OR_RETURN(auto plain, sealer.open_blocks(key, head, size, b0,
                                                      std::span(reinterpret_cast<std::byte*>(data->str), want)));
  return RangeRead{std::move(rs[4]), plain.subspan(offset - b0 * kBlockBytes, length)};
}

}  // namespace

Result<RangeRead> read_range(const Runner& run, const std::string& key, const std::string& blocks_key,
                             uint64_t offset, uint64_t length, const Sealer* sealer) {
  return sealer ? read_sealed_range(run, key, blocks_key, offset, length, *sealer)
                : read_clear_range(run, key, blocks_key, offset, length, nullptr);
}

std::string object_field(uint32_t chunk, uint32_t level) { return fmt::format("{}:{}", chunk, level); }

Status merge_stat_tables(const redisReply* r, const std::string& sizes, const redisReply* p,
                         const std::string& parts_hash, std::map<uint32_t, storage::ChunkStat>& m) {
  KVS_RETURN_IF_ERROR(reply_error(r, "stat"));
  KVS_RETURN_IF_ERROR(reply_error(p, "stat"));
  if (r->type != REDIS_REPLY_ARRAY || r->elements % 2)
    return make_status(StatusCode::corrupt_data, "{} is not a size table", sizes);
  if (p->type != REDIS_REPLY_ARRAY || p->elements % 2)
    return make_status(StatusCode::corrupt_data, "{} is not a parts table", parts_hash);
  for (size_t i = 0; i < r->elements; i += 2) {
    uint32_t chunk = 0, level = 0;
    uint64_t bytes = 0;
    const std::string_view fs = reply_str(r->element[i]), vs = reply_str(r->element[i + 1]);
    if (!parse_field(fs, chunk, level) || !parse_uint(vs, bytes) || bytes > storage::kMaxChunkBytes)
      return make_status(StatusCode::corrupt_data, "{} has a bad entry '{}' = '{}'", sizes, fs, vs);
    auto& sz = m[chunk].level_bytes;
    m[chunk].chunk = chunk;
    if (sz.size() <= level) sz.resize(level + 1, 0);
    sz[level] = bytes;
  }
  for (size_t i = 0; i < p->elements; i += 2) {
    uint32_t chunk = 0, level = 0;
    const std::string_view fs = reply_str(p->element[i]), vs = reply_str(p->element[i + 1]);
    std::map<uint32_t, storage::ChunkStat>::iterator it;
    if (!parse_field(fs, chunk, level) || (it = m.find(chunk)) == m.end() || it->second.level_bytes.size() <= level)
      return make_status(StatusCode::corrupt_data, "{} has parts of an object not stored: '{}'", parts_hash, fs);
    auto parts = storage::decode_parts(std::as_bytes(std::span(vs.data(), vs.size())));
    Status valid = parts.ok() ? storage::validate_parts(*parts, it->second.level_bytes[level]) : parts.status();
    if (!valid.ok())
      return make_status(StatusCode::corrupt_data, "{}: the parts of '{}': {}", parts_hash, fs, valid.message());
    auto& lp = it->second.level_parts;
    if (lp.size() <= level) lp.resize(level + 1);
    lp[level] = std::move(parts).value();
  }
  return {};
}

std::vector<storage::ChunkStat> finish_stats(std::map<uint32_t, storage::ChunkStat>&& m) {
  std::vector<storage::ChunkStat> out;
  for (auto& [chunk, st] : m) {
    storage::trim_level_parts(st.level_parts);
    out.push_back(std::move(st));
  }
  return out;
}

}  // namespace kvstream::redis::detail
