#include "transforms/basis.h"

#include <lapacke.h>

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
    rng::Rng rng(seed);
    std::vector<double> a(g * g);
    for (double& v : a) v = rng.gaussian();
    const int n = int(g);
    std::vector<double> tau(g);
    if (LAPACKE_dgeqrf(LAPACK_ROW_MAJOR, n, n, a.data(), n, tau.data()) != 0)
        fail(WUSH_ERR_NUMERICAL, "random rotation: dgeqrf failed");
    // R's diagonal must be read before dorgqr overwrites a with Q.
    std::vector<double> sign(g);
    for (std::size_t k = 0; k < g; ++k) sign[k] = a[k * g + k] < 0.0 ? -1.0 : 1.0;
    if (LAPACKE_dorgqr(LAPACK_ROW_MAJOR, n, n, n, a.data(), n, tau.data()) != 0)
        fail(WUSH_ERR_NUMERICAL, "random rotation: dorgqr failed");
    for (std::size_t i = 0; i < g; ++i)
        for (std::size_t k = 0; k < g; ++k) a[i * g + k] *= sign[k];
    return a;
}

}  // namespace wush
