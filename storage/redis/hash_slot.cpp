#include "storage/redis/hash_slot.hpp"

#include <array>

namespace kvstream::redis::detail {

namespace {

// CRC16-CCITT (XMODEM): polynomial 0x1021, initial 0, no reflection, as the cluster
// specification fixes it; a table built once, one byte per step.
constexpr std::array<uint16_t, 256> make_table() {
  std::array<uint16_t, 256> t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint16_t crc = uint16_t(b << 8);
    for (int i = 0; i < 8; ++i) crc = (crc & 0x8000) ? uint16_t((crc << 1) ^ 0x1021) : uint16_t(crc << 1);
    t[b] = crc;
  }
  return t;
}
constexpr auto kTable = make_table();

}  // namespace

uint16_t crc16_xmodem(std::string_view bytes) {
  uint16_t crc = 0;
  for (char c : bytes) crc = uint16_t((crc << 8) ^ kTable[((crc >> 8) ^ uint8_t(c)) & 0xff]);
  return crc;
}

uint16_t key_slot(std::string_view key) {
  if (const size_t open = key.find('{'); open != std::string_view::npos)
    if (const size_t close = key.find('}', open + 1); close != std::string_view::npos && close > open + 1)
      key = key.substr(open + 1, close - open - 1);
  return uint16_t(crc16_xmodem(key) % kSlots);
}

}  // namespace kvstream::redis::detail
