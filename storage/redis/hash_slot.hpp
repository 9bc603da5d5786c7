// Redis Cluster's key -> hash slot mapping: CRC16 (XMODEM) of the key, or of its hash
// tag (the bytes between the first '{' and the next '}', when not empty), mod 16384.
// Keys that share a tag share a slot, which is what lets one MULTI/EXEC touch them.
#pragma once

#include <cstdint>
#include <string_view>

namespace kvstream::redis::detail {

constexpr uint32_t kSlots = 16384;

uint16_t crc16_xmodem(std::string_view bytes);
/// The slot a cluster keeps `key` in.
uint16_t key_slot(std::string_view key);

}  // namespace kvstream::redis::detail
