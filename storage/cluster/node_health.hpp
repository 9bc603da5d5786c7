// What the replicated client knows about one storage node: latency and throughput
// EWMAs from the calls it made, bytes in flight, and when it was marked down. Kept
// inside the transport (which must not depend on policy/). Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>

#include "kvstream/transport.hpp"

namespace kvstream::cluster {

class NodeHealth {
 public:
  /// Gets at least this large are throughput samples; smaller ones latency samples.
  static constexpr uint64_t kThroughputSampleBytes = 64 * 1024;

  explicit NodeHealth(double weight = 0.25) : weight_(weight) {}

  /// A call asking for up to `bytes` was sent.
  void started(uint64_t bytes);
  /// It succeeded after `seconds` with `got` bytes: one sample.
  void succeeded(uint64_t asked, double seconds, uint64_t got);
  /// It failed (no sample); `stalled_seconds` > 0 when it ran out of its time share,
  /// which is then taken as a latency sample so the node ranks last.
  void failed(uint64_t asked, double stalled_seconds = 0);

  /// Expected seconds for a get of `bytes` now: latency + (in flight + bytes) /
  /// throughput; 0 for a node never measured (so it is tried and measured).
  [[nodiscard]] double expected_seconds(uint64_t bytes) const;

  void mark_down(transport::Clock::time_point until);
  void clear_down();
  [[nodiscard]] bool down(transport::Clock::time_point now) const;

  struct Snapshot {
    double latency_s = 0, bytes_per_s = 0;
    uint64_t samples = 0, inflight_bytes = 0;
  };
  [[nodiscard]] Snapshot snapshot() const;

 private:
  mutable std::mutex mu_;
  double weight_;
  double latency_s_ = 0, bytes_per_s_ = 0;
  uint64_t latency_samples_ = 0, throughput_samples_ = 0, inflight_bytes_ = 0;
  transport::Clock::time_point down_until_{};
};

}  // namespace kvstream::cluster
