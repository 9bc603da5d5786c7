// Shared pieces of the baseline codecs (internal: not part of the public API).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "codec/baselines/baseline.hpp"
#include "kvstream/dtype.hpp"
#include "kvstream/kv_model.hpp"
#include "kvstream/status.hpp"

namespace kvstream::codec::baselines::detail {

/// Method ids in the object header.
enum class MethodId : uint8_t {
  fp16 = 1,
  int_token = 2,
  kivi = 3,
  zstd_fp16 = 4,
  cachegen_code = 5,
  cachegen_static = 6,
  cachegen_paper = 7,
};

inline constexpr uint8_t kVersion = 1;
/// Fixed header: 'K' 'B' version method, u8 planes, u32 layers, u32 channels, u32 tokens.
inline constexpr size_t kHeaderBytes = 17;

// --- little-endian byte writer / bounds-checked reader ---------------------------

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>& out) : out_(out) {}
  void u8(uint8_t v) { out_.push_back(v); }
  void u16(uint16_t v) {
    out_.push_back(uint8_t(v));
    out_.push_back(uint8_t(v >> 8));
  }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(uint8_t(v >> (8 * i)));
  }
  void bytes(std::span<const uint8_t> b) { out_.insert(out_.end(), b.begin(), b.end()); }

 private:
  std::vector<uint8_t>& out_;
};

/// Reads from an untrusted span; every read past the end fails (ok() turns false and
/// reads return 0).
class ByteReader {
 public:
  explicit ByteReader(std::span<const uint8_t> in) : in_(in) {}
  [[nodiscard]] bool ok() const noexcept { return ok_; }
  [[nodiscard]] size_t pos() const noexcept { return pos_; }
  [[nodiscard]] size_t remaining() const noexcept { return in_.size() - pos_; }
  [[nodiscard]] std::span<const uint8_t> rest() const noexcept { return in_.subspan(pos_); }
  bool skip(size_t n) {
    if (!ok_ || n > remaining()) return ok_ = false;
    pos_ += n;
    return true;
  }
  uint8_t u8() {
    if (!ok_ || remaining() < 1) return fail();
    return in_[pos_++];
  }
  uint16_t u16() {
    if (!ok_ || remaining() < 2) return fail();
    const uint16_t v = uint16_t(in_[pos_] | (in_[pos_ + 1] << 8));
    pos_ += 2;
    return v;
  }
  uint32_t u32() {
    if (!ok_ || remaining() < 4) return fail();
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(in_[pos_ + i]) << (8 * i);
    pos_ += 4;
    return v;
  }

 private:
  uint8_t fail() {
    ok_ = false;
    return 0;
  }
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// --- bit packing (LSB first) -----------------------------------------------------

class BitWriter {
 public:
  explicit BitWriter(std::vector<uint8_t>& out) : out_(out) {}
  /// Appends the low `bits` (1..24) bits of v.
  void put(uint32_t v, int bits) {
    acc_ |= uint64_t(v & ((1u << bits) - 1u)) << n_;
    n_ += bits;
    while (n_ >= 8) {
      out_.push_back(uint8_t(acc_));
      acc_ >>= 8;
      n_ -= 8;
    }
  }
  /// Pads the last byte with zeros.
  void flush() {
    if (n_ > 0) out_.push_back(uint8_t(acc_));
    acc_ = 0;
    n_ = 0;
  }

 private:
  std::vector<uint8_t>& out_;
  uint64_t acc_ = 0;
  int n_ = 0;
};

/// Reads bits; past the end of `in` it reads zeros (callers check sizes first).
class BitReader {
 public:
  explicit BitReader(std::span<const uint8_t> in) : in_(in) {}
  uint32_t get(int bits) {
    while (n_ < bits) {
      acc_ |= uint64_t(pos_ < in_.size() ? in_[pos_] : 0) << n_;
      ++pos_;
      n_ += 8;
    }
    const uint32_t v = uint32_t(acc_ & ((1u << bits) - 1u));
    acc_ >>= bits;
    n_ -= bits;
    return v;
  }

 private:
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  uint64_t acc_ = 0;
  int n_ = 0;
};

// --- fp16 helpers ---------------------------------------------------------------

inline constexpr float kF16Max = 65504.0f;

/// Finite stand-in for a value: NaN -> 0, +-inf -> +-65504 (beyond fp16 clamps too).
inline float sanitize(float x) noexcept {
  if (std::isnan(x)) return 0.0f;
  return std::clamp(x, -kF16Max, kF16Max);
}

/// Smallest fp16 >= x, for 0 <= x <= 65504 (finite, non-negative).
inline uint16_t f16_ceil(float x) noexcept {
  uint16_t h = f32_to_f16(x);
  if (h >= 0x7c00u) return 0x7bffu;  // x rounded to inf: cannot happen for x <= 65504
  if (f16_to_f32(h) < x && h < 0x7bffu) ++h;
  return h;
}

/// Largest fp16 <= x, for |x| <= 65504.
inline uint16_t f16_floor(float x) noexcept {
  uint16_t h = f32_to_f16(x);
  if (f16_to_f32(h) > x) {
    if (h == 0x0000u)
      h = 0x8001u;
    else if (h & 0x8000u)
      h = uint16_t(h + 1u);  // more negative
    else
      h = uint16_t(h - 1u);
  }
  return h;
}

/// True for a finite fp16 (not inf or NaN).
inline bool f16_finite(uint16_t h) noexcept { return (h & 0x7c00u) != 0x7c00u; }

// --- symmetric absmax quantization (int-token, CacheGen) --------------------------
// Encoder and decoder use these very expressions, so reconstructions agree bit for bit.

/// Quantizes x given the stored absmax m (>= 0) and the largest code qmax.
inline int quant_sym(float x, float m, int qmax) noexcept {
  if (!(m > 0.0f)) return 0;
  const float q = std::nearbyint(x * (float(qmax) / m));
  return int(std::clamp(q, float(-qmax), float(qmax)));
}
inline float dequant_sym(int q, float m, int qmax) noexcept { return float(q) * (m / float(qmax)); }

/// Absmax of a row as a stored fp16 (rounded up so every value fits).
inline uint16_t absmax_f16(const float* row, size_t n) noexcept {
  float m = 0.0f;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(row[i]));
  return f16_ceil(m);
}

// --- header ----------------------------------------------------------------------

/// What the fixed header carries.
struct ChunkShape {
  uint32_t layers = 0;
  uint32_t planes = 0;
  uint32_t channels = 0;
  uint32_t tokens = 0;
  [[nodiscard]] uint64_t rows() const noexcept { return uint64_t(layers) * planes * tokens; }
  [[nodiscard]] uint64_t elements() const noexcept { return rows() * channels; }
};

/// Checks a chunk to encode and returns its shape.
Result<ChunkShape> shape_of(const KvView& v);

/// Writes the fixed header.
void write_header(std::vector<uint8_t>& out, MethodId m, const ChunkShape& s);

/// Reads and checks the fixed header against `m` and the output view's shape.
Status read_header(ByteReader& r, MethodId m, const KvView& out, ChunkShape* shape);

// --- staging -----------------------------------------------------------------------

/// Reads the (layer, plane) matrix of a view: tokens x channels sanitized floats.
void load_matrix(const KvView& v, uint32_t layer, uint32_t plane, float* dst, bool keep_raw = false);

/// Writes a decoded staging buffer [layer][plane][token][channel] into `out`.
void store_all(const KvView& out, const ChunkShape& s, const std::vector<float>& stage);

/// Error helpers.
Status corrupt(std::string_view what);

/// FNV-1a over bytes (training fingerprints).
uint32_t fnv1a(std::span<const uint8_t> bytes, uint32_t h = 2166136261u) noexcept;

}  // namespace kvstream::codec::baselines::detail
