// The progressive stream's encoder and CPU decoder, behind encode_chunk and
// decode_chunk (which check the arguments common to both stream kinds first).
// Internal to the codec.
#pragma once

#include <span>
#include <vector>

#include "kvstream/codec.hpp"

namespace kvstream::codec {

/// Appends the prefix through `level` of the chunk's progressive stream (profile
/// progressive, chunk checked by the caller).
Status encode_layered(const Profile& profile, const KvView& chunk, uint32_t level, const EncodeOptions& options,
                      std::vector<uint8_t>& out);

/// Decodes the prefix `kept` + `more` of a progressive stream into `out`, with
/// `threads` workers sharing the groups of planes. `more` may be empty; otherwise
/// `kept` must end at a substream boundary.
Status decode_layered(const Profile& profile, std::span<const uint8_t> kept, std::span<const uint8_t> more,
                      const KvView& out, DecodeScratch* scratch, unsigned threads);

/// Whether `bytes` starts like a progressive stream (magic and version).
bool is_layered(std::span<const uint8_t> bytes);

}  // namespace kvstream::codec
