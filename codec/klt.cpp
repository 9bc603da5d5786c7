#include "codec/klt.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kvstream::codec {

std::vector<float> klt_basis(const std::vector<double>& cov, uint32_t n, std::vector<double>* eigenvalues) {
  std::vector<double> a = cov, v(size_t(n) * n, 0.0);
  for (uint32_t i = 0; i < n; ++i) v[size_t(i) * n + i] = 1.0;
  auto A = [&](uint32_t r, uint32_t c) -> double& { return a[size_t(r) * n + c]; };
  for (int sweep = 0; sweep < 50; ++sweep) {
    double off = 0, total = 0;
    for (uint32_t p = 0; p < n; ++p)
      for (uint32_t q = 0; q < n; ++q) (p == q ? total : off) += A(p, q) * A(p, q);
    if (off <= 1e-22 * (total + off)) break;
    for (uint32_t p = 0; p + 1 < n; ++p)
      for (uint32_t q = p + 1; q < n; ++q) {
        const double apq = A(p, q);
        if (std::fabs(apq) < 1e-300) continue;
        const double theta = (A(q, q) - A(p, p)) / (2.0 * apq);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1.0));
        const double c = 1.0 / std::sqrt(t * t + 1.0), s = t * c;
        for (uint32_t k = 0; k < n; ++k) {  // A = J^T A J
          const double akp = A(k, p), akq = A(k, q);
          A(k, p) = c * akp - s * akq;
          A(k, q) = s * akp + c * akq;
        }
        for (uint32_t k = 0; k < n; ++k) {
          const double apk = A(p, k), aqk = A(q, k);
          A(p, k) = c * apk - s * aqk;
          A(q, k) = s * apk + c * aqk;
        }
        for (uint32_t k = 0; k < n; ++k) {
          const double vkp = v[size_t(k) * n + p], vkq = v[size_t(k) * n + q];
          v[size_t(k) * n + p] = c * vkp - s * vkq;
          v[size_t(k) * n + q] = s * vkp + c * vkq;
        }
      }
  }
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t x, uint32_t y) { return A(x, x) > A(y, y); });
  std::vector<float> u(size_t(n) * n);
  if (eigenvalues) eigenvalues->resize(n);
  for (uint32_t j = 0; j < n; ++j) {
    const uint32_t src = order[j];
    uint32_t big = 0;
    for (uint32_t k = 1; k < n; ++k)
      if (std::fabs(v[size_t(k) * n + src]) > std::fabs(v[size_t(big) * n + src])) big = k;
    const double sign = v[size_t(big) * n + src] < 0 ? -1.0 : 1.0;
    for (uint32_t k = 0; k < n; ++k) u[size_t(k) * n + j] = float(sign * v[size_t(k) * n + src]);
    if (eigenvalues) (*eigenvalues)[j] = A(src, src);
  }
  return u;
}

}  // namespace kvstream::codec
