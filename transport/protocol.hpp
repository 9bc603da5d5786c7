// The chunk protocol: request and response headers as they travel inside transport
// message headers, with every field bounded. Documented in docs/protocol.md.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvstream/storage.hpp"

namespace kvstream::storage {

enum class Op : uint8_t { hello = 1, auth = 2, put = 3, get = 4, stat = 5, remove = 6, list = 7 };
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
inline constexpr size_t kMaxMessageBytes = 512;
inline constexpr uint32_t kMaxChunksPerContext = 1u << 20;

struct Request {
  Op op = Op::get;
  uint64_t id = 0;
  uint32_t chunk = 0;
  uint32_t level = 0;
  std::string context;                  // put/get/stat/remove
  std::string name_space;               // auth
  std::array<uint8_t, kMacBytes> mac{};  // auth
};

struct Response {
  Op op = Op::get;
  uint64_t id = 0;
  StatusCode code = StatusCode::ok;
  std::string message;                      // error text, bounded
  uint64_t checksum = 0;                    // xxh3-64 of the body
  std::array<uint8_t, kNonceBytes> nonce{};  // hello
};

std::vector<std::byte> encode(const Request& r);
std::vector<std::byte> encode(const Response& r);
/// Parse untrusted headers. Errors: corrupt_data (bad magic, version, op, bounds),
/// invalid_argument (ids that fail validate_id).
Result<Request> decode_request(std::span<const std::byte> header);
Result<Response> decode_response(std::span<const std::byte> header);

/// Body of a stat response.
std::vector<std::byte> encode_stats(const std::vector<ChunkStat>& stats);
Result<std::vector<ChunkStat>> decode_stats(std::span<const std::byte> body);
/// Body of a list response.
std::vector<std::byte> encode_names(const std::vector<std::string>& names);
Result<std::vector<std::string>> decode_names(std::span<const std::byte> body);

/// xxh3-64 of a body.
uint64_t body_checksum(std::span<const std::byte> body);

/// HMAC-SHA256(secret, nonce || namespace): what a client proves it knows.
std::array<uint8_t, kMacBytes> auth_mac(const std::string& secret, std::span<const uint8_t> nonce,
                                        const std::string& name_space);
/// A fresh random nonce (from the OS).
Result<std::array<uint8_t, kNonceBytes>> make_nonce();
/// Constant-time comparison.
bool mac_equal(std::span<const uint8_t> a, std::span<const uint8_t> b);

}  // namespace kvstream::storage
