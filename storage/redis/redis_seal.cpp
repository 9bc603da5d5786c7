#include "storage/redis/redis_seal.hpp"

#include <cstring>

#include "security/aead.hpp"
#include "storage/redis/redis_value.hpp"

namespace kvstream::redis::detail {

namespace {

constexpr std::string_view kMagic("kvsAEv1\0", 8);
constexpr std::string_view kDomain = "kvstream redis v1";
constexpr uint64_t kStride = kBlockBytes + Sealer::kTagBytes;  // a full block and its tag

uint64_t block_count(uint64_t size) { return size == 0 ? 1 : (size + kBlockBytes - 1) / kBlockBytes; }

// The associated data of every block of one value: where it belongs and how long it is.
std::string associated_data(const std::string& key, uint64_t size) {
  std::string ad(kDomain);
  ad.push_back('\0');
  ad += key;
  for (int i = 0; i < 8; ++i) ad.push_back(char(uint8_t(size >> (8 * i))));
  return ad;
}

std::span<const std::byte> bytes_of(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

}  // namespace

Result<std::shared_ptr<const Sealer>> Sealer::create(const AtRestSettings& s, std::string name_space,
                                                     bool read_clear) {
  if (s.key_file.empty()) return std::shared_ptr<const Sealer>();
  KVS_ASSIGN_OR_RETURN(auto ring, security::KeyRing::load(s.key_file));
  return with_ring(std::move(ring), std::move(name_space), read_clear);
}

std::shared_ptr<const Sealer> Sealer::with_ring(std::shared_ptr<const security::KeyRing> ring,
                                                std::string name_space, bool read_clear) {
  return std::shared_ptr<const Sealer>(new Sealer(std::move(ring), std::move(name_space), read_clear));
}

bool Sealer::is_sealed(std::string_view head) { return head.substr(0, kMagic.size()) == kMagic; }

uint64_t Sealer::block_offset(uint64_t i) { return kHeaderBytes + i * kStride; }

Result<uint64_t> Sealer::payload_size(uint64_t stored) {
  if (stored < kHeaderBytes + kTagBytes)
    return Status(StatusCode::corrupt_data, fmt::format("a sealed value of {} bytes, shorter than one block", stored));
  const uint64_t body = stored - kHeaderBytes, blocks = (body + kStride - 1) / kStride;
  // Every block but the last is full, and the last holds at least its tag.
  if (body - (blocks - 1) * kStride < kTagBytes)
    return Status(StatusCode::corrupt_data, fmt::format("a sealed value of {} bytes ends inside a tag", stored));
  return body - blocks * kTagBytes;
}

Result<std::string> Sealer::seal(const std::string& key, std::span<const std::byte> payload) const {
  const uint32_t id = ring_->current_id();
  KVS_ASSIGN_OR_RETURN(const security::Key256 k, ring_->tenant_key(id, ns_));
  KVS_ASSIGN_OR_RETURN(const security::Nonce nonce, security::random_nonce());
  const uint64_t blocks = block_count(payload.size());
  std::string out(kHeaderBytes + payload.size() + blocks * kTagBytes, '\0');
  std::memcpy(out.data(), kMagic.data(), kMagic.size());
  for (int i = 0; i < 4; ++i) out[8 + i] = char(uint8_t(id >> (8 * i)));
  std::memcpy(out.data() + 12, nonce.data(), nonce.size());
  const std::string ad = associated_data(key, payload.size());
  auto* base = reinterpret_cast<std::byte*>(out.data());
  for (uint64_t i = 0; i < blocks; ++i) {
    const uint64_t from = i * kBlockBytes, n = std::min<uint64_t>(kBlockBytes, payload.size() - from);
    std::byte* at = base + block_offset(i);
    KVS_ASSIGN_OR_RETURN(const security::Tag tag, security::seal(k, security::nonce_for(nonce, i), bytes_of(ad),
                                                                 payload.subspan(from, n), std::span(at, n)));
    std::memcpy(at + n, tag.data(), tag.size());
  }
  return out;
}

Result<std::span<const std::byte>> Sealer::open(const std::string& key, std::span<std::byte> value) const {
  KVS_ASSIGN_OR_RETURN(const uint64_t size, payload_size(value.size()));
  const std::string_view header(reinterpret_cast<const char*>(value.data()), kHeaderBytes);
  return open_blocks(key, header, size, 0, value.subspan(kHeaderBytes));
}

Result<std::span<const std::byte>> Sealer::open_blocks(const std::string& key, std::string_view header, uint64_t size,
                                                       uint64_t first, std::span<std::byte> blocks) const {
  if (header.size() != kHeaderBytes || !is_sealed(header))
    return make_status(StatusCode::corrupt_data, "{}: not a sealed value", key);
  uint32_t id = 0;
  for (int i = 0; i < 4; ++i) id |= uint32_t(uint8_t(header[8 + i])) << (8 * i);
  security::Nonce nonce{};
  std::memcpy(nonce.data(), header.data() + 12, nonce.size());
  if (!ring_->has(id))
    return make_status(StatusCode::permission_denied,
                       "{} is sealed under master key {}, which the key file does not hold (removed too soon?)", key,
                       id);
  KVS_ASSIGN_OR_RETURN(const security::Key256 k, ring_->tenant_key(id, ns_));
  const std::string ad = associated_data(key, size);
  const uint64_t total = block_count(size);
  uint64_t in = 0, out = 0;
  for (uint64_t i = first; in < blocks.size(); ++i) {
    const uint64_t n = i < total ? std::min<uint64_t>(kBlockBytes, size - i * kBlockBytes) : 0;
    if (i >= total || blocks.size() - in < n + kTagBytes)
      return make_status(StatusCode::corrupt_data, "{}: {} bytes of sealed blocks from block {} do not end at one",
                         key, blocks.size(), first);
    security::Tag tag{};
    std::memcpy(tag.data(), blocks.data() + in + n, tag.size());
    const std::span<std::byte> cipher = blocks.subspan(in, n);
    if (Status s = security::open(k, security::nonce_for(nonce, i), bytes_of(ad), cipher, tag, cipher); !s.ok())
      return s.code() == StatusCode::corrupt_data
                 ? make_status(s.code(),
                               "{} failed authentication at block {}: changed bytes, another key's value, or "
                               "another master key under the same id",
                               key, i)
                 : make_status(s.code(), "{} (block {}): {}", key, i, s.message());
    // Blocks close up over the tags: the payload ends contiguous at the start.
    if (out != in && n > 0) std::memmove(blocks.data() + out, blocks.data() + in, n);
    in += n + kTagBytes, out += n;
  }
  return std::span<const std::byte>(blocks.data(), out);
}

}  // namespace kvstream::redis::detail
