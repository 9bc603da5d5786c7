// Built-in throughput estimators, the registry, and the per-peer EstimatorSet.
#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <mutex>
#include <shared_mutex>

#include "kvstream/policy.hpp"

namespace kvstream::policy {

Status EstimatorOptions::validate() const {
  if (!std::isfinite(prior_bits_per_second) || prior_bits_per_second < 0)
    return make_status(StatusCode::invalid_argument, "estimator: prior {} bit/s is not a finite value >= 0",
                       prior_bits_per_second);
  if (window == 0) return make_status(StatusCode::invalid_argument, "estimator: window must be >= 1");
  if (!(alpha > 0 && alpha <= 1))
    return make_status(StatusCode::invalid_argument, "estimator: alpha {} is not in (0, 1]", alpha);
  if (!(percentile >= 0 && percentile <= 1))
    return make_status(StatusCode::invalid_argument, "estimator: percentile {} is not in [0, 1]", percentile);
  return {};
}

namespace {

Status check_observation(uint64_t bytes, double start_s, double end_s) {
  if (bytes == 0) return make_status(StatusCode::invalid_argument, "observe: zero bytes");
  if (!std::isfinite(start_s) || !std::isfinite(end_s) || start_s < 0 || end_s < 0)
    return make_status(StatusCode::invalid_argument, "observe: times must be finite and >= 0 (start {} s, end {} s)",
                       start_s, end_s);
  if (!(end_s > start_s))
    return make_status(StatusCode::invalid_argument, "observe: end {} s is not after start {} s", end_s, start_s);
  return {};
}

// Shared machinery: a window of seconds-per-byte samples (for uncertainty and the
// windowed estimators), the prior, and the count. Subclasses give the point estimate.
class BaseEstimator : public Estimator {
 public:
  BaseEstimator(std::string_view name, const EstimatorOptions& o) : name_(name), opt_(o) {}

  Status observe(uint64_t bytes, double start_s, double end_s) override {
    KVS_RETURN_IF_ERROR(check_observation(bytes, start_s, end_s));
    const double spb = (end_s - start_s) / double(bytes);
    samples_.push_back(spb);
    if (samples_.size() > opt_.window) samples_.pop_front();
    ++count_;
    last_end_ = end_s;
    on_sample(spb);
    return {};
  }

  Result<Prediction> predict_at(uint64_t bytes, double /*start_s*/) const override {
    if (bytes == 0) return make_status(StatusCode::invalid_argument, "predict: zero bytes");
    if (count_ == 0) {
      if (opt_.prior_bits_per_second > 0) return Prediction{double(bytes) * 8.0 / opt_.prior_bits_per_second, 0.0};
      return make_status(StatusCode::unavailable, "estimator '{}': nothing observed yet and no prior", name_);
    }
    return Prediction{double(bytes) * spb_estimate(), double(bytes) * spb_stddev()};
  }

  std::string_view name() const noexcept override { return name_; }
  uint64_t observations() const noexcept override { return count_; }

 protected:
  virtual void on_sample(double /*spb*/) {}
  virtual double spb_estimate() const = 0;  // only called with count_ > 0

  double spb_stddev() const {
    const size_t n = samples_.size();
    if (n < 2) return 0;
    double mean = 0;
    for (double s : samples_) mean += s;
    mean /= double(n);
    double var = 0;
    for (double s : samples_) var += (s - mean) * (s - mean);
    return std::sqrt(var / double(n));
  }

  std::string name_;
  EstimatorOptions opt_;
  std::deque<double> samples_;
  uint64_t count_ = 0;
  double last_end_ = 0;
};

class LastEstimator final : public BaseEstimator {
 public:
  using BaseEstimator::BaseEstimator;
 protected:
  double spb_estimate() const override { return samples_.back(); }
};

class EwmaEstimator final : public BaseEstimator {
 public:
  using BaseEstimator::BaseEstimator;
 protected:
  void on_sample(double spb) override { ewma_ = count_ == 1 ? spb : opt_.alpha * spb + (1 - opt_.alpha) * ewma_; }
  double spb_estimate() const override { return ewma_; }
 private:
  double ewma_ = 0;
};

class HarmonicEstimator final : public BaseEstimator {
 public:
  using BaseEstimator::BaseEstimator;
 protected:
  // Harmonic mean of throughputs = 1 / arithmetic mean of seconds per byte.
  double spb_estimate() const override {
    double sum = 0;
    for (double s : samples_) sum += s;
    return sum / double(samples_.size());
  }
};

class PercentileEstimator final : public BaseEstimator {
 public:
  using BaseEstimator::BaseEstimator;
 protected:
  double spb_estimate() const override {
    std::vector<double> rates;
    rates.reserve(samples_.size());
    for (double s : samples_) rates.push_back(1.0 / s);
    std::sort(rates.begin(), rates.end());
    const double pos = opt_.percentile * double(rates.size() - 1);
    const size_t lo = size_t(std::floor(pos));
    const size_t hi = std::min(lo + 1, rates.size() - 1);
    const double rate = rates[lo] + (pos - double(lo)) * (rates[hi] - rates[lo]);
    return 1.0 / rate;
  }
};

class OracleEstimator final : public Estimator {
 public:
  explicit OracleEstimator(std::shared_ptr<const LinkTrace> t) : trace_(std::move(t)) {}
  Status observe(uint64_t bytes, double start_s, double end_s) override {
    KVS_RETURN_IF_ERROR(check_observation(bytes, start_s, end_s));
    ++count_;
    last_end_ = end_s;
    return {};
  }
  Result<Prediction> predict_at(uint64_t bytes, double start_s) const override {
    if (bytes == 0) return make_status(StatusCode::invalid_argument, "predict: zero bytes");
    if (!std::isfinite(start_s)) return make_status(StatusCode::invalid_argument, "predict: non-finite start");
    const double start = start_s < 0 ? last_end_ : start_s;
    KVS_ASSIGN_OR_RETURN(double end, trace_->transfer_end(start, bytes));
    return Prediction{end - start, 0.0};
  }
  std::string_view name() const noexcept override { return "oracle"; }
  uint64_t observations() const noexcept override { return count_; }
 private:
  std::shared_ptr<const LinkTrace> trace_;
  uint64_t count_ = 0;
  double last_end_ = 0;
};

template <typename T>
EstimatorFactory simple_factory(std::string_view name) {
  return [name](const EstimatorOptions& o) -> Result<std::unique_ptr<Estimator>> {
    KVS_RETURN_IF_ERROR(o.validate());
    return std::unique_ptr<Estimator>(std::make_unique<T>(name, o));
  };
}

}  // namespace

struct EstimatorRegistry::Impl {
  mutable std::shared_mutex mu;
  std::map<std::string, EstimatorFactory, std::less<>> factories;
};

EstimatorRegistry::EstimatorRegistry() : impl_(std::make_shared<Impl>()) {
  auto& f = impl_->factories;
  f.emplace("last", simple_factory<LastEstimator>("last"));
  f.emplace("ewma", simple_factory<EwmaEstimator>("ewma"));
  f.emplace("harmonic", simple_factory<HarmonicEstimator>("harmonic"));
  f.emplace("percentile", simple_factory<PercentileEstimator>("percentile"));
  f.emplace("oracle", [](const EstimatorOptions& o) -> Result<std::unique_ptr<Estimator>> {
    KVS_RETURN_IF_ERROR(o.validate());
    if (!o.trace) return make_status(StatusCode::invalid_argument, "estimator 'oracle' needs options.trace");
    KVS_RETURN_IF_ERROR(o.trace->validate().with_context("estimator 'oracle'"));
    return std::unique_ptr<Estimator>(std::make_unique<OracleEstimator>(o.trace));
  });
}

EstimatorRegistry& EstimatorRegistry::global() {
  static EstimatorRegistry registry;
  return registry;
}

Status EstimatorRegistry::add(std::string name, EstimatorFactory factory) {
  if (name.empty()) return make_status(StatusCode::invalid_argument, "register_estimator: empty name");
  if (!factory) return make_status(StatusCode::invalid_argument, "register_estimator '{}': empty factory", name);
  std::unique_lock lock(impl_->mu);
  if (impl_->factories.count(name))
    return make_status(StatusCode::already_exists, "register_estimator: '{}' is already registered", name);
  impl_->factories.emplace(std::move(name), std::move(factory));
  return {};
}

Result<std::unique_ptr<Estimator>> EstimatorRegistry::make(std::string_view name,
                                                           const EstimatorOptions& options) const {
  EstimatorFactory factory;
  {
    std::shared_lock lock(impl_->mu);
    auto it = impl_->factories.find(name);
    if (it == impl_->factories.end()) {
      std::string known;
      for (const auto& [n, _] : impl_->factories) known += (known.empty() ? "" : ", ") + n;
      return make_status(StatusCode::not_found, "no estimator named '{}' (known: {})", name, known);
    }
    factory = it->second;
  }
  auto made = factory(options);
  if (!made.ok()) return made.status();
  if (!made.value())
    return make_status(StatusCode::internal, "estimator factory '{}' returned no estimator", name);
  return made;
}

bool EstimatorRegistry::contains(std::string_view name) const {
  std::shared_lock lock(impl_->mu);
  return impl_->factories.find(name) != impl_->factories.end();
}

std::vector<std::string> EstimatorRegistry::names() const {
  std::shared_lock lock(impl_->mu);
  std::vector<std::string> out;
  for (const auto& [n, _] : impl_->factories) out.push_back(n);
  return out;
}

Status register_estimator(std::string name, EstimatorFactory factory) {
  return EstimatorRegistry::global().add(std::move(name), std::move(factory));
}

Result<std::unique_ptr<Estimator>> make_estimator(std::string_view name, const EstimatorOptions& options) {
  return EstimatorRegistry::global().make(name, options);
}

// ---- EstimatorSet --------------------------------------------------------------------

struct EstimatorSet::Impl {
  struct Entry {
    std::mutex mu;
    std::unique_ptr<Estimator> est;
  };
  std::string name;
  EstimatorOptions options;
  const EstimatorRegistry* registry = nullptr;
  mutable std::shared_mutex mu;  // guards the map; each entry has its own lock
  std::map<std::string, std::unique_ptr<Entry>, std::less<>> peers;

  Result<Entry*> get(std::string_view peer, bool create) {
    if (peer.empty()) return make_status(StatusCode::invalid_argument, "estimator set: empty peer name");
    {
      std::shared_lock lock(mu);
      auto it = peers.find(peer);
      if (it != peers.end()) return it->second.get();
    }
    if (!create) return static_cast<Entry*>(nullptr);
    KVS_ASSIGN_OR_RETURN(auto est, registry->make(name, options));
    std::unique_lock lock(mu);
    auto it = peers.find(peer);
    if (it != peers.end()) return it->second.get();
    auto e = std::make_unique<Entry>();
    e->est = std::move(est);
    Entry* raw = e.get();
    peers.emplace(std::string(peer), std::move(e));
    return raw;
  }
};

EstimatorSet::EstimatorSet(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EstimatorSet::~EstimatorSet() = default;

Result<std::unique_ptr<EstimatorSet>> EstimatorSet::create(std::string name, EstimatorOptions options,
                                                           const EstimatorRegistry& registry) {
  KVS_ASSIGN_OR_RETURN(auto probe, registry.make(name, options));
  (void)probe;
  auto impl = std::make_unique<Impl>();
  impl->name = std::move(name);
  impl->options = std::move(options);
  impl->registry = &registry;
  return std::unique_ptr<EstimatorSet>(new EstimatorSet(std::move(impl)));
}

Status EstimatorSet::observe(std::string_view peer, uint64_t bytes, double start_s, double end_s) {
  KVS_ASSIGN_OR_RETURN(Impl::Entry * e, impl_->get(peer, true));
  std::lock_guard lock(e->mu);
  return e->est->observe(bytes, start_s, end_s);
}

Result<Prediction> EstimatorSet::predict_at(std::string_view peer, uint64_t bytes, double start_s) const {
  KVS_ASSIGN_OR_RETURN(Impl::Entry * e, impl_->get(peer, false));
  if (e == nullptr) {
    // Never observed: answer like a fresh estimator, without keeping it.
    KVS_ASSIGN_OR_RETURN(auto fresh, impl_->registry->make(impl_->name, impl_->options));
    return fresh->predict_at(bytes, start_s);
  }
  std::lock_guard lock(e->mu);
  return e->est->predict_at(bytes, start_s);
}

Status EstimatorSet::with(std::string_view peer, const std::function<void(Estimator&)>& fn) {
  KVS_ASSIGN_OR_RETURN(Impl::Entry * e, impl_->get(peer, true));
  std::lock_guard lock(e->mu);
  if (fn) fn(*e->est);
  return {};
}

std::vector<std::string> EstimatorSet::peers() const {
  std::shared_lock lock(impl_->mu);
  std::vector<std::string> out;
  for (const auto& [p, _] : impl_->peers) out.push_back(p);
  return out;
}

const std::string& EstimatorSet::estimator_name() const noexcept { return impl_->name; }

}  // namespace kvstream::policy
