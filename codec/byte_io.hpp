// Little-endian byte writer and a bounds-checked reader for untrusted input.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kvstream/status.hpp"

namespace kvstream::codec {

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>& out) : out_(out) {}
  template <typename T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &v, sizeof(T));  // x86-64 and aarch64 are little-endian
  }
  template <typename T>
  void put_array(const std::vector<T>& v) {
    const size_t at = out_.size();
    out_.resize(at + v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(out_.data() + at, v.data(), v.size() * sizeof(T));
  }
  [[nodiscard]] size_t size() const { return out_.size(); }
  std::vector<uint8_t>& bytes() { return out_; }

 private:
  std::vector<uint8_t>& out_;
};

/// Reads fields in order; the first failure sticks, so callers check once at the end
/// (values read after a failure are zero).
class ByteReader {
 public:
  ByteReader(std::span<const uint8_t> in, std::string_view what) : in_(in), what_(what) {}
  template <typename T>
  T get() {
    T v{};
    if (!take(sizeof(T))) return v;
    std::memcpy(&v, in_.data() + pos_ - sizeof(T), sizeof(T));
    return v;
  }
  template <typename T>
  bool get_array(std::vector<T>& v, size_t n) {
    if (n > (in_.size() - std::min(pos_, in_.size())) / sizeof(T)) {
      fail();
      return false;
    }
    v.resize(n);
    if (n) std::memcpy(v.data(), in_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return true;
  }
  std::span<const uint8_t> rest() const { return in_.subspan(std::min(pos_, in_.size())); }
  void skip(size_t n) { take(n); }
  [[nodiscard]] bool ok() const { return ok_; }
  [[nodiscard]] size_t pos() const { return pos_; }
  [[nodiscard]] Status status() const {
    if (ok_) return {};
    return make_status(StatusCode::corrupt_data, "{} is truncated (needed more than {} bytes)", what_, in_.size());
  }

 private:
  bool take(size_t n) {
    if (!ok_ || n > in_.size() - pos_) {
      fail();
      return false;
    }
    pos_ += n;
    return true;
  }
  void fail() { ok_ = false; }
  std::span<const uint8_t> in_;
  std::string_view what_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace kvstream::codec
