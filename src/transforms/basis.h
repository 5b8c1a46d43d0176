// The data-free G x G transforms: the normalized Sylvester Hadamard matrix (WUSH's only
// data-agnostic factor) and seeded Haar-random rotations (the "R" baseline). Row-major float64.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace wush {

// H[i][j] = (-1)^popcount(i & j) / sqrt(g); symmetric and orthogonal. g must be a power of two.
std::vector<double> hadamard_matrix(std::size_t g);

// A g x g orthogonal matrix drawn from the Haar measure: the Q of the QR factorization of a
// Gaussian matrix whose R has a positive diagonal (without that sign rule Q would be biased), by
// Gram-Schmidt with reorthogonalization in float64. The same seed gives the same matrix on every
// platform (own Gaussian sampler, see rng.h, and no BLAS or LAPACK): the search draws thousands of
// these of size 16, where LAPACK's per-call cost was most of the time.
std::vector<double> random_rotation(std::size_t g, std::uint64_t seed);

// Row-major identity.
std::vector<double> identity_matrix(std::size_t g);

}  // namespace wush
