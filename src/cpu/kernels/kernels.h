// The interface between the runtime drivers (activation_quantizer.cpp, gemm.cpp) and the per-ISA
// kernels (quantize_avx2.cpp, gemm_avx512.cpp, ...; the portable path for other CPUs stays in the
// drivers, e.g. gemm.cpp's scalar_multiply).
//
// The per-ISA files are compiled with their own target flags (-mavx2 / -mavx512*), so this header
// must not define a single function, inline or implicit: an inline function emitted by an AVX-512
// file could be the copy the linker keeps for every caller, and then the library would execute
// AVX-512 instructions on a CPU without them. Hence plain aggregates (no default member
// initializers, which would make an inline constructor) and plain declarations only; the kernel
// files include nothing else from the project but transpose_avx*.h and lane_blocks.h (whose
// functions are `static`, one private copy per file), formats/certified_constants.h (variables
// only) and none of the C++ standard library's templates.
#pragma once

#include <cstddef>
#include <cstdint>

namespace wush::cpu {

// ---------------------------------------------------------------------------------------------
// Fused transform + quantization of activations
// ---------------------------------------------------------------------------------------------

// One tile: up to 16 (AVX-512) or 8 (AVX2) lanes, each lane one (token, block) group. Either the
// lanes are consecutive tokens of one block (by_block == 0: many tokens share the block's matrix,
// which is broadcast from memory), or consecutive blocks of one token (by_block == 1: for one or
// a few tokens, where token lanes would sit idle).
struct QuantTile {
    const void* x;  // n_tokens x d_in activations, row-major
    int dtype;      // wush_dtype value: 0 f32, 1 f16, 2 bf16
    int format;     // wush_format value
    int group;      // G: 16 or 32
    int rows;       // lanes in use, 1..lane count
    int by_block;   // 0: lane l = token row0 + l, block `block`; 1: token row0, block block + l
    std::size_t d_in;
    std::size_t row0;           // first (or only) token
    std::size_t block;          // first (or only) block
    const float* matrix;        // T of block `block`, G x G row-major; nullptr for the identity
    std::size_t matrix_stride;  // floats from one block's matrix to the next (0: one shared matrix)
    const float* row_norms;     // upper bounds of max_i ||row i of T||_2, one per matrix (same stride
                                // rule: 1 per block, or 0 when shared); unused for the identity;
                                // nullptr (by_block only): the kernel computes them from the rows
                                // it loads anyway (one pass over the matrices instead of two)
    // The same matrices as bf16 pairs (word k of row i = T[i][2k] | T[i][2k+1] << 16; G x G/2 words
    // per matrix, stride matrix_stride / 2), or nullptr. Lanes = tokens (x bf16, AVX512_BF16): the
    // AVX-512 kernel multiplies with VDPBF16PS. Lanes = blocks (any x; row_norms given): both
    // kernels read these instead of `matrix`, half the bytes, as exact float32 entries.
    const std::uint32_t* pairs;
    std::uint8_t* codes;   // the whole codes buffer (n_tokens x d_in / 2)
    std::uint8_t* scales;  // the whole scales buffer (n_tokens x C x scale_bytes)
};

// Each SIMD tile kernel quantizes the tile in float32 and returns a bit mask of the tile rows whose
// group it could not certify (a value within its float32 error bound of a rounding boundary, a
// scale boundary, a tiny/huge/non-finite group): the driver recomputes those exactly in float64.
namespace avx2 {
std::uint32_t quantize_tile(const QuantTile& tile);  // rows <= 8
float max_row_norm(const float* matrix, int group);  // exact float32 max row norm (rounded up)
}  // namespace avx2
namespace avx512 {
std::uint32_t quantize_tile(const QuantTile& tile);  // rows <= 16
float max_row_norm(const float* matrix, int group);
}  // namespace avx512

// ---------------------------------------------------------------------------------------------
// The W4A4 GEMM: Y (m x n) = A (m x k, packed) * B^T (n x k, packed)
// ---------------------------------------------------------------------------------------------
//
// Both operands' 4-bit codes decode to small integers ("doubled" values): E2M1 as 2 x value in
// {0, 1, 2, 3, 4, 6, 8, 12} with sign, INT4 midrise as 2q + 1 in [-15, 15]. A group's inner
// product is exact in integer arithmetic; the value of the product is
//   sum_groups  (scale_a * scale_b * alpha) * integer_dot,   alpha = tensor_factor^2 / 4.
// The kernels feed the weights as unsigned bytes biased by `bias` (12 or 15) and the activations
// as signed bytes: sum (w + bias) x = sum w x + bias * sum x, so each group's integer accumulator
// starts at -bias * sum x (the "correction") instead of 0.

// The activation operand, decoded once per call by the driver.
struct GemmActivations {
    int format;
    int group;                 // G
    std::size_t m, k, groups;  // groups = k / G
    // Row layout (panel kernels): x8[r * k + i] = doubled code of element i of row r.
    const std::int8_t* x8;
    const std::int32_t* corr;  // m x groups: -bias * sum of the group's x8
    const float* scale;        // m x groups: scale_a * alpha (but see alpha_rest)
    // 0, or (the AVX-512 panel kernels with E8M0 scales on both sides) alpha / 2^floor(log2 alpha),
    // in [1, 2): then `scale` holds scale_a * 2^floor(log2 alpha), a power of two like every weight
    // scale, so the kernel applies a group's two scales as one exponent (VSCALEFPS, exact) instead
    // of two multiplies, which compete with the dot products for the same execution ports, and
    // multiplies each output by alpha_rest once before its store.
    float alpha_rest;
    // Split layout (row-streaming kernels for small m): xe / xo hold the even / odd elements, in
    // the order of the packed bytes (k_pad / 2 per row, k_pad = k rounded up to 128, zero padded);
    // lane L of a 64-byte chunk covers elements 8L .. 8L + 7 of the chunk.
    const std::int8_t* xe;
    const std::int8_t* xo;
    const std::int32_t* lane_corr;  // m x k_pad / 8
    const float* lane_scale;        // m x k_pad / 8
    std::size_t k_pad;
    // The AVX-512 row blocks' last span when it has fewer than 16 groups (avx512::regroup_split):
    // per row, its even then its odd elements, kTailBytes each, in the block's lane order.
    const std::int8_t* xt;
};

// Bytes of one row's even (or odd) elements of a span of 16 groups of 32: the size of `xt`'s parts.
constexpr std::size_t kTailBytes = 256;

struct GemmWeights {
    int format;
    std::size_t n, k, groups;
    const std::uint8_t* codes;   // n x k / 2
    const std::uint8_t* scales;  // n x groups x scale_bytes
};

struct GemmOutput {
    void* y;            // m x n row-major
    int dtype;          // wush_dtype value: 0 f32 or 2 bf16
    std::size_t ld;     // row stride in elements (n)
    const float* bias;  // n values added to every row in float32 before the rounding to `dtype`;
                        // nullptr: none (the value is stored as it is: no + 0.0, which would
                        // turn -0.0 into +0.0)
    // Never nullptr: the stores OR a nonzero value into *non_finite when a value they write (after
    // the rounding to `dtype`) is NaN or infinite, which saves the caller a pass over y. One word
    // per thread: the driver gives each chunk its own and combines them.
    std::uint32_t* non_finite;
};

// Panel geometry shared by every ISA (the AVX2 kernels use panels of 8 rows inside it). A packed
// panel of kPanelRows weight rows holds, per group, G/4 steps of (rows x 4 biased bytes) and then
// the rows' float scales: kPanelRows * (G + 4) bytes per group (no function here: see the top).
constexpr std::size_t kPanelRows = 32;

// Row-block layout for small m (the prepared layers of the AVX2 kernels; k % 32 == 0): blocks of
// kRowBlock = 8 weight rows. Per 32-element unit u of k, a block holds 4 x 32 bytes of codes
// (vector j, 32-bit lane i: code bytes 4j .. 4j + 3 of row i's unit; INT4 codes with the sign bit
// flipped) and then the unit's weight scales in (group, row) order: G = 32: 8 scales (1 byte,
// INT4 2); G = 16 (NVFP4): 16, as BF16 (2 bytes).
// The four vectors' products against broadcast activations add vertically into one lane per row,
// so a block's group scales apply as one vector and the whole block's outputs come out of one
// register: no horizontal sums, no scale shuffles.
constexpr std::size_t kRowBlock = 8;

// How far ahead of their reads the small-m row-block kernels ask for weight bytes. The hardware
// prefetchers alone left a one-token product at about half the speed of a plain read of the same
// bytes: these kernels do enough work per line that the core's own look-ahead covers too few lines
// to hide the memory's latency. (Prefetches past the end of the weights are harmless: they never
// fault.)
constexpr std::size_t kPrefetchBytes = 4096;

// The fused quantization with lanes = blocks prefetches the transform's matrices this many blocks
// ahead of the one it multiplies (lane_blocks.h; quantize_avx512.cpp's load_blocks says why).
constexpr std::size_t kMatrixPrefetchBlocks = 2;

namespace avx2 {
// Bytes of one packed row block: k / 32 units of 128 code bytes + 8, 16 or 32 scale bytes.
std::size_t row_block_bytes(int format, std::size_t k);
void pack_row_block(const GemmWeights& w, std::size_t n0, std::uint8_t* block);
// Y rows 0..m-1 (m <= 4, the split layout's xe / xo and the per-group corr / scale of `a`) for
// weight rows n0..n1 (n0 a multiple of kRowBlock); `blocks` points at block 0.
void rows_multiply(const GemmActivations& a, const std::uint8_t* blocks, std::size_t block_bytes, std::size_t n0,
                   std::size_t n1, std::size_t n_total, const GemmOutput& out);
void prepare_rows(const GemmActivations& a, const std::uint8_t* codes, std::size_t r0, std::size_t r1, std::int8_t* x8,
                  std::int32_t* corr);
void prepare_split(const GemmActivations& a, const std::uint8_t* codes, std::size_t r0, std::size_t r1, std::int8_t* xe,
                   std::int8_t* xo, std::int32_t* lane_corr);
void gemv_rows(const GemmActivations& a, const GemmWeights& w, std::size_t n0, std::size_t n1, const GemmOutput& out);
void pack_panel(const GemmWeights& w, std::size_t n0, std::uint8_t* panel);
void panel_multiply(const GemmActivations& a, const std::uint8_t* panel, std::size_t n0, std::size_t m0, std::size_t m1,
                    const GemmOutput& out, std::size_t n_total);
}  // namespace avx2
namespace avx512 {
// Row blocks of kRowBlock rows for small m (prepared layers), span after span (16 groups): the
// span's scales, then its 128-element chunks (64 bytes per vector, zero past k), so one token's
// product reads the block as a single stream. Lanes are group-major (lane L of every chunk: a
// piece of group L of the span), so the kernel sums a group in int32 across the span's chunks; a
// last span of few groups packs several rows per vector (gemm_avx512.cpp has the layout).
std::size_t row_block_bytes(int format, std::size_t k);  // a multiple of 64
void pack_row_block(const GemmWeights& w, std::size_t n0, std::uint8_t* block);
// Puts the split layout's xe / xo (rows 0..m-1 of `a`) in the row blocks' lane order: the full
// spans in place, the last span (if short) into xt (m x 2 x kTailBytes).
void regroup_split(const GemmActivations& a, std::int8_t* xe, std::int8_t* xo, std::int8_t* xt);
// Y rows 0..m-1 (m <= 4, the split layout of `a` regrouped by regroup_split, and its per-group
// `corr`) for weight rows n0..n1 (n0 a multiple of kRowBlock); `blocks` points at block 0.
void rows_multiply(const GemmActivations& a, const std::uint8_t* blocks, std::size_t block_bytes, std::size_t n0,
                   std::size_t n1, const GemmOutput& out);
void prepare_rows(const GemmActivations& a, const std::uint8_t* codes, std::size_t r0, std::size_t r1, std::int8_t* x8,
                  std::int32_t* corr);
void prepare_split(const GemmActivations& a, const std::uint8_t* codes, std::size_t r0, std::size_t r1, std::int8_t* xe,
                   std::int8_t* xo, std::int32_t* lane_corr);
void gemv_rows(const GemmActivations& a, const GemmWeights& w, std::size_t n0, std::size_t n1, const GemmOutput& out);
void pack_panel(const GemmWeights& w, std::size_t n0, std::uint8_t* panel);
void panel_multiply(const GemmActivations& a, const std::uint8_t* panel, std::size_t n0, std::size_t m0, std::size_t m1,
                    const GemmOutput& out, std::size_t n_total);
}  // namespace avx512

}  // namespace wush::cpu
