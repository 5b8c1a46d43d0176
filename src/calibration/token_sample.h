// A bounded, order-independent sample of activation tokens (rows of d_in floats), kept by the
// calibrator twice: a sample of its calibration tokens (the transform search's scores) and a
// sample of validation tokens from held-out documents (the search's per-layer guard).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "wush/wush.h"

namespace wush {

// Largest sample (rows of d_in floats).
inline constexpr std::size_t kMaxSampleTokens = 65536;

// Bottom-k sampling: every token's priority is a hash of its float32 bits and the sample is the
// k tokens of lowest priority offered. So it is a uniform sample without replacement of the
// distinct tokens, independent of batch order and of how the stream was split: merging samples
// gives exactly the sample of one that saw every stream. Capacity 0 keeps nothing.
//
// A token offered as part of a sequence (offer_rows with a sequence length) carries its
// sequence's id inside its priority, so that ids travel with the sample through merges and
// exported states without a change of layout: the priority's top 32 bits are the token's hash
// (which still orders the sample), bit 20 is set, bit 19 is 0 and bits 0-18 are a hash of the
// whole sequence's tokens in order (the same sequence gives the same id in any batch or shard).
// A token offered as part of a document (offer_document) carries the same, except that bit 19
// is 1 and bits 0-18 hash the caller's document id (so one document's windows, offered in
// several calls, share it). A token offered alone keeps its 53-bit hash, whose bit 20 is then
// set by chance only. (A state exported before documents existed may have bit 19 set in a
// sequence's id: its sequences then read as documents, grouped the same.)
class TokenSample {
public:
    TokenSample() = default;
    // INVALID_ARGUMENT for capacity > kMaxSampleTokens.
    TokenSample(std::size_t d_in, std::size_t capacity);

    std::size_t capacity() const noexcept { return capacity_; }
    std::size_t count() const noexcept { return heap_.size(); }

    // Offers n rows of `dtype` activations (n x d_in row-major; finite, checked by the caller).
    // sequence_length > 0 (dividing n, checked by the caller): the rows are n / sequence_length
    // whole sequences of that many tokens each, back to back.
    void offer_rows(wush_dtype dtype, const void* x, std::size_t n, std::size_t sequence_length = 0);
    // Offers n rows that all belong to the caller's document `document` (any 64-bit id).
    void offer_document(wush_dtype dtype, const void* x, std::size_t n, std::uint64_t document);
    // Unites `other`'s tokens into this sample (same d_in), keeping this capacity.
    void merge(const TokenSample& other);
    // count() x d_in row-major, in ascending priority (a deterministic order).
    std::vector<float> rows() const;
    // The sequence id of each row of rows(), in the same order: 1 + the 20-bit sequence hash for
    // a token offered in a sequence, 0 for one offered alone (but see the note above: a lone
    // token's id is nonzero with probability 1/2, so only "every token has an id" is meaningful).
    std::vector<std::uint32_t> sequence_ids() const;
    // Whether a sequence_ids() value marks a document (offer_document) rather than a sequence.
    static bool is_document_id(std::uint32_t id);

    // State block of a sample of `capacity` tokens: [k, m, k priorities, k x d_in values] (the
    // first m entries used, ascending priority; the rest 0).
    static std::size_t state_size(std::size_t capacity, std::size_t d_in);
    void append_state(std::vector<double>& state) const;
    // The capacity a state block starting at block[0] declares (INVALID_ARGUMENT unless it is a
    // whole number in [min_capacity, kMaxSampleTokens]; block must hold at least 2 doubles).
    static std::size_t declared_capacity(std::span<const double> block, std::size_t min_capacity);
    // Reads a block of exactly state_size(declared capacity, d_in) doubles; validates every field.
    static TokenSample read_state(std::span<const double> block, std::size_t d_in);

private:
    void offer(std::uint64_t key, const float* row);

    std::size_t d_in_ = 0;
    std::size_t capacity_ = 0;
    // (priority, row slot) pairs, a max-heap on the priority; rows live in rows_ by slot.
    std::vector<std::pair<std::uint64_t, std::size_t>> heap_;
    std::vector<float> rows_;  // capacity_ x d_in
};

}  // namespace wush
