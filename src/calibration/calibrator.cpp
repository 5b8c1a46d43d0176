#include "calibration/calibrator.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "common/checked_math.h"
#include "common/dtype.h"
#include "common/error.h"

namespace wush {

namespace {

// Block-diagonal mode: tokens per dsyrk call (its rank k), and the float64 panel scratch of one
// thread (a chunk of its blocks' columns of one token tile), sized to stay in the core's L2.
constexpr std::size_t kBlockTileTokens = 256;
constexpr std::size_t kPanelDoubles = 32768;  // 256 KiB
// Full mode: tokens converted to float64 per whole-matrix dsyrk call. The accumulator is
// d_in^2 doubles and every call reads and writes its upper triangle, so the rank should be large
// enough to amortize that traffic, while the tile (tile x d_in doubles) stays a small fraction of it.
constexpr std::size_t kFullTileTokens = 256;
// Token counts travel as doubles in the exported state; beyond 2^53 they would stop being exact.
constexpr double kMaxExactCount = 9007199254740992.0;

bool is_power_of_two(std::size_t v) {
    return v != 0 && (v & (v - 1)) == 0;
}

void check_geometry(std::size_t d_in, std::size_t group, MomentMode mode) {
    require(d_in > 0, "calibrator: d_in must be positive");
    require(is_power_of_two(group), "calibrator: block size G = " + std::to_string(group) + " is not a power of two");
    require(group <= kMaxGroupSize,
            "calibrator: block size G = " + std::to_string(group) + " exceeds " + std::to_string(kMaxGroupSize));
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

// Rows [t0, t0 + rows) of the n x cols activations, converted to float64 into `out` (rows x cols),
// the rows split over the threads.
void convert_rows(wush_dtype dtype, const void* x, std::size_t t0, std::size_t rows, std::size_t cols, double* out) {
    const bool f32 = dtype == WUSH_DTYPE_F32;
    std::vector<float> buf(f32 ? 0 : cols * std::size_t(omp_get_max_threads()));
#pragma omp parallel for schedule(static)
    for (std::size_t r = 0; r < rows; ++r) {
        const float* src = static_cast<const float*>(x) + (t0 + r) * cols;
        if (!f32) {
            float* row = buf.data() + std::size_t(omp_get_thread_num()) * cols;
            to_float(dtype, x, (t0 + r) * cols, std::span<float>(row, cols));
            src = row;
        }
        double* dst = out + r * cols;
        for (std::size_t j = 0; j < cols; ++j) dst[j] = src[j];
    }
}

// A batch's arguments: some tokens, a pointer, a known dtype (checked before anything else).
void require_batch(wush_dtype dtype, const void* x, std::size_t n_tokens, const std::string& what) {
    require(n_tokens > 0, what + ": zero tokens");
    require(x != nullptr, what + ": activations pointer is NULL");
    dtype_size(dtype);  // rejects an unknown dtype
}

// require_finite over the whole batch with the scan split over the threads; on a hit the serial
// check runs again so that the error names the first bad element exactly as require_finite does.
void require_finite_batch(wush_dtype dtype, const void* x, std::size_t rows, std::size_t cols) {
    constexpr std::size_t kChunkRows = 64;
    const std::size_t chunks = (rows + kChunkRows - 1) / kChunkRows;
    const std::size_t esize = dtype_size(dtype);
    bool bad = false;
#pragma omp parallel for schedule(static) reduction(|| : bad)
    for (std::size_t ch = 0; ch < chunks; ++ch) {
        const std::size_t r0 = ch * kChunkRows, n = std::min(kChunkRows, rows - r0);
        if (find_non_finite(dtype, static_cast<const char*>(x) + r0 * cols * esize, n * cols)) bad = true;
    }
    if (bad) require_finite(dtype, x, rows, cols, "calibration activations");
}

}  // namespace

void Calibrator::set_sample_capacity(std::size_t k) {
    require(tokens_ == 0, "calibrator: the token sample's size must be set before any token is added");
    sample_ = TokenSample(d_in_, k);
}

void Calibrator::set_validation_capacity(std::size_t k) {
    require(validation_.count() == 0,
            "calibrator: the validation sample's size must be set before any validation token is added");
    validation_ = TokenSample(d_in_, k);
}

void Calibrator::add_validation(wush_dtype dtype, const void* x, std::size_t n_tokens) {
    require(validation_.capacity() > 0,
            "calibrator: no validation sample to add to (set its size first: wush_calibrator_set_validation_size)");
    require_batch(dtype, x, n_tokens, "calibrator add_validation");
    require_finite_batch(dtype, x, n_tokens, d_in_);
    validation_.offer_rows(dtype, x, n_tokens);
}

Calibrator::Calibrator(std::size_t d_in, std::size_t group, MomentMode mode) : d_in_(d_in), group_(group), mode_(mode) {
    check_geometry(d_in, group, mode);
    sample_ = TokenSample(d_in, 0);
    validation_ = TokenSample(d_in, 0);
    sums_.assign(checked_mul(checked_mul(accumulators(), side(), "moment size"), side(), "moment size"), 0.0);
}

std::size_t Calibrator::state_size(std::size_t d_in, std::size_t group, MomentMode mode, std::size_t sample_capacity,
                                   std::size_t validation_capacity) {
    check_geometry(d_in, group, mode);
    const std::size_t side = mode == MomentMode::Full ? d_in : group;
    const std::size_t count = mode == MomentMode::Full ? 1 : d_in / group;
    const std::size_t v1 =
        checked_add(kCalibratorStateHeader, checked_mul(checked_mul(count, side, "state"), side, "state"), "state");
    if (sample_capacity == 0 && validation_capacity == 0) return v1;
    const std::size_t v2 = checked_add(v1, TokenSample::state_size(sample_capacity, d_in), "state");
    if (validation_capacity == 0) return v2;
    return checked_add(v2, TokenSample::state_size(validation_capacity, d_in), "state");
}

namespace {

// Full mode: sums (d_in x d_in, upper triangle) += X^T X, tile by tile.
void accumulate_full(std::size_t d_in_, double* sums, wush_dtype dtype, const void* x, std::size_t n_tokens) {
    const std::size_t tile_tokens = kFullTileTokens;
    std::vector<double> tile(checked_mul(std::min(n_tokens, tile_tokens), d_in_, "tile size"));
    const int lda = int(d_in_);
    for (std::size_t t0 = 0; t0 < n_tokens; t0 += tile_tokens) {
        const std::size_t rows = std::min(tile_tokens, n_tokens - t0);
        convert_rows(dtype, x, t0, rows, d_in_, tile.data());
        // One BLAS-3 rank-k update of the whole matrix (OpenBLAS threads it internally).
        cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, lda, int(rows), 1.0, tile.data(), lda, 1.0, sums, lda);
    }
}

// Block-diagonal mode: sums (C blocks of G x G, upper triangles) += X_b^T X_b per block b.
void accumulate_blocks(std::size_t d_in_, std::size_t g, double* sums, wush_dtype dtype, const void* x,
                       std::size_t n_tokens) {
    // Each thread owns a contiguous range of blocks for the whole batch (no barrier, no shared
    // writes). It walks the tokens in tiles; per tile and per chunk of its blocks it converts the
    // chunk's columns to float64 into contiguous per-block panels (tile x G, lda = G), small enough
    // to stay in cache, and runs one dsyrk per block on them. The panels are read by BLAS with unit
    // stride instead of a d_in stride, which is what keeps the blocks' DSYRKs fast.
    const std::size_t c = d_in_ / g;
    const std::size_t tile_tokens = std::min(n_tokens, kBlockTileTokens);
    const std::size_t chunk = std::clamp<std::size_t>(kPanelDoubles / (tile_tokens * g), 1, c);
    const int threads = std::max(1, std::min(omp_get_max_threads(), int(c)));
    const std::size_t per_thread = checked_mul(checked_mul(tile_tokens, chunk, "panel size"), g, "panel size");
    // Scratch allocated here, not inside the parallel region (no exception may escape it).
    std::vector<double> panels(checked_mul(per_thread, std::size_t(threads), "panel size"));
    std::vector<float> rows_f(dtype == WUSH_DTYPE_F32 ? 0 : chunk * g * std::size_t(threads));
    const int ig = int(g);
#pragma omp parallel num_threads(threads)
    {
        const std::size_t id = std::size_t(omp_get_thread_num()), nt = std::size_t(omp_get_num_threads());
        const std::size_t b_begin = c * id / nt, b_end = c * (id + 1) / nt;
        double* panel = panels.data() + id * per_thread;
        float* row_buf = rows_f.empty() ? nullptr : rows_f.data() + id * chunk * g;
        for (std::size_t t0 = 0; t0 < n_tokens; t0 += tile_tokens) {
            const std::size_t rows = std::min(tile_tokens, n_tokens - t0);
            for (std::size_t b0 = b_begin; b0 < b_end; b0 += chunk) {
                const std::size_t nb = std::min(chunk, b_end - b0), cols = nb * g;
                for (std::size_t r = 0; r < rows; ++r) {
                    const std::size_t offset = (t0 + r) * d_in_ + b0 * g;
                    const float* src = static_cast<const float*>(x) + offset;
                    if (row_buf) {
                        to_float(dtype, x, offset, std::span<float>(row_buf, cols));
                        src = row_buf;
                    }
                    for (std::size_t k = 0; k < nb; ++k) {
                        double* dst = panel + k * rows * g + r * g;
                        for (std::size_t j = 0; j < g; ++j) dst[j] = src[k * g + j];
                    }
                }
                for (std::size_t k = 0; k < nb; ++k)
                    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, ig, int(rows), 1.0, panel + k * rows * g, ig,
                                1.0, sums + (b0 + k) * g * g, ig);
            }
        }
    }
}

}  // namespace

void Calibrator::add(wush_dtype dtype, const void* x, std::size_t n_tokens, std::size_t sequence_length) {
    require_batch(dtype, x, n_tokens, "calibrator add");
    require(sequence_length == 0 || n_tokens % sequence_length == 0, "calibrator add: " + std::to_string(n_tokens) +
                                                                         " tokens are not whole sequences of " +
                                                                         std::to_string(sequence_length));
    require(double(tokens_) + double(n_tokens) <= kMaxExactCount, "calibrator add: token count would exceed 2^53");
    // Validate the whole batch first: a rejected batch must leave the state untouched.
    require_finite_batch(dtype, x, n_tokens, d_in_);
    if (document_) sample_.offer_document(dtype, x, n_tokens, *document_);
    else sample_.offer_rows(dtype, x, n_tokens, sequence_length);
    if (mode_ == MomentMode::Full) accumulate_full(d_in_, sums_.data(), dtype, x, n_tokens);
    else accumulate_blocks(d_in_, group_, sums_.data(), dtype, x, n_tokens);
    tokens_ += n_tokens;
}

void Calibrator::add_sums(std::span<const double> sums, std::uint64_t tokens) {
    require(sums.size() == sums_.size(), "calibrator: add_sums got " + std::to_string(sums.size()) +
                                             " sums, expected " + std::to_string(sums_.size()));
    require(tokens > 0, "calibrator: add_sums needs a positive token count");
    for (double v : sums) require(std::isfinite(v), "calibrator: add_sums got a non-finite sum");
    for (std::size_t i = 0; i < sums_.size(); ++i) sums_[i] += sums[i];
    tokens_ += tokens;
}

void Calibrator::merge(const Calibrator& other) {
    require(other.d_in_ == d_in_ && other.group_ == group_ && other.mode_ == mode_,
            "calibrator merge: geometry differs (d_in " + std::to_string(d_in_) + " vs " + std::to_string(other.d_in_) +
                ", G " + std::to_string(group_) + " vs " + std::to_string(other.group_) + ", or moment mode)");
    require(double(tokens_) + double(other.tokens_) <= kMaxExactCount,
            "calibrator merge: token count would exceed 2^53");
    // Element i is read before it is written, so even a self-merge (doubling) is safe in place.
    const double* theirs = other.sums_.data();
    for (std::size_t i = 0; i < sums_.size(); ++i) sums_[i] += theirs[i];
    tokens_ += other.tokens_;
    sample_.merge(other.sample_);
    validation_.merge(other.validation_);
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
    require(block < blocks(),
            "calibrator: block " + std::to_string(block) + " out of range (" + std::to_string(blocks()) + " blocks)");
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
    state.reserve(state_size(d_in_, group_, mode_, sample_capacity(), validation_capacity()));
    state.insert(state.end(),
                 {1.0, kCalibratorStateVersion, double(int(mode_)), double(d_in_), double(group_), double(tokens_)});
    const std::vector<double> sym = symmetric_sums();
    state.insert(state.end(), sym.begin(), sym.end());
    if (sample_capacity() == 0 && validation_capacity() == 0) return state;  // version 1, as before samples
    state[1] = kCalibratorSampleStateVersion;
    sample_.append_state(state);
    if (validation_capacity() == 0) return state;
    state[1] = kCalibratorValidationStateVersion;
    validation_.append_state(state);
    return state;
}

Calibrator Calibrator::import_state(std::span<const double> state, std::size_t default_sample_capacity,
                                    std::size_t default_validation_capacity) {
    require(state.size() >= kCalibratorStateHeader, "calibrator state: shorter than its header");
    const double r = state[0];
    require(std::isfinite(r) && r >= 1.0 && r == std::floor(r),
            "calibrator state: replica count is not a positive integer");
    const double version = divided_field(state[1], r, "version");
    require(version == kCalibratorStateVersion || version == kCalibratorSampleStateVersion ||
                version == kCalibratorValidationStateVersion,
            "calibrator state: unknown layout version");
    const bool has_sample = version >= kCalibratorSampleStateVersion;
    const bool has_validation = version == kCalibratorValidationStateVersion;
    require(!has_sample || r == 1.0,
            "calibrator state: a state with a token sample cannot be summed across ranks (gather the states and "
            "merge them)");
    const double mode = divided_field(state[2], r, "mode");
    require(mode == 1.0 || mode == 2.0, "calibrator state: unknown moment mode");
    const double d_in = divided_field(state[3], r, "d_in");
    const double group = divided_field(state[4], r, "G");
    require(d_in >= 1.0 && d_in <= 1048576.0 && group >= 1.0 && group <= d_in,
            "calibrator state: d_in or G out of range");
    const auto mode_enum = MomentMode(int(mode));
    const std::size_t n = std::size_t(d_in);
    // Sizes are checked before anything is allocated: a corrupt header must not trigger a huge
    // allocation. The sample blocks follow the sums, each sized by its declared capacity.
    const std::size_t v1_size = state_size(n, std::size_t(group), mode_enum);
    require(state.size() >= v1_size, "calibrator state: shorter than its sums");
    std::span<const double> sample_block, validation_block;
    if (has_sample) {
        const std::span<const double> rest = state.subspan(v1_size);
        const std::size_t k = TokenSample::declared_capacity(rest, has_validation ? 0 : 1);
        const std::size_t size = TokenSample::state_size(k, n);
        require(rest.size() >= size, "calibrator state: shorter than its token sample");
        sample_block = rest.first(size);
        if (has_validation) {
            const std::span<const double> tail = rest.subspan(size);
            const std::size_t kv = TokenSample::declared_capacity(tail, 1);
            require(tail.size() >= TokenSample::state_size(kv, n),
                    "calibrator state: shorter than its validation sample");
            validation_block = tail.first(TokenSample::state_size(kv, n));
        }
    }
    const std::size_t expected = v1_size + sample_block.size() + validation_block.size();
    require(state.size() == expected, "calibrator state: size " + std::to_string(state.size()) +
                                          " does not match its header (" + std::to_string(expected) + ")");
    Calibrator c{n, std::size_t(group), mode_enum};
    const double tokens = state[5];
    require(std::isfinite(tokens) && tokens >= 0.0 && tokens == std::floor(tokens) && tokens <= kMaxExactCount,
            "calibrator state: token count is not a whole number in [0, 2^53]");
    const std::span<const double> sums = state.subspan(kCalibratorStateHeader, v1_size - kCalibratorStateHeader);
    require(std::all_of(sums.begin(), sums.end(), [](double v) { return std::isfinite(v); }),
            "calibrator state: sums hold NaN or Inf");
    c.tokens_ = std::uint64_t(tokens);
    std::copy(sums.begin(), sums.end(), c.sums_.begin());
    c.sample_ = has_sample ? TokenSample::read_state(sample_block, n) : TokenSample(n, default_sample_capacity);
    require(double(c.sample_.count()) <= tokens, "calibrator state: token sample count out of range");
    c.validation_ =
        has_validation ? TokenSample::read_state(validation_block, n) : TokenSample(n, default_validation_capacity);
    return c;
}

}  // namespace wush
