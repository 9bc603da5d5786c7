// A replicated write's outcome from its owners' answers (write_outcome.hpp).
#include "storage/cluster/write_outcome.hpp"

#include <fmt/format.h>

namespace kvstream::cluster {

Status write_outcome(const std::vector<OwnerAnswer>& answers, uint32_t quorum, std::string_view context,
                     uint32_t chunk, uint32_t level) {
  uint32_t acks = 0, busy = 0, full = 0;
  std::string errors;
  Status first;
  for (const OwnerAnswer& a : answers) {
    const StatusCode c = a.status.code();
    if (a.status.ok()) {
      ++acks;
      continue;
    }
    if (final_error(c) || c == StatusCode::cancelled || c == StatusCode::already_exists) return a.status;
    busy += c == StatusCode::resource_exhausted;
    full += c == StatusCode::no_space;
    if (first.ok()) first = a.status;
    errors += fmt::format("{}{}: {}", errors.empty() ? "" : "; ", a.address, a.status.to_string());
  }
  if (acks >= quorum) return {};
  // Every owner that failed answered: that it has no space (the namespace's quota, a
  // full disk), which only removing data cures; or, some of them, that they are busy
  // (the node's memory), which waiting may cure. Neither is a node failure.
  const size_t failed = answers.size() - acks;
  return Status(full == failed                          ? StatusCode::no_space
                : busy + full == failed                 ? StatusCode::resource_exhausted
                : first.code() == StatusCode::timed_out ? StatusCode::timed_out
                                                        : StatusCode::unavailable,
                fmt::format("chunk {} level {} of '{}' reached {} of {} replicas, {} needed ({})", chunk, level,
                            context, acks, answers.size(), quorum, errors));
}

}  // namespace kvstream::cluster
