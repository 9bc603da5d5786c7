// Test doubles of the policy tests: a fixed-rate estimator (to test choosers and
// planners alone) and Status printing for EXPECT_* << status.
#pragma once

#include <ostream>

#include "kvstream/policy.hpp"

namespace kvstream {
inline std::ostream& operator<<(std::ostream& os, const Status& s) { return os << s.to_string(); }
}  // namespace kvstream

namespace kvstream::policy::test {

/// Predicts bytes x 8 / bps seconds, with uncertainty rel_unc of that; bps <= 0:
/// unavailable (nothing observed).
class FixedEstimator final : public Estimator {
 public:
  FixedEstimator(double bps, double rel_unc = 0) : bps_(bps), unc_(rel_unc) {}
  Status observe(uint64_t, double, double) override { return {}; }
  Result<Prediction> predict_at(uint64_t bytes, double) const override {
    if (bps_ <= 0) return Status(StatusCode::unavailable, "none");
    const double s = double(bytes) * 8 / bps_;
    return Prediction{s, s * unc_};
  }
  std::string_view name() const noexcept override { return "fixed"; }
  uint64_t observations() const noexcept override { return 0; }

 private:
  double bps_, unc_;
};

}  // namespace kvstream::policy::test
