#include "storage/node/object_seal.hpp"

#include <cstring>

namespace kvstream::storage {

Result<ObjectSeal> new_object_seal(const security::KeyRing& keys, std::string_view ns) {
  ObjectSeal s;
  s.key_id = keys.current_id();
  KVS_ASSIGN_OR_RETURN(s.key, keys.tenant_key(s.key_id, ns));
  KVS_ASSIGN_OR_RETURN(s.base, security::random_nonce());
  return s;
}

Result<ObjectSeal> stored_object_seal(const security::KeyRing* keys, uint32_t key_id, std::string_view ns,
                                      const security::Nonce& base, uint32_t block_bytes, std::string_view object) {
  // Not corrupt_data: the store moves damaged objects aside, and this one is intact;
  // it waits for its key to come back to the key file.
  if (!keys || !keys->has(key_id))
    return make_status(StatusCode::permission_denied, "object {} is sealed under key {}, which {}", object, key_id,
                       keys ? "the key file lacks" : "this node cannot read: it has no key file");
  ObjectSeal s;
  s.key_id = key_id, s.base = base, s.block_bytes = block_bytes;
  KVS_ASSIGN_OR_RETURN(s.key, keys->tenant_key(key_id, ns));
  return s;
}

std::string_view namespace_of(std::string_view object_name) { return object_name.substr(0, object_name.find('/')); }

BlockAd::BlockAd(std::string_view name) : bytes_(name.size() + 9), name_bytes_(name.size()) {
  std::memcpy(bytes_.data(), name.data(), name.size());
}

std::span<const std::byte> BlockAd::at(uint64_t index, bool last) {
  for (int i = 0; i < 8; ++i) bytes_[name_bytes_ + i] = std::byte(uint8_t(index >> (8 * i)));
  bytes_[name_bytes_ + 8] = std::byte(last ? 1 : 0);
  return bytes_;
}

Result<security::Tag> seal_block(const ObjectSeal& s, BlockAd& ad, uint64_t index, bool last,
                                 std::span<std::byte> bytes) {
  return security::seal(s.key, security::nonce_for(s.base, index + 1), ad.at(index, last), bytes, bytes);
}

Status open_block(const ObjectSeal& s, BlockAd& ad, uint64_t index, bool last, std::span<std::byte> bytes,
                  const security::Tag& tag, std::string_view object) {
  Status st = security::open(s.key, security::nonce_for(s.base, index + 1), ad.at(index, last), bytes, tag, bytes);
  if (st.code() == StatusCode::corrupt_data)
    return make_status(StatusCode::corrupt_data, "object {}: block {} fails its authentication on disk", object, index);
  return st;
}

Result<SealedChecksum> seal_checksum(const ObjectSeal& s, std::span<const std::byte> header_ad, uint64_t checksum) {
  SealedChecksum out;
  std::array<std::byte, 8> plain{};
  std::memcpy(plain.data(), &checksum, 8);
  KVS_ASSIGN_OR_RETURN(out.tag, security::seal(s.key, security::nonce_for(s.base, 0), header_ad, plain, out.cipher));
  return out;
}

Result<uint64_t> open_checksum(const ObjectSeal& s, std::span<const std::byte> header_ad, const SealedChecksum& sealed,
                               std::string_view object) {
  std::array<std::byte, 8> plain{};
  Status st = security::open(s.key, security::nonce_for(s.base, 0), header_ad, sealed.cipher, sealed.tag, plain);
  if (st.code() == StatusCode::corrupt_data)
    return make_status(StatusCode::corrupt_data,
                       "object {}: its header fails its authentication (changed, or written under another name)",
                       object);
  KVS_RETURN_IF_ERROR(st);
  uint64_t checksum = 0;
  std::memcpy(&checksum, plain.data(), 8);
  return checksum;
}

}  // namespace kvstream::storage
