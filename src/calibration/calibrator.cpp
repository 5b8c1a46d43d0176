#include "calibration/calibrator.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "common/checked_math.h"
#include "common/dtype.h"
#include "common/error.h"

namespace wush {

namespace {

// Tokens converted to float64 per dsyrk call: large enough for BLAS-3 efficiency, small enough that
// the tile (tile x d_in doubles) stays a few MiB for realistic d_in.
constexpr std::size_t kTileTokens = 256;
// Token counts travel as doubles in the exported state; beyond 2^53 they would stop being exact.
constexpr double kMaxExactCount = 9007199254740992.0;

bool is_power_of_two(std::size_t v) { return v != 0 && (v & (v - 1)) == 0; }

void check_geometry(std::size_t d_in, std::size_t group, MomentMode mode) {
    require(d_in > 0, "calibrator: d_in must be positive");
    require(is_power_of_two(group), "calibrator: block size G = " + std::to_string(group) + " is not a power of two");
    require(d_in % group == 0,
            "calibrator: G = " + std::to_string(group) + " does not divide d_in = " + std::to_string(d_in));
    require(mode == MomentMode::BlockDiagonal || mode == MomentMode::Full, "calibrator: unknown moment mode");
}

// A header field of a possibly all-reduced state: value * replicas must divide back exactly.
double divided_field(double stored, double replicas, const char* what) {
    const double v = stored / replicas;
    require(std::isfinite(v) && v == std::floor(v) && v * replicas == stored,
            std::string("calibrator state: field ") + what + " is not a whole multiple of the replica count");
    return v;
}

}  // namespace

Calibrator::Calibrator(std::size_t d_in, std::size_t group, MomentMode mode) : d_in_(d_in), group_(group), mode_(mode) {
    check_geometry(d_in, group, mode);
    sums_.assign(checked_mul(checked_mul(accumulators(), side(), "moment size"), side(), "moment size"), 0.0);
}

std::size_t Calibrator::state_size(std::size_t d_in, std::size_t group, MomentMode mode) {
    check_geometry(d_in, group, mode);
    const std::size_t side = mode == MomentMode::Full ? d_in : group;
    const std::size_t count = mode == MomentMode::Full ? 1 : d_in / group;
    return checked_add(kCalibratorStateHeader, checked_mul(checked_mul(count, side, "state"), side, "state"), "state");
}

void Calibrator::add(wush_dtype dtype, const void* x, std::size_t n_tokens) {
    require(n_tokens > 0, "calibrator add: zero tokens");
    require(x != nullptr, "calibrator add: activations pointer is NULL");
    dtype_size(dtype);  // rejects an unknown dtype before anything else
    require(double(tokens_) + double(n_tokens) <= kMaxExactCount, "calibrator add: token count would exceed 2^53");
    // Validate the whole batch first: a rejected batch must leave the state untouched.
    require_finite(dtype, x, n_tokens, d_in_, "calibration activations");

    std::vector<float> row(d_in_);
    std::vector<double> tile(checked_mul(std::min(n_tokens, kTileTokens), d_in_, "tile size"));
    for (std::size_t t0 = 0; t0 < n_tokens; t0 += kTileTokens) {
        const std::size_t rows = std::min(kTileTokens, n_tokens - t0);
        for (std::size_t r = 0; r < rows; ++r) {
            to_float(dtype, x, (t0 + r) * d_in_, row);
            std::copy(row.begin(), row.end(), tile.begin() + r * d_in_);
        }
        accumulate_tile(tile.data(), rows);
    }
    tokens_ += n_tokens;
}

void Calibrator::accumulate_tile(const double* tile, std::size_t rows) {
    const int k = int(rows);
    const int lda = int(d_in_);
    if (mode_ == MomentMode::Full) {
        // One BLAS-3 rank-k update of the whole matrix (OpenBLAS threads it internally).
        cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, int(d_in_), k, 1.0, tile, lda, 1.0, sums_.data(), lda);
        return;
    }
    // Blocks are independent accumulators: spread them over threads (OpenBLAS runs each call
    // single-threaded inside a parallel region, so there is no oversubscription).
    const std::size_t c = blocks();
    const int g = int(group_);
#pragma omp parallel for schedule(static)
    for (std::size_t b = 0; b < c; ++b)
        cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, g, k, 1.0, tile + b * group_, lda, 1.0, sums_of(b), g);
}

void Calibrator::merge(const Calibrator& other) {
    require(other.d_in_ == d_in_ && other.group_ == group_ && other.mode_ == mode_,
            "calibrator merge: geometry differs (d_in " + std::to_string(d_in_) + " vs " + std::to_string(other.d_in_) +
                ", G " + std::to_string(group_) + " vs " + std::to_string(other.group_) + ", or moment mode)");
    require(double(tokens_) + double(other.tokens_) <= kMaxExactCount, "calibrator merge: token count would exceed 2^53");
    // Element i is read before it is written, so even a self-merge (doubling) is safe in place.
    const double* theirs = other.sums_.data();
    for (std::size_t i = 0; i < sums_.size(); ++i) sums_[i] += theirs[i];
    tokens_ += other.tokens_;
}

std::vector<double> Calibrator::symmetric_sums() const {
    std::vector<double> out(sums_.size());
    const std::size_t s = side();
    for (std::size_t b = 0; b < accumulators(); ++b) {
        const double* in = sums_of(b);
        double* o = out.data() + b * s * s;
        for (std::size_t i = 0; i < s; ++i)
            for (std::size_t j = i; j < s; ++j) o[i * s + j] = o[j * s + i] = in[i * s + j];
    }
    return out;
}

std::vector<double> Calibrator::second_moment(std::size_t block) const {
    require(block < blocks(), "calibrator: block " + std::to_string(block) + " out of range (" +
                                  std::to_string(blocks()) + " blocks)");
    require(tokens_ > 0, "calibrator: no tokens added yet, the second moment is undefined");
    const std::size_t g = group_;
    const double inv_n = 1.0 / double(tokens_);
    // Block b's diagonal block: its own accumulator, or a diagonal window of the full matrix.
    const std::size_t ld = side();
    const double* base = mode_ == MomentMode::Full ? sums_.data() + block * g * ld + block * g : sums_of(block);
    std::vector<double> m(g * g);
    for (std::size_t i = 0; i < g; ++i)
        for (std::size_t j = i; j < g; ++j) m[i * g + j] = m[j * g + i] = base[i * ld + j] * inv_n;
    return m;
}

std::vector<double> Calibrator::full_second_moment() const {
    require(mode_ == MomentMode::Full, "calibrator: the full second moment needs MomentMode::Full");
    require(tokens_ > 0, "calibrator: no tokens added yet, the second moment is undefined");
    std::vector<double> m = symmetric_sums();
    const double inv_n = 1.0 / double(tokens_);
    for (double& v : m) v *= inv_n;
    return m;
}

std::vector<double> Calibrator::export_state() const {
    std::vector<double> state;
    state.reserve(kCalibratorStateHeader + sums_.size());
    state.insert(state.end(), {1.0, kCalibratorStateVersion, double(int(mode_)), double(d_in_), double(group_),
                               double(tokens_)});
    const std::vector<double> sym = symmetric_sums();
    state.insert(state.end(), sym.begin(), sym.end());
    return state;
}

Calibrator Calibrator::import_state(std::span<const double> state) {
    require(state.size() >= kCalibratorStateHeader, "calibrator state: shorter than its header");
    const double r = state[0];
    require(std::isfinite(r) && r >= 1.0 && r == std::floor(r), "calibrator state: replica count is not a positive integer");
    require(divided_field(state[1], r, "version") == kCalibratorStateVersion, "calibrator state: unknown layout version");
    const double mode = divided_field(state[2], r, "mode");
    require(mode == 1.0 || mode == 2.0, "calibrator state: unknown moment mode");
    const double d_in = divided_field(state[3], r, "d_in");
    const double group = divided_field(state[4], r, "G");
    require(d_in >= 1.0 && d_in <= 1048576.0 && group >= 1.0 && group <= d_in, "calibrator state: d_in or G out of range");
    const auto mode_enum = MomentMode(int(mode));
    // Size check before constructing: a corrupt header must not trigger a huge allocation.
    const std::size_t expected = state_size(std::size_t(d_in), std::size_t(group), mode_enum);
    require(state.size() == expected, "calibrator state: size " + std::to_string(state.size()) +
                                          " does not match its header (" + std::to_string(expected) + ")");
    Calibrator c{std::size_t(d_in), std::size_t(group), mode_enum};
    const double tokens = state[5];
    require(std::isfinite(tokens) && tokens >= 0.0 && tokens == std::floor(tokens) && tokens <= kMaxExactCount,
            "calibrator state: token count is not a whole number in [0, 2^53]");
    const std::span<const double> sums = state.subspan(kCalibratorStateHeader);
    require(std::all_of(sums.begin(), sums.end(), [](double v) { return std::isfinite(v); }),
            "calibrator state: sums hold NaN or Inf");
    c.tokens_ = std::uint64_t(tokens);
    std::copy(sums.begin(), sums.end(), c.sums_.begin());
    return c;
}

}  // namespace wush
