// Streaming second-moment accumulator for a linear layer's input activations (DESIGN.md §1 step 1,
// §2 M_X). Sums S = sum_t x_t x_t^T are kept in float64 and divided by the token count only when a
// moment is read, so shards can be merged (or all-reduced) exactly by adding sums and counts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "wush/wush.h"

namespace wush {

// BlockDiagonal keeps the C = d_in / G diagonal G x G blocks (all WUSH needs); Full keeps the whole
// d_in x d_in matrix (the GPTQ Hessian, whose diagonal blocks are the same moments).
enum class MomentMode : int { BlockDiagonal = 1, Full = 2 };

// Exported calibrator state: a flat vector<double> that ranks can SUM-all-reduce elementwise.
//
//   [0] r                 replica count: 1 in a fresh export, R after summing R exports
//   [1] r * version       layout version (kCalibratorStateVersion) times r
//   [2] r * mode          MomentMode code (1 = block diagonal, 2 = full) times r
//   [3] r * d_in
//   [4] r * G
//   [5] tokens            total token count (exact as a double up to 2^53)
//   [6 ...] sums          block diagonal: C blocks of G x G, row-major, block after block;
//                         full: d_in x d_in row-major. Both triangles are written (symmetric).
//
// Under an elementwise SUM over R ranks the header fields become R times their value, which the
// reader divides out after checking [0] is a positive integer and each field is an exact multiple;
// the token count and the sums add, which is exactly the merged state. The header fields must
// therefore be identical across ranks (the same layer geometry), which import checks.
inline constexpr double kCalibratorStateVersion = 1.0;
inline constexpr std::size_t kCalibratorStateHeader = 6;

class Calibrator {
public:
    // Throws INVALID_ARGUMENT unless G is a power of two dividing d_in (d_in > 0).
    Calibrator(std::size_t d_in, std::size_t group, MomentMode mode);

    // Streams n_tokens x d_in row-major activations of `dtype`. Rejects a batch holding NaN/Inf
    // (NON_FINITE) or with zero tokens / null data (INVALID_ARGUMENT) before changing any state.
    void add(wush_dtype dtype, const void* x, std::size_t n_tokens);

    // Adds another calibrator's sums and count (same d_in, G and mode, else INVALID_ARGUMENT).
    void merge(const Calibrator& other);

    // Adds sums accumulated elsewhere (the CUDA backend's float64 device sums) for `tokens` more
    // tokens: accumulators() square matrices of side G (block diagonal) or d_in (full), row-major,
    // at least the upper triangle valid. INVALID_ARGUMENT for a wrong size or non-finite sums.
    void add_sums(std::span<const double> sums, std::uint64_t tokens);

    std::size_t d_in() const noexcept { return d_in_; }
    std::size_t group() const noexcept { return group_; }
    std::size_t blocks() const noexcept { return d_in_ / group_; }
    MomentMode mode() const noexcept { return mode_; }
    std::uint64_t tokens() const noexcept { return tokens_; }

    // M_X of diagonal block `block` (G x G row-major, symmetric) = S_block / tokens. Works in both
    // modes. INVALID_ARGUMENT for a bad block or before any token was added.
    std::vector<double> second_moment(std::size_t block) const;
    // The whole d_in x d_in moment (Full mode only).
    std::vector<double> full_second_moment() const;

    // Raw state (see the layout above) and its size for a given geometry.
    std::vector<double> export_state() const;
    static std::size_t state_size(std::size_t d_in, std::size_t group, MomentMode mode);
    // Validates everything (header, integer counts, finite sums) and throws INVALID_ARGUMENT on any
    // violation; never reads past state.size().
    static Calibrator import_state(std::span<const double> state);

private:
    // Upper-triangle accumulator of block b (full mode: b must be 0, the whole matrix).
    double* sums_of(std::size_t b) noexcept { return sums_.data() + b * side() * side(); }
    const double* sums_of(std::size_t b) const noexcept { return sums_.data() + b * side() * side(); }
    std::size_t side() const noexcept { return mode_ == MomentMode::Full ? d_in_ : group_; }
    std::size_t accumulators() const noexcept { return mode_ == MomentMode::Full ? 1 : blocks(); }
    // Sums with both triangles filled (dsyrk only maintains the upper one).
    std::vector<double> symmetric_sums() const;

    std::size_t d_in_;
    std::size_t group_;
    MomentMode mode_;
    std::uint64_t tokens_ = 0;
    std::vector<double> sums_;  // accumulators() square matrices, upper triangle valid
};

}  // namespace wush
