// A history of storage operations and its checker, in the spirit of Jepsen's: every
// operation is an interval between two tickets of one global counter (taken just
// before the call and just after it returns), so "A returned before B was called"
// is exact without any clock. The checker then asks, for each read:
//   * the value was written whole by one put of that key that was acknowledged or
//     in flight (invoked before the read returned), never by a put that was refused;
//   * no write (put of the key, or remove of its context) acknowledged before the read
//     began is lost: the version read did not end before that write started, unless a
//     remove explains a read of nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvstream::checker {

enum class Kind : uint8_t { put, get, remove };
/// ok: acknowledged; failed: the node answered with an error (it must have had no
/// effect); unknown: the connection broke (it may or may not have taken effect).
enum class Outcome : uint8_t { ok, failed, unknown };

struct Operation {
  Kind kind = Kind::get;
  uint32_t key = 0;      ///< object (put, get); for remove, any key of its context
  uint32_t context = 0;  ///< the key's context
  uint64_t invoked = 0, returned = 0;  ///< tickets
  Outcome outcome = Outcome::ok;
  uint64_t put_id = 0;   ///< put: its id (unique, > 0); get: the id read (0: not found)
  bool torn = false;     ///< get: the bytes were not one put's whole value
  bool corrupt = false;  ///< get: the node answered corrupt_data
};

struct Anomaly {
  size_t op = 0;  ///< index of the read in the history
  std::string what;
};

/// Checks a complete history (every operation has returned or is marked unknown).
std::vector<Anomaly> check(const std::vector<Operation>& history);

}  // namespace kvstream::checker
