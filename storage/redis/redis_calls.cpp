#include "storage/redis/redis_calls.hpp"

#include <algorithm>
#include <cstring>

#include "storage/protocol.hpp"
#include "transport/common/registration.hpp"

namespace kvstream::redis::detail {

namespace {
struct HostRegion final : transport::MemoryRegion::Impl {};
}  // namespace

const transport::Capabilities& redis_capabilities(bool cluster) {
  static const auto make = [](const char* backend) {
    return transport::Capabilities{.backend = backend,
                                   .provider = "RESP on a socket, clear or TLS (hiredis' parser)",
                                   .host_memory = true,
                                   .cuda_memory = false,
                                   .one_sided_read = false,
                                   .notifications = false,
                                   .max_message_bytes = storage::kMaxChunkBytes};
  };
  static const transport::Capabilities single = make("redis"), many = make("redis-cluster");
  return cluster ? many : single;
}

Status RedisClientBase::check_common(const RedisConfig& cfg) {
  KVS_RETURN_IF_ERROR(storage::validate_id(cfg.name_space, storage::kMaxNamespaceBytes, "namespace"));
  if (cfg.connections == 0 || cfg.connections > 64)
    return make_status(StatusCode::invalid_argument, "{} redis connections (1..64)", cfg.connections);
  return {};
}

Result<ClientSecurity> make_security(const RedisConfig& cfg) {
  ClientSecurity out;
  if (cfg.tls.enabled) {
    if (cfg.address.rfind("unix:", 0) == 0)
      return make_status(StatusCode::invalid_argument,
                         "redis: TLS was asked for with a Unix socket address ({}); Redis serves TLS on TCP only",
                         cfg.address);
    KVS_ASSIGN_OR_RETURN(out.tls, security::TlsContext::create(cfg.tls, security::TlsRole::client));
  }
  KVS_ASSIGN_OR_RETURN(out.sealer, Sealer::create(cfg.at_rest, cfg.name_space, cfg.read_clear_values));
  return out;
}

std::string ClientSecurity::describe() const {
  std::string d;
  if (tls) {
    const TlsSettings& t = tls->settings();
    d += fmt::format(", TLS (trusting {}{})", t.ca_file.empty() ? "the system's CAs" : t.ca_file,
                     t.cert_file.empty() ? "" : ", client certificate " + t.cert_file);
  }
  if (sealer)
    d += fmt::format(", values sealed at rest under key id {}{}", sealer->current_id(),
                     sealer->read_clear() ? "" : ", clear values refused");
  return d;
}

Result<transport::MemoryRegion> register_host_memory(void* data, size_t size, transport::MemoryType type) {
  if (type != transport::MemoryType::host)
    return make_status(StatusCode::unsupported,
                       "redis: values are copied through host memory, so a {} destination cannot be registered",
                       transport::memory_type_name(type));
  if (data == nullptr || size == 0)
    return make_status(StatusCode::invalid_argument, "register_memory: empty range (data {}, size {})", data, size);
  auto r = std::make_shared<HostRegion>();
  r->data = static_cast<std::byte*>(data), r->size = size, r->type = transport::MemoryType::host;
  return transport::RegionAccess::wrap(std::move(r));
}

Status validate_put(const std::string& context, uint32_t level, std::span<const std::byte> bytes,
                    std::span<const storage::ObjectPart> parts) {
  KVS_RETURN_IF_ERROR(storage::validate_id(context, storage::kMaxContextBytes, "context id"));
  if (level >= storage::kMaxLevels || bytes.size() > storage::kMaxChunkBytes)
    return make_status(StatusCode::out_of_range, "level {} / {} bytes beyond the store's bounds", level, bytes.size());
  return storage::validate_parts(parts, bytes.size());
}

Status validate_get(const std::string& context, uint32_t level, const transport::MemoryRegion& dest, size_t offset,
                    size_t capacity) {
  KVS_RETURN_IF_ERROR(storage::validate_id(context, storage::kMaxContextBytes, "context id"));
  if (level >= storage::kMaxLevels) return make_status(StatusCode::out_of_range, "level {}", level);
  if (dest.span(offset, capacity).size() != capacity || (capacity > 0 && !dest.valid()))
    return make_status(StatusCode::invalid_argument, "destination [{}, {}) is outside its registered region", offset,
                       offset + capacity);
  return {};
}

Status validate_get_range(const std::string& context, uint32_t level, uint64_t offset, uint64_t length,
                          const transport::MemoryRegion& dest, size_t dest_offset) {
  KVS_RETURN_IF_ERROR(storage::validate_id(context, storage::kMaxContextBytes, "context id"));
  if (level >= storage::kMaxLevels) return make_status(StatusCode::out_of_range, "level {}", level);
  if (length == 0) return make_status(StatusCode::invalid_argument, "a range of 0 bytes");
  if (offset > storage::kMaxChunkBytes || length > storage::kMaxChunkBytes - offset)
    return make_status(StatusCode::out_of_range, "range [{}, +{}) past the largest object ({} bytes)", offset, length,
                       storage::kMaxChunkBytes);
  if (!dest.valid() || dest.span(dest_offset, length).size() != length)
    return make_status(StatusCode::invalid_argument, "destination [{}, {}) is outside its registered region",
                       dest_offset, dest_offset + length);
  return {};
}

std::string blocks_key(const std::string& chunk_key) { return chunk_key + ":blocks"; }

Status check_exec(const std::vector<Reply>& rs, size_t n, std::string_view what) {
  for (auto& x : rs) KVS_RETURN_IF_ERROR(reply_error(x.get(), what));
  const redisReply* e = rs.back().get();
  if (e->type != REDIS_REPLY_ARRAY || e->elements != n)
    return make_status(StatusCode::unavailable, "redis {} transaction was aborted", what);
  for (size_t i = 0; i < n; ++i) KVS_RETURN_IF_ERROR(reply_error(e->element[i], what));
  return {};
}

Result<std::vector<std::string>> string_set(const redisReply* r, std::string_view what) {
  KVS_RETURN_IF_ERROR(reply_error(r, what));
  if (r->type != REDIS_REPLY_ARRAY) return make_status(StatusCode::corrupt_data, "redis {}: not a set", what);
  std::vector<std::string> out;
  for (size_t i = 0; i < r->elements; ++i) out.emplace_back(reply_str(r->element[i]));
  std::sort(out.begin(), out.end());
  return out;
}

size_t copy_out(std::span<const std::byte> payload, transport::MemoryRegion& dest, size_t offset) {
  if (!payload.empty()) std::memcpy(dest.span(offset, payload.size()).data(), payload.data(), payload.size());
  return payload.size();
}

}  // namespace kvstream::redis::detail
