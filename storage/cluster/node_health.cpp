#include "storage/cluster/node_health.hpp"

#include <algorithm>

namespace kvstream::cluster {

void NodeHealth::started(uint64_t bytes) {
  std::lock_guard lock(mu_);
  inflight_bytes_ += bytes;
}

void NodeHealth::succeeded(uint64_t asked, double seconds, uint64_t got) {
  std::lock_guard lock(mu_);
  inflight_bytes_ -= std::min(inflight_bytes_, asked);
  seconds = std::max(seconds, 1e-6);
  const auto mix = [&](double& v, uint64_t& n, double sample) {
    v = n == 0 ? sample : (1 - weight_) * v + weight_ * sample;
    ++n;
  };
  if (got < kThroughputSampleBytes) {
    mix(latency_s_, latency_samples_, seconds);
  } else {
    // The transfer's share of the time: what is left after the latency (but at least
    // half of it, so one early latency sample cannot make the rate absurd).
    const double transfer = std::max(seconds - latency_s_, seconds / 2);
    mix(bytes_per_s_, throughput_samples_, double(got) / transfer);
    if (latency_samples_ == 0) mix(latency_s_, latency_samples_, seconds - transfer);
  }
}

void NodeHealth::failed(uint64_t asked, double stalled_seconds) {
  std::lock_guard lock(mu_);
  inflight_bytes_ -= std::min(inflight_bytes_, asked);
  if (stalled_seconds > 0) {
    latency_s_ = latency_samples_ == 0 ? stalled_seconds : std::max(latency_s_, stalled_seconds);
    ++latency_samples_;
  }
}

double NodeHealth::expected_seconds(uint64_t bytes) const {
  std::lock_guard lock(mu_);
  if (latency_samples_ == 0 && throughput_samples_ == 0) return 0;
  double t = latency_s_;
  if (throughput_samples_ > 0) t += double(inflight_bytes_ + bytes) / bytes_per_s_;
  return t;
}

void NodeHealth::mark_down(transport::Clock::time_point until) {
  std::lock_guard lock(mu_);
  down_until_ = std::max(down_until_, until);
}

void NodeHealth::clear_down() {
  std::lock_guard lock(mu_);
  down_until_ = {};
}

bool NodeHealth::down(transport::Clock::time_point now) const {
  std::lock_guard lock(mu_);
  return now < down_until_;
}

NodeHealth::Snapshot NodeHealth::snapshot() const {
  std::lock_guard lock(mu_);
  return {latency_s_, bytes_per_s_, latency_samples_ + throughput_samples_, inflight_bytes_};
}

}  // namespace kvstream::cluster
