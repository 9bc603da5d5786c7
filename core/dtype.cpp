#include "kvstream/dtype.hpp"

#include <cstring>

namespace kvstream {

std::string_view dtype_name(DType t) noexcept {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "unknown";
}

Result<DType> parse_dtype(std::string_view name) {
  if (name == "f32" || name == "fp32" || name == "float32") return DType::f32;
  if (name == "f16" || name == "fp16" || name == "float16") return DType::f16;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  return make_status(StatusCode::invalid_argument, "unknown element type '{}' (expected f32, f16 or bf16)", name);
}

void convert_elements(const void* src, DType src_type, void* dst, DType dst_type, size_t n) noexcept {
  if (src_type == dst_type) {
    std::memcpy(dst, src, n * dtype_size(src_type));
    return;
  }
  // Specialised loops so the compiler can vectorise the common fp32 <-> 16-bit cases.
  if (src_type == DType::f32) {
    const float* s = static_cast<const float*>(src);
    uint16_t* d = static_cast<uint16_t*>(dst);
    if (dst_type == DType::f16)
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(s[i]);
    else
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
    return;
  }
  if (dst_type == DType::f32) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    float* d = static_cast<float*>(dst);
    if (src_type == DType::f16)
      for (size_t i = 0; i < n; ++i) d[i] = f16_to_f32(s[i]);
    else
      for (size_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
    return;
  }
  for (size_t i = 0; i < n; ++i) store_element(dst, dst_type, i, load_element(src, src_type, i));
}

}  // namespace kvstream
