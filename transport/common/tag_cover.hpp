// Covers of tag sets by probe filters. A tag-matching queue (UCP's unexpected queue,
// an ofi_rxm endpoint's) is probed with (tag, mask): the oldest message whose tag
// equals `tag` in the bits of `mask`. A set of tags that no receive will ever take
// (strays: ucx_strays.hpp, ofi_strays.hpp) is reached in full, even behind messages
// kept for a receiver, by probing each filter of a cover: filters that together match
// exactly that set. The covers are built from aligned blocks of one field of the tag
// (a block: the values sharing their top `bits` bits), which one filter each matches.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

namespace kvstream::transport {

/// A probe of a tag-matching queue: the messages whose tag equals `tag` in the bits
/// of `mask`.
struct TagFilter {
  uint64_t tag = 0;
  uint64_t mask = 0;
};

[[nodiscard]] constexpr bool matches(const TagFilter& f, uint64_t tag) { return (tag & f.mask) == (f.tag & f.mask); }

/// How far ahead of what its receiver has consumed a peer's message may be (in
/// messages of one connection) and still be kept for it. A UCX receiver posts 32
/// header receives ahead, a libfabric one a single one; a storage client has at most
/// max_inflight_per_connection requests out (64 by default). A message further ahead
/// than this is dropped as a stray, and its receiver would wait for it in vain.
constexpr uint64_t kMaxLead = uint64_t(1) << 16;

/// One field of a tag: `width` bits at `shift`, under the fixed bits `above` (tag
/// bits) of `above_mask` (the kind and connection a sequence belongs to).
struct TagField {
  unsigned shift = 0;
  unsigned width = 0;
  uint64_t above = 0;
  uint64_t above_mask = 0;

  /// The filter of the field's values sharing their top `bits` bits with `value`;
  /// `flip` is xored into the value's wire form (a field read through a key).
  [[nodiscard]] constexpr TagFilter block(uint64_t value, unsigned bits, uint64_t flip = 0) const {
    const uint64_t field = width >= 64 ? ~uint64_t(0) : (uint64_t(1) << width) - 1;
    const uint64_t prefix = bits == 0 ? 0 : (field >> (width - bits)) << (width - bits);
    return {above | (((value ^ flip) & prefix) << shift), above_mask | (prefix << shift)};
  }
};

/// Appends (emit(value, bits)) the aligned blocks that cover [lo, hi) of a
/// `width`-bit field exactly: at most 2 x width of them.
template <typename Emit>
void cover_range(uint64_t lo, uint64_t hi, unsigned width, Emit&& emit) {
  while (lo < hi) {
    unsigned size_bits = lo == 0 ? width : std::min(width, unsigned(__builtin_ctzll(lo)));
    while (size_bits > 0 && lo + (uint64_t(1) << size_bits) > hi) --size_bits;
    emit(lo, width - size_bits);
    lo += uint64_t(1) << size_bits;
  }
}

/// Appends the aligned blocks of a `width`-bit field (width < 64) that hold none of
/// `keys` (sorted, each below 2^width): about width blocks per key.
template <typename Emit>
void cover_absent(std::span<const uint64_t> keys, unsigned width, Emit&& emit) {
  uint64_t lo = 0;
  for (uint64_t k : keys) {
    if (k < lo) continue;  // a repeated key
    cover_range(lo, k, width, emit);
    lo = k + 1;
  }
  cover_range(lo, uint64_t(1) << width, width, emit);
}

/// Appends the aligned blocks of a `width`-bit field (width < 64) outside the window
/// [from, from + lead) taken around the circle (sequences wrap): at most 4 x width.
template <typename Emit>
void cover_outside(uint64_t from, uint64_t lead, unsigned width, Emit&& emit) {
  const uint64_t size = uint64_t(1) << width, start = (from + lead) & (size - 1), end = from & (size - 1);
  if (lead >= size) return;
  if (start < end) {
    cover_range(start, end, width, emit);
  } else {
    cover_range(start, size, width, emit);
    cover_range(0, end, width, emit);
  }
}

}  // namespace kvstream::transport
