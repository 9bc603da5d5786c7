// Tagged framing: the tag-matching backends (UCX, libfabric) frame a message as a
// header and a body sent under tags that say what each piece is, which connection it
// belongs to and where it falls in that connection's sequence, so a receive can be
// posted for exactly one piece. One layout type, instantiated per backend with its
// field widths, packs and unpacks them.
#pragma once

#include <cstdint>

namespace kvstream::transport {

/// Fields of a tag, from the most significant: kind, connection, sequence, segment.
struct TagFields {
  uint64_t kind = 0;
  uint64_t conn = 0;
  uint64_t seq = 0;
  uint64_t seg = 0;
};

/// A 64-bit tag of KindBits + ConnBits + SeqBits + SegBits bits. Values wider than
/// their field are cut to it (sequences wrap; connection ids are allocated below
/// the bound).
template <unsigned KindBits, unsigned ConnBits, unsigned SeqBits, unsigned SegBits>
struct TagLayout {
  static_assert(KindBits + ConnBits + SeqBits + SegBits == 64, "a tag layout fills 64 bits");
  static constexpr unsigned kSegShift = 0;
  static constexpr unsigned kSeqShift = SegBits;
  static constexpr unsigned kConnShift = SegBits + SeqBits;
  static constexpr unsigned kKindShift = SegBits + SeqBits + ConnBits;

  static constexpr uint64_t mask(unsigned bits) { return bits >= 64 ? ~uint64_t(0) : (uint64_t(1) << bits) - 1; }
  static constexpr uint64_t kKindMask = mask(KindBits);
  static constexpr uint64_t kConnMask = mask(ConnBits);
  static constexpr uint64_t kSeqMask = mask(SeqBits);
  static constexpr uint64_t kSegMask = mask(SegBits);
  /// Every bit below the kind: a receive that matches any tag of one kind ignores these.
  static constexpr uint64_t kBelowKind = mask(kKindShift);

  static constexpr uint64_t pack(const TagFields& f) {
    return ((f.kind & kKindMask) << kKindShift) | ((f.conn & kConnMask) << kConnShift) |
           ((f.seq & kSeqMask) << kSeqShift) | ((f.seg & kSegMask) << kSegShift);
  }
  static constexpr TagFields unpack(uint64_t tag) {
    return {(tag >> kKindShift) & kKindMask, (tag >> kConnShift) & kConnMask, (tag >> kSeqShift) & kSeqMask,
            (tag >> kSegShift) & kSegMask};
  }
};

}  // namespace kvstream::transport
