// A seeded generator of LLM-like linear layers for tests, benchmarks and `wush` demos, so that the
// transform comparisons can run without model files. Deterministic given the seed on every
// platform (std::mt19937_64 plus the library's own Gaussian/Student-t sampling, transforms/rng.h).
//
// Activations (token t, channel j):  x_tj = c_j * ( sum_r F_jr g_tr + 0.5 e_tj )
//   g_tr, e_tj  iid Student-t(nu)        heavy-tailed latent factors and per-element noise
//   F (d_in x rank) iid N(0, 1/rank)     shared factors: low-rank + diagonal covariance, so the
//                                        channels inside a block are correlated
//   c_j = exp(0.5 z_j), z_j ~ N(0,1)     log-normal channel scales ...
//         * outlier_scale                ... times a large factor on `outlier_channels` channels
//                                        (massive-activation channels), at seeded positions
// Weights (output row o, input channel j):
//   W_oj = a_o * b_j * ( Z_oj + sum_r P_or Q_jr ) / sqrt(d_in)
//   Z iid N(0,1); P (d_out x w_rank) iid N(0,1); Q (d_in x w_rank) iid N(0, 0.5/w_rank)
//   a_o = exp(0.3 z), b_j = exp(0.5 z)   log-normal row and column scales
// Calibration and held-out tokens come from the same distribution through separate streams; the
// weights, factors and scales do not depend on the token counts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace wush::eval {

struct SyntheticLayerSpec {
    std::size_t d_in = 256;
    std::size_t d_out = 512;
    std::size_t n_tokens = 2048;   // calibration tokens
    std::size_t n_heldout = 1024;  // held-out tokens for the loss
    std::uint64_t seed = 1;
    int student_nu = 4;
    std::size_t rank = 16;        // activation factor rank
    std::size_t weight_rank = 8;  // weight low-rank part
    std::size_t outlier_channels = 4;
    double outlier_scale = 30.0;
};

struct SyntheticLayer {
    SyntheticLayerSpec spec;
    std::vector<float> weight;       // d_out x d_in
    std::vector<float> calibration;  // n_tokens x d_in
    std::vector<float> heldout;      // n_heldout x d_in
};

// Named shapes (d_in x d_out): "small_256x512", "small_512x256" (tests), "4096x4096",
// "4096x14336", "14336x4096" (realistic LLM projections), "384x384", "384x1536", "1536x384"
// (a small encoder's: MiniLM's attention, FFN up and FFN down), "576x576", "576x192", "576x1536",
// "1536x576" (a small decoder's: SmolLM2-135M's q/o, k/v, gate/up and down projections).
// INVALID_ARGUMENT for other names.
// The preset names above, in that order.
std::span<const char* const> synthetic_preset_names();

SyntheticLayerSpec synthetic_preset(std::string_view name, std::size_t n_tokens, std::size_t n_heldout,
                                    std::uint64_t seed);

SyntheticLayer generate_layer(const SyntheticLayerSpec& spec);
// The same into caller buffers of d_out x d_in, n_tokens x d_in and n_heldout x d_in floats
// (heldout/calibration may be null when their count is 0), with float64 temporaries of
// d_out x d_in (the weight) and at most 1024 tokens: the memory a caller must plan for.
void generate_layer(const SyntheticLayerSpec& spec, float* weight, float* calibration, float* heldout);

}  // namespace wush::eval
