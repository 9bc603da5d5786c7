// Karhunen-Loeve transform: the orthogonal basis that decorrelates a block of
// channels. K channels of a layer are strongly correlated (they are projections of
// the same hidden state), so coding them in this basis needs fewer bits for the same
// weighted error; the profile uses it only where it measures a gain.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvstream::codec {

/// Eigenvectors of the symmetric n x n matrix `cov` (row-major), by cyclic Jacobi
/// rotations. Returns U (row-major n x n) whose column j is the j-th eigenvector, with
/// columns ordered by decreasing eigenvalue and each column's largest entry positive
/// (a deterministic basis). `eigenvalues` receives them in the same order.
std::vector<float> klt_basis(const std::vector<double>& cov, uint32_t n, std::vector<double>* eigenvalues = nullptr);

/// y = U^T z for one block (analysis, encoder side).
inline void klt_forward(const float* u, uint32_t n, const float* z, float* y) {
  for (uint32_t j = 0; j < n; ++j) y[j] = 0.0f;
  for (uint32_t c = 0; c < n; ++c) {
    const float zc = z[c];
    const float* row = u + size_t(c) * n;
    for (uint32_t j = 0; j < n; ++j) y[j] += row[j] * zc;
  }
}

}  // namespace kvstream::codec
