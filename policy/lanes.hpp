// The lanes a plan of transfers and decodes runs on, in seconds from now: shared by
// the deadline chooser (policy/chooser.cpp) and the refinement planner
// (policy/refinement.cpp). Internal to the policy library.
#pragma once

#include <algorithm>
#include <array>

#include "kvstream/policy.hpp"

namespace kvstream::policy {

// The lanes of DeadlineChooser's model.
struct Lanes {
  double wire = 0;    // the last requested transfer lands
  double decode = 0;  // every fetched chunk so far is in memory
  double text = 0;    // the recompute lane is free (every text chunk so far is in memory)
  uint32_t workers = 1;
  std::array<double, kMaxDecodeWorkers> free{};  // when each decode worker is free
  [[nodiscard]] double complete() const { return std::max(decode, text); }
  [[nodiscard]] double work() const { return wire + decode + text; }
  // A chunk that lands at `landed` decodes for `seconds` on the first free worker;
  // returns when it is decoded (an earlier chunk on another worker may finish later).
  double decode_chunk(double landed, double seconds) {
    double* w = std::min_element(free.begin(), free.begin() + workers);
    *w = std::max(landed, *w) + seconds;
    decode = std::max(decode, *w);
    return *w;
  }
};

/// Seconds to decode `chunk` at `level` (0 where the costs carry no decode times).
inline double decode_of(const ContextCosts& c, uint32_t chunk, uint32_t level) {
  return c.decode_seconds.empty() ? 0.0 : c.decode_seconds[chunk][level];
}

}  // namespace kvstream::policy
