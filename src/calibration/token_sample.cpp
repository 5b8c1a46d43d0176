#include "calibration/token_sample.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/checked_math.h"
#include "common/dtype.h"
#include "common/error.h"

namespace wush {

namespace {

// Row t of an n x d_in activation block as float32: the caller's own row for F32, else a copy
// converted into a buffer that is reused (valid until the next row is read).
class RowReader {
public:
    RowReader(wush_dtype dtype, const void* x, std::size_t d_in)
        : dtype_(dtype), x_(x), d_in_(d_in), row_(dtype == WUSH_DTYPE_F32 ? 0 : d_in) {}
    const float* operator()(std::size_t t) {
        if (dtype_ == WUSH_DTYPE_F32) return static_cast<const float*>(x_) + t * d_in_;
        to_float(dtype_, x_, t * d_in_, row_);
        return row_.data();
    }

private:
    wush_dtype dtype_;
    const void* x_;
    std::size_t d_in_;
    std::vector<float> row_;
};

// Priorities are 53-bit integers so that they travel exactly as doubles in exported states.
constexpr double kPriorityLimit = 9007199254740992.0;

// splitmix64 finalizer (the same mixing as the transforms' seeds; kept local: calibration does
// not depend on the transforms).
std::uint64_t mix64(std::uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// A token's priority: a hash of its float32 bits. Depends on the token alone, which is what
// makes the bottom-k sample independent of order and sharding.
std::uint64_t token_priority(const float* row, std::size_t d_in) {
    std::uint64_t h = 0x5A3D1E9Bull ^ d_in;
    for (std::size_t j = 0; j < d_in; ++j) {
        std::uint32_t bits;
        std::memcpy(&bits, row + j, sizeof bits);
        h = mix64(h ^ bits);
    }
    return h >> 11;
}

// The sequence part of a priority (see token_sample.h).
constexpr std::uint64_t kSequenceFlag = std::uint64_t(1) << 20;
constexpr std::uint64_t kSequenceMask = kSequenceFlag - 1;
// The id's top bit says what marked it: 0 a sequence (a hash of its tokens), 1 a document (a hash
// of the caller's document id), so the guard can say which it held out.
constexpr std::uint64_t kDocumentBit = kSequenceFlag >> 1;
constexpr std::uint64_t kIdHashMask = kDocumentBit - 1;

std::uint64_t sequence_priority(std::uint64_t token, std::uint64_t sequence) {
    return (token & ~(2 * kSequenceFlag - 1)) | kSequenceFlag | (sequence & kSequenceMask);
}

bool heap_less(const std::pair<std::uint64_t, std::size_t>& a, const std::pair<std::uint64_t, std::size_t>& b) {
    return a.first < b.first;
}

bool is_whole(double v, double lo, double hi) {
    return std::isfinite(v) && v >= lo && v <= hi && v == std::floor(v);
}

}  // namespace

TokenSample::TokenSample(std::size_t d_in, std::size_t capacity) : d_in_(d_in), capacity_(capacity) {
    require(capacity <= kMaxSampleTokens, "calibrator: token sample of " + std::to_string(capacity) +
                                              " tokens exceeds " + std::to_string(kMaxSampleTokens));
    rows_.assign(checked_mul(capacity, d_in, "token sample size"), 0.0f);
    heap_.reserve(capacity);
}

void TokenSample::offer(std::uint64_t key, const float* row) {
    if (capacity_ == 0) return;
    std::size_t slot;
    if (heap_.size() < capacity_) {
        slot = heap_.size();
    } else {
        if (key >= heap_.front().first) return;  // ties keep the incumbent (equal keys: equal tokens)
        std::pop_heap(heap_.begin(), heap_.end(), heap_less);
        slot = heap_.back().second;
        heap_.pop_back();
    }
    std::copy_n(row, d_in_, rows_.begin() + slot * d_in_);
    heap_.emplace_back(key, slot);
    std::push_heap(heap_.begin(), heap_.end(), heap_less);
}

void TokenSample::offer_rows(wush_dtype dtype, const void* x, std::size_t n, std::size_t sequence_length) {
    if (capacity_ == 0) return;
    RowReader row_of(dtype, x, d_in_);
    std::vector<std::uint64_t> keys(n);
    for (std::size_t t = 0; t < n; ++t) keys[t] = token_priority(row_of(t), d_in_);
    // A sequence's id hashes its tokens' hashes in order: the content alone decides it.
    for (std::size_t s = 0; sequence_length > 0 && s < n / sequence_length; ++s) {
        std::uint64_t h = 0x51ED270Bull ^ sequence_length;
        for (std::size_t t = s * sequence_length; t < (s + 1) * sequence_length; ++t) h = mix64(h ^ keys[t]);
        for (std::size_t t = s * sequence_length; t < (s + 1) * sequence_length; ++t)
            keys[t] = sequence_priority(keys[t], h & kIdHashMask);
    }
    for (std::size_t t = 0; t < n; ++t) offer(keys[t], row_of(t));
}

void TokenSample::offer_document(wush_dtype dtype, const void* x, std::size_t n, std::uint64_t document) {
    if (capacity_ == 0) return;
    RowReader row_of(dtype, x, d_in_);
    // The caller's id alone decides the document's: its windows may come in any calls or shards.
    const std::uint64_t id = kDocumentBit | (mix64(0xD0C5EEDull ^ document) & kIdHashMask);
    for (std::size_t t = 0; t < n; ++t) {
        const float* r = row_of(t);
        offer(sequence_priority(token_priority(r, d_in_), id), r);
    }
}

bool TokenSample::is_document_id(std::uint32_t id) {
    return id != 0 && ((id - 1) & kDocumentBit) != 0;
}

void TokenSample::merge(const TokenSample& other) {
    // Bottom-k of the union is bottom-k of the two bottom-k sets. Copies first: a self-merge
    // offers its own entries (equal keys, kept out by the tie rule).
    const std::vector<std::pair<std::uint64_t, std::size_t>> entries(other.heap_);
    const std::vector<float> rows(other.rows_);
    for (const auto& [key, slot] : entries) offer(key, rows.data() + slot * d_in_);
}

std::vector<float> TokenSample::rows() const {
    std::vector<std::pair<std::uint64_t, std::size_t>> order(heap_);
    std::sort(order.begin(), order.end());
    std::vector<float> out(order.size() * d_in_);
    for (std::size_t i = 0; i < order.size(); ++i)
        std::copy_n(rows_.begin() + order[i].second * d_in_, d_in_, out.begin() + i * d_in_);
    return out;
}

std::vector<std::uint32_t> TokenSample::sequence_ids() const {
    std::vector<std::pair<std::uint64_t, std::size_t>> order(heap_);
    std::sort(order.begin(), order.end());
    std::vector<std::uint32_t> ids(order.size());
    for (std::size_t i = 0; i < order.size(); ++i)
        ids[i] = order[i].first & kSequenceFlag ? std::uint32_t(order[i].first & kSequenceMask) + 1 : 0;
    return ids;
}

std::size_t TokenSample::state_size(std::size_t capacity, std::size_t d_in) {
    return checked_add(2 + capacity, checked_mul(capacity, d_in, "state"), "state");
}

void TokenSample::append_state(std::vector<double>& state) const {
    std::vector<std::pair<std::uint64_t, std::size_t>> order(heap_);
    std::sort(order.begin(), order.end());
    state.push_back(double(capacity_));
    state.push_back(double(order.size()));
    for (std::size_t i = 0; i < capacity_; ++i) state.push_back(i < order.size() ? double(order[i].first) : 0.0);
    for (std::size_t i = 0; i < capacity_; ++i)
        for (std::size_t j = 0; j < d_in_; ++j)
            state.push_back(i < order.size() ? double(rows_[order[i].second * d_in_ + j]) : 0.0);
}

std::size_t TokenSample::declared_capacity(std::span<const double> block, std::size_t min_capacity) {
    require(block.size() >= 2, "calibrator state: shorter than its token sample header");
    require(is_whole(block[0], double(min_capacity), double(kMaxSampleTokens)),
            "calibrator state: token sample capacity out of range");
    return std::size_t(block[0]);
}

TokenSample TokenSample::read_state(std::span<const double> block, std::size_t d_in) {
    const std::size_t capacity = declared_capacity(block, 0);
    require(block.size() == state_size(capacity, d_in), "calibrator state: token sample block has the wrong size");
    TokenSample s(d_in, capacity);
    const double m = block[1];
    require(is_whole(m, 0.0, double(capacity)), "calibrator state: token sample count out of range");
    const std::span<const double> keys = block.subspan(2, capacity);
    const std::span<const double> rows = block.subspan(2 + capacity);
    std::vector<float> row(d_in);
    for (std::size_t i = 0; i < std::size_t(m); ++i) {
        require(is_whole(keys[i], 0.0, kPriorityLimit - 1.0),
                "calibrator state: token sample priority is not a 53-bit integer");
        for (std::size_t j = 0; j < d_in; ++j) {
            const double v = rows[i * d_in + j];
            require(std::isfinite(v) && double(float(v)) == v,
                    "calibrator state: token sample value is not a finite float");
            row[j] = float(v);
        }
        s.offer(std::uint64_t(keys[i]), row.data());
    }
    return s;
}

}  // namespace wush
