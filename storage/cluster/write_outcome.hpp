// What a replicated write's answers add up to: acknowledged once the write quorum of
// the chunk's owners took it, else the error that says why, naming each owner's.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvstream/status.hpp"

namespace kvstream::cluster {

/// An error that any other owner would answer the same way (out of range, invalid,
/// unsupported): asking another is no use.
[[nodiscard]] inline bool final_error(StatusCode c) {
  return c == StatusCode::out_of_range || c == StatusCode::invalid_argument || c == StatusCode::unsupported;
}

/// One owner's answer to a write.
struct OwnerAnswer {
  std::string_view address;  // the node's, which outlives the write (no copy per put)
  Status status;
};

/// The outcome of a write of chunk `chunk` level `level` of `context` from its owners'
/// answers:
/// ok once `quorum` of them took it; an answer another owner would give the same
/// (final: out of range, invalid, unsupported), a cancel, or `already_exists` (a newer
/// write of the object reached that owner first, and reaches the others too) is the
/// outcome as it is; otherwise no_space where every owner that failed is out of
/// space, resource_exhausted where each of those is busy or out of space (neither a
/// node failure), timed_out or unavailable after the first failure.
Status write_outcome(const std::vector<OwnerAnswer>& answers, uint32_t quorum, std::string_view context,
                     uint32_t chunk, uint32_t level);

}  // namespace kvstream::cluster
