// Seeded random numbers whose values depend only on the seed: std::mt19937_64 is fully specified
// by the standard, but std::normal_distribution & co. are not (libstdc++ and libc++ differ), so the
// Gaussian and Student-t samplers are written out here (Box-Muller; t = z / sqrt(chi2_nu / nu)).
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>

namespace wush::rng {

// splitmix64 finalizer: decorrelates derived seeds (seed + block index) before they reach mt19937.
inline std::uint64_t mix_seed(std::uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

class Rng {
public:
    explicit Rng(std::uint64_t seed) : engine_(mix_seed(seed)) {}

    // Uniform in the open interval (0, 1) from the top 53 bits (never 0, so log() is safe).
    double uniform() { return (double(engine_() >> 11) + 0.5) * 0x1p-53; }

    double gaussian() {
        if (has_spare_) {
            has_spare_ = false;
            return spare_;
        }
        const double radius = std::sqrt(-2.0 * std::log(uniform()));
        const double angle = 2.0 * std::numbers::pi * uniform();
        spare_ = radius * std::sin(angle);
        has_spare_ = true;
        return radius * std::cos(angle);
    }

    // Student-t with integer nu degrees of freedom (heavy tails for small nu).
    double student_t(int nu) {
        double chi2 = 0.0;
        for (int k = 0; k < nu; ++k) {
            const double z = gaussian();
            chi2 += z * z;
        }
        return gaussian() / std::sqrt(chi2 / nu);
    }

private:
    std::mt19937_64 engine_;
    double spare_ = 0.0;
    bool has_spare_ = false;
};

}  // namespace wush::rng
