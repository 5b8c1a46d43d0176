#include "transforms/basis.h"

#include <bit>
#include <cmath>
#include <string>

#include "common/error.h"
#include "transforms/rng.h"

namespace wush {

std::vector<double> hadamard_matrix(std::size_t g) {
    require(g != 0 && (g & (g - 1)) == 0, "Hadamard size " + std::to_string(g) + " is not a power of two");
    const double inv_sqrt = 1.0 / std::sqrt(double(g));
    std::vector<double> h(g * g);
    for (std::size_t i = 0; i < g; ++i)
        for (std::size_t j = 0; j < g; ++j) h[i * g + j] = (std::popcount(i & j) & 1) ? -inv_sqrt : inv_sqrt;
    return h;
}

std::vector<double> identity_matrix(std::size_t g) {
    std::vector<double> m(g * g, 0.0);
    for (std::size_t i = 0; i < g; ++i) m[i * g + i] = 1.0;
    return m;
}

std::vector<double> random_rotation(std::size_t g, std::uint64_t seed) {
    require(g > 0, "random rotation: size must be positive");
    // A is drawn row by row; its columns are held transposed (cols[k * g + i] = A[i][k]) so each
    // is contiguous. Column k of Q is column k of A minus its projections on columns 0..k-1 of Q,
    // normalized: the QR factorization whose R has a positive diagonal. Projecting out twice
    // ("twice is enough") keeps Q orthogonal to rounding even where A is ill-conditioned.
    rng::Rng rng(seed);
    std::vector<double> cols(g * g);
    for (std::size_t i = 0; i < g; ++i)
        for (std::size_t k = 0; k < g; ++k) cols[k * g + i] = rng.gaussian();
    for (std::size_t k = 0; k < g; ++k) {
        double* v = cols.data() + k * g;
        for (int pass = 0; pass < 2; ++pass)
            for (std::size_t j = 0; j < k; ++j) {
                const double* q = cols.data() + j * g;
                double d = 0.0;
                for (std::size_t i = 0; i < g; ++i) d += q[i] * v[i];
                for (std::size_t i = 0; i < g; ++i) v[i] -= d * q[i];
            }
        double norm = 0.0;
        for (std::size_t i = 0; i < g; ++i) norm += v[i] * v[i];
        norm = std::sqrt(norm);
        // A Gaussian matrix is singular with probability zero; a zero column would be a bug.
        if (!(norm > 0.0)) fail(WUSH_ERR_NUMERICAL, "random rotation: the Gaussian matrix is singular");
        for (std::size_t i = 0; i < g; ++i) v[i] /= norm;
    }
    std::vector<double> q(g * g);
    for (std::size_t i = 0; i < g; ++i)
        for (std::size_t k = 0; k < g; ++k) q[i * g + k] = cols[k * g + i];
    return q;
}

}  // namespace wush
