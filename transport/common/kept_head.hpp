// What the stray sweeps of the tag-matching backends share (ucx_strays.hpp,
// ofi_strays.hpp): a sweep drops strays from the head of the unexpected queue until a
// message kept for its connection is first in line. Such a message is mostly gone
// within milliseconds (a header whose receive is posted next, a body its reader
// takes); one first in line for kStuckAfter waits on a reader that does not read, and
// strays pile up behind it, where only probes that skip it (the filters of a stray
// cover, tag_cover.hpp) reach them: costlier, so made at most every kLookBehindEvery.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "kvstream/transport.hpp"

namespace kvstream::transport {

inline constexpr Clock::duration kStuckAfter = std::chrono::milliseconds(100);
inline constexpr Clock::duration kLookBehindEvery = std::chrono::seconds(1);

/// What one sweep did.
struct StraySweep {
  size_t dropped = 0;
  bool looked_behind = false;  // a kept message was first in line for stuck_after, and the cover was probed
};

/// The message the last sweep kept first in line, and since when.
class KeptHead {
 public:
  /// A sweep saw `tag` kept first in line at `now` (nullopt: nothing kept there):
  /// whether that message has been first since `stuck_after` ago or longer.
  bool stuck(std::optional<uint64_t> tag, Clock::time_point now, Clock::duration stuck_after) {
    if (!tag) {
      tag_.reset();
      return false;
    }
    if (tag_ != tag) {
      tag_ = tag;
      since_ = now;
    }
    return now - since_ >= stuck_after;
  }

 private:
  std::optional<uint64_t> tag_;
  Clock::time_point since_{};
};

}  // namespace kvstream::transport
