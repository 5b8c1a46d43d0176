// The parallel loops over a layer's blocks that the transform builders share (solve_layer,
// search_transform, BlockTransform): blocks in OpenMP chunks, the first exception rethrown on the
// calling thread, progress per finished block, and a chunk's weight slices read in one pass.
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <span>
#include <vector>

#include "common/progress.h"
#include "transforms/block_transform.h"

namespace wush::block_loop {

// How many blocks are read per pass over the weight rows (fill_weight_slices). A block's columns
// are G floats of every row, and every row lies on its own memory pages, so a pass costs about
// one TLB miss per row however many columns it takes: 256 columns (1 KiB of each row) make those
// a small part of the read (the A/B against 64 columns is in docs/record/performance-record.md).
// Bounded so that a chunk's float64 slices stay within 8 MiB per thread and every thread still
// gets a chunk of a small layer.
inline std::size_t slice_chunk(std::size_t blocks, std::size_t g, std::size_t d_out) {
    constexpr std::size_t kColumns = 256, kBytes = std::size_t(8) << 20;
    const std::size_t threads = std::size_t(std::max(omp_get_max_threads(), 1));
    const std::size_t by_bytes = kBytes / (d_out * g * sizeof(double));
    return std::max<std::size_t>(1, std::min({kColumns / g, by_bytes, blocks / threads}));
}

// Runs body(first, n) for consecutive chunks of `chunk` blocks in parallel (n < chunk only for
// the last) and rethrows the first exception on the calling thread (exceptions must not cross
// an OpenMP region boundary). With a Progress, every finished block is reported and a
// cancellation skips the remaining chunks.
template <typename Body>
void parallel_chunks(std::size_t count, std::size_t chunk, Body body, Progress* progress) {
    std::exception_ptr error;
    std::atomic<std::size_t> done{0};
    const std::size_t chunks = (count + chunk - 1) / chunk;
#pragma omp parallel for schedule(dynamic)
    for (std::size_t k = 0; k < chunks; ++k) {
        if (progress && progress->cancelled()) continue;
        const std::size_t first = k * chunk, n = std::min(chunk, count - first);
        try {
            body(first, n);
        } catch (...) {
#pragma omp critical(wush_transform_error)
            if (!error) error = std::current_exception();
        }
        if (progress)
            for (std::size_t i = 0; i < n; ++i) progress->report(double(++done), double(count));
    }
    if (error) std::rethrow_exception(error);
    if (progress) progress->finish();
}

// body(b) for every block in parallel, as above.
template <typename Body>
void parallel_blocks(std::size_t count, Body body, Progress* progress = nullptr) {
    parallel_chunks(
        count, 1, [&](std::size_t b, std::size_t) { body(b); }, progress);
}

// body(b, slice) for every block b of a d_out x d_in weight with blocks of G, in parallel, as
// above: `slice` is block b's d_out x G float64 weight slice (weight_slice's values) when
// `read_slices`, else empty. A chunk's slices are read in one pass (fill_weight_slices) into each
// thread's own vectors, kept from chunk to chunk, so the float64 copies stay within
// slice_chunk's bound per thread, whatever the layer's size.
template <typename Body>
void blocks_with_slices(std::span<const float> weight, std::size_t d_out, std::size_t d_in, std::size_t g,
                        bool read_slices, Body body, Progress* progress) {
    const std::size_t c = d_in / g, chunk = slice_chunk(c, g, d_out);
    std::vector<std::vector<std::vector<double>>> thread_slices(std::size_t(std::max(omp_get_max_threads(), 1)),
                                                                std::vector<std::vector<double>>(chunk));
    parallel_chunks(
        c, chunk,
        [&](std::size_t first, std::size_t count) {
            const std::span<std::vector<double>> slices =
                std::span(thread_slices[std::size_t(omp_get_thread_num())]).first(count);
            if (read_slices) fill_weight_slices(weight, d_out, d_in, g, first, slices);
            for (std::size_t i = 0; i < count; ++i) body(first + i, std::span<const double>(slices[i]));
        },
        progress);
}

}  // namespace wush::block_loop
