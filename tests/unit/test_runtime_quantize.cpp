// The fused transform + quantization (src/cpu/activation_quantizer.h) against the float64
// reference of runtime_reference.h (transform in float64, then the format's rules), on every
// ISA the CPU has, every format, every transform kind and every input dtype. A code or scale may
// differ only where the reference value lies within a relative 1e-6 of a rounding boundary; the
// test counts those cases and fails on any other difference. Every ISA must also write exactly
// the same bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "calibration/calibrator.h"
#include "common/cpu_isa.h"
#include "common/error.h"
#include "cpu/activation_quantizer.h"
#include "cpu/kernels/kernels.h"
#include "formats/block_format.h"
#include "runtime_reference.h"
#include "transforms/block_transform.h"

namespace wush {
namespace {

using test::supported_isas;
using wush::Isa;

constexpr std::size_t kDin = 256;

// Activations: correlated Gaussians with per-channel scales and an outlier channel, then rows
// that exercise the edges: all zero, tiny, subnormal, huge, exact E2M1 boundaries and powers of two.
std::vector<float> make_activations(std::size_t n_random, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    std::vector<float> x;
    for (std::size_t t = 0; t < n_random; ++t) {
        float shared = 0.0f;
        for (std::size_t j = 0; j < kDin; ++j) {
            if (j % 8 == 0) shared = gauss(rng);
            float v = (0.6f * shared + gauss(rng)) * (0.5f + float(j % 5) * 0.3f);
            if (j == 37) v *= 25.0f;
            x.push_back(v);
        }
    }
    const float specials[] = {0.0f, 1e-30f, 1e-41f, 1e25f};
    for (float s : specials)
        for (std::size_t j = 0; j < kDin; ++j) x.push_back(s * (j % 3 == 0 ? -1.0f : 1.0f) * float(1 + j % 7));
    // Boundaries of the identity transform: amax = 2 (MXFP4 2^e exactly), values on E2M1 midpoints.
    for (std::size_t j = 0; j < kDin; ++j) {
        const float bounds[] = {2.0f,         0.25f / 1.5f, 0.75f / 1.5f, 1.25f / 1.5f,
                                1.75f / 1.5f, 2.5f / 1.5f,  3.5f / 1.5f,  -0.0f};
        x.push_back(bounds[j % 8]);
    }
    return x;
}

// The input in `dtype` (bf16 by truncation, f16 by conversion: any representable value will do)
// and its exact float values.
struct Input {
    std::vector<std::uint8_t> bytes;
    std::vector<float> values;
};

Input as_dtype(const std::vector<float>& x, wush_dtype dtype) {
    Input in;
    in.values.resize(x.size());
    if (dtype == WUSH_DTYPE_F32) {
        in.bytes.resize(4 * x.size());
        std::memcpy(in.bytes.data(), x.data(), in.bytes.size());
        in.values = x;
        return in;
    }
    in.bytes.resize(2 * x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
        std::uint16_t h;
        if (dtype == WUSH_DTYPE_BF16) {
            std::uint32_t u;
            std::memcpy(&u, &x[i], 4);
            h = std::uint16_t(u >> 16);
            u = std::uint32_t(h) << 16;
            std::memcpy(&in.values[i], &u, 4);
        } else {
            const _Float16 f = _Float16(std::fmin(std::fmax(x[i], -60000.0f), 60000.0f));
            std::memcpy(&h, &f, 2);
            in.values[i] = float(f);
        }
        std::memcpy(in.bytes.data() + 2 * i, &h, 2);
    }
    return in;
}

// A data-dependent WUSH transform (the realistic, non-orthogonal case) and the data-free kinds.
BlockTransform make_transform(TransformKind kind, std::size_t g) {
    if (kind != TransformKind::WUSH && kind != TransformKind::WUS)
        return build_data_free_transform({kind, 0.01, 7}, kDin, g);
    const std::vector<float> cal = make_activations(300, 99);
    Calibrator c(kDin, g, MomentMode::BlockDiagonal);
    c.add(WUSH_DTYPE_F32, cal.data(), 300);
    std::mt19937 rng(5);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    std::vector<float> w(64 * kDin);
    for (float& v : w) v = gauss(rng);
    return build_transform({kind, 0.01, 7}, c, w, 64);
}

struct Tally {
    std::size_t groups = 0, scale_boundary = 0, code_boundary = 0, failures = 0;
    std::string first_failure;
};

// Compares the kernel's output with the float64 reference, group by group.
Tally compare(const BlockTransform& t, wush_format format, const std::vector<float>& x, std::size_t n,
              const std::vector<std::uint8_t>& codes, const std::vector<std::uint8_t>& scales) {
    Tally tally;
    const std::size_t g = t.group(), blocks = t.blocks();
    const std::size_t sbytes = format == WUSH_FORMAT_INT4 ? 2 : 1;
    const auto m = t.activation_matrices();
    // "Identity skips the multiply" (a -0.0 keeps its sign) holds when every block IS the identity.
    bool identity = true;
    for (std::size_t e = 0; e < m.size(); ++e) identity = identity && m[e] == ((e / g) % g == e % g ? 1.0f : 0.0f);
    auto fail = [&](const std::string& what) {
        if (tally.failures++ == 0) tally.first_failure = what;
    };
    for (std::size_t tok = 0; tok < n; ++tok) {
        for (std::size_t b = 0; b < blocks; ++b) {
            std::vector<double> y(g);
            for (std::size_t i = 0; i < g; ++i) {
                if (identity) {
                    y[i] = x[tok * kDin + b * g + i];
                    continue;
                }
                double s = 0.0;
                for (std::size_t j = 0; j < g; ++j)
                    s += double(m[(b * g + i) * g + j]) * double(x[tok * kDin + b * g + j]);
                y[i] = s;
            }
            const test::RefGroup ref = test::ref_group(format, y.data(), int(g));
            ++tally.groups;
            const std::uint8_t* s = scales.data() + (tok * blocks + b) * sbytes;
            const std::uint16_t got_scale = sbytes == 2 ? std::uint16_t(s[0] | (s[1] << 8)) : s[0];
            const std::string where = "token " + std::to_string(tok) + " block " + std::to_string(b);
            if (got_scale != ref.scale) {
                if (ref.scale_near) ++tally.scale_boundary;
                else
                    fail(where + ": scale " + std::to_string(got_scale) + " vs reference " + std::to_string(ref.scale));
                continue;
            }
            for (std::size_t i = 0; i < g; ++i) {
                const std::size_t e = tok * kDin + b * g + i;
                const std::uint8_t got = (codes[e / 2] >> (4 * (e % 2))) & 0xF;
                if (got == ref.codes[i]) continue;
                if (test::code_boundary(format, ref.scaled[i])) ++tally.code_boundary;
                else
                    fail(where + " element " + std::to_string(i) + ": code " + std::to_string(got) + " vs reference " +
                         std::to_string(ref.codes[i]) + " (scaled value " + std::to_string(ref.scaled[i]) + ")");
            }
        }
    }
    return tally;
}

struct Output {
    std::vector<std::uint8_t> codes, scales;
};

// `pairs`: run with the transform's bf16 pairs (the bf16 dot-product kernel where it applies);
// `norms`: with the row-norm bounds a prepared layer computes once (no scratch then).
Output run(Isa isa, const BlockTransform& t, const formats::FormatSpec& f, wush_dtype dtype, const Input& in,
           std::size_t n, bool pairs = false, bool norms = false) {
    const formats::PackedSizes sizes = formats::packed_sizes(f, n, kDin);
    Output out{std::vector<std::uint8_t>(sizes.codes, 0xAA), std::vector<std::uint8_t>(sizes.scales, 0xAA)};
    const MatrixUse use = classify_matrices(t);
    std::vector<float> scratch(norms ? 0 : cpu::quantize_scratch_floats(t, use));
    const std::vector<std::uint32_t> p = pairs ? cpu::bf16_matrix_pairs(t, use) : std::vector<std::uint32_t>{};
    const std::vector<float> bounds = norms ? cpu::matrix_norm_bounds(t, use) : std::vector<float>{};
    cpu::quantize_activations(t, use, f, dtype, in.bytes.data(), n, out.codes, out.scales, isa, scratch, 2,
                              {p, bounds});
    return out;
}

const TransformKind kKinds[] = {TransformKind::Identity, TransformKind::Hadamard, TransformKind::Random,
                                TransformKind::WUS, TransformKind::WUSH};
const wush_format kFormats[] = {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4, WUSH_FORMAT_MXFP4_OCP};
const wush_dtype kDtypes[] = {WUSH_DTYPE_F32, WUSH_DTYPE_F16, WUSH_DTYPE_BF16};

class QuantizeOnIsa : public ::testing::TestWithParam<Isa> {};

TEST_P(QuantizeOnIsa, MatchesFloat64ReferenceExceptAtBoundaries) {
    const Isa isa = GetParam();
    const std::vector<float> x = make_activations(45, 1);
    const std::size_t n = x.size() / kDin;
    for (wush_format format : kFormats) {
        const formats::FormatSpec& f = formats::spec(format);
        for (TransformKind kind : kKinds) {
            const BlockTransform t = make_transform(kind, f.group);
            for (wush_dtype dtype : kDtypes) {
                const Input in = as_dtype(x, dtype);
                const Output out = run(isa, t, f, dtype, in, n);
                const Tally tally = compare(t, format, in.values, n, out.codes, out.scales);
                const Output prepared = run(isa, t, f, dtype, in, n, false, true);
                EXPECT_EQ(compare(t, format, in.values, n, prepared.codes, prepared.scales).failures, 0u)
                    << f.name << " " << transform_kind_name(kind) << " with prepared norms";
                std::printf("[ tally    ] %-11s %-9s %-8s %-4s groups %zu, boundary cases: scales %zu, codes %zu\n",
                            isa_name(isa), f.name, transform_kind_name(kind),
                            dtype == WUSH_DTYPE_F32   ? "f32"
                            : dtype == WUSH_DTYPE_F16 ? "f16"
                                                      : "bf16",
                            tally.groups, tally.scale_boundary, tally.code_boundary);
                EXPECT_EQ(tally.failures, 0u)
                    << f.name << " " << transform_kind_name(kind) << ": " << tally.first_failure;
                // Boundary cases are rare by construction; many would mean a loose comparison.
                EXPECT_LE(tally.scale_boundary + tally.code_boundary, tally.groups / 20 + 8);
            }
        }
    }
}

TEST_P(QuantizeOnIsa, FewTokensMatchFloat64Reference) {
    // One to three tokens: the kernels put blocks, not tokens, in their lanes.
    const Isa isa = GetParam();
    const std::vector<float> all = make_activations(4, 5);
    const std::size_t n_all = all.size() / kDin;
    for (wush_format format : kFormats) {
        const formats::FormatSpec& f = formats::spec(format);
        for (TransformKind kind : kKinds) {
            const BlockTransform t = make_transform(kind, f.group);
            for (std::size_t first = 0; first < n_all; first += 3) {
                const std::size_t n = std::min<std::size_t>(first % 2 ? 1 : 3, n_all - first);
                const std::vector<float> x(all.begin() + first * kDin, all.begin() + (first + n) * kDin);
                for (wush_dtype dtype : kDtypes)
                    for (bool norms : {false, true}) {  // computed by the kernels, or prepared
                        const Input in = as_dtype(x, dtype);
                        const Output out = run(isa, t, f, dtype, in, n, false, norms);
                        const Tally tally = compare(t, format, in.values, n, out.codes, out.scales);
                        EXPECT_EQ(tally.failures, 0u)
                            << f.name << " " << transform_kind_name(kind) << " tokens " << first << "+" << n
                            << (norms ? " prepared norms" : "") << ": " << tally.first_failure;
                    }
            }
        }
    }
}

// A prepared layer of a transform stored as BF16 gives its matrices as bf16 pairs too, and one to
// three tokens' tiles (lanes = blocks) multiply those, half the bytes: the float64 reference and
// the scalar path's bytes, on every format, kind and input dtype.
TEST_P(QuantizeOnIsa, FewTokensFromBf16PairsMatchFloat64Reference) {
    const Isa isa = GetParam();
    const std::vector<float> all = make_activations(3, 9);
    const std::size_t n_all = all.size() / kDin;
    for (wush_format format : kFormats) {
        const formats::FormatSpec& f = formats::spec(format);
        for (TransformKind kind : kKinds) {
            const BlockTransform t = make_transform(kind, f.group).rounded_to(WUSH_DTYPE_BF16);
            ASSERT_EQ(cpu::bf16_matrix_pairs(t, classify_matrices(t)).empty(), classify_matrices(t) == MatrixUse::None);
            for (std::size_t first = 0; first < n_all; first += 2) {
                const std::size_t n = std::min<std::size_t>(first % 4 ? 1 : 2, n_all - first);
                const std::vector<float> x(all.begin() + first * kDin, all.begin() + (first + n) * kDin);
                for (wush_dtype dtype : kDtypes) {
                    const Input in = as_dtype(x, dtype);
                    const Output out = run(isa, t, f, dtype, in, n, true, true);
                    const std::string what = std::string(f.name) + " " + transform_kind_name(kind) + " tokens " +
                                             std::to_string(first) + "+" + std::to_string(n);
                    const Tally tally = compare(t, format, in.values, n, out.codes, out.scales);
                    EXPECT_EQ(tally.failures, 0u) << what << ": " << tally.first_failure;
                    const Output ref = run(Isa::Scalar, t, f, dtype, in, n);
                    EXPECT_EQ(out.codes, ref.codes) << what;
                    EXPECT_EQ(out.scales, ref.scales) << what;
                }
            }
        }
    }
}

// The lanes = blocks tile reads the pairs, not the float matrices: with the float matrices all NaN
// and the pairs those of a WUSH transform stored as BF16, every lane the kernel certifies must be
// the float64 reference of the pairs' transform (the driver redoes the others: here the scalar
// path's bytes stand in), and most lanes must be certified (NaN products would certify none).
TEST_P(QuantizeOnIsa, OneTokenTileReadsThePairs) {
    const Isa isa = GetParam();
    if (isa == Isa::Scalar) GTEST_SKIP() << "the scalar path has no tiles";
    const std::vector<float> x = make_activations(1, 12);
    const Input in = as_dtype(std::vector<float>(x.begin(), x.begin() + kDin), WUSH_DTYPE_F32);
    for (wush_format format : kFormats) {
        const formats::FormatSpec& f = formats::spec(format);
        const BlockTransform t = make_transform(TransformKind::WUSH, f.group).rounded_to(WUSH_DTYPE_BF16);
        const std::vector<std::uint32_t> pairs = cpu::bf16_matrix_pairs(t, MatrixUse::PerBlock);
        const std::vector<float> bounds = cpu::matrix_norm_bounds(t, MatrixUse::PerBlock);
        ASSERT_FALSE(pairs.empty());
        const std::vector<float> nan(t.activation_matrices().size(), std::nanf(""));
        Output out = run(Isa::Scalar, t, f, WUSH_DTYPE_F32, in, 1);  // the redone lanes' bytes
        const Output ref = out;
        std::fill(out.codes.begin(), out.codes.end(), 0xAA);
        std::fill(out.scales.begin(), out.scales.end(), 0xAA);
        const int lanes = isa == Isa::Avx2 ? 8 : 16, blocks = int(t.blocks());
        const std::size_t sbytes = out.scales.size() / std::size_t(blocks), g = f.group;
        int certified = 0;
        for (int b0 = 0; b0 < blocks; b0 += lanes) {
            cpu::QuantTile tile{};
            tile.x = in.bytes.data();
            tile.dtype = int(WUSH_DTYPE_F32);
            tile.format = int(format);
            tile.group = int(g);
            tile.rows = std::min(lanes, blocks - b0);
            tile.by_block = 1;
            tile.d_in = kDin;
            tile.block = std::size_t(b0);
            tile.matrix = nan.data() + std::size_t(b0) * g * g;
            tile.matrix_stride = g * g;
            tile.row_norms = bounds.data() + b0;
            tile.pairs = pairs.data() + std::size_t(b0) * g * g / 2;
            tile.codes = out.codes.data();
            tile.scales = out.scales.data();
            const std::uint32_t redo =
                isa == Isa::Avx2 ? cpu::avx2::quantize_tile(tile) : cpu::avx512::quantize_tile(tile);
            for (int r = 0; r < tile.rows; ++r) {
                const std::size_t b = std::size_t(b0 + r);
                if (!(redo >> r & 1u)) {
                    ++certified;
                    continue;
                }
                std::copy_n(ref.codes.begin() + b * g / 2, g / 2, out.codes.begin() + b * g / 2);
                std::copy_n(ref.scales.begin() + b * sbytes, sbytes, out.scales.begin() + b * sbytes);
            }
        }
        const Tally tally = compare(t, format, in.values, 1, out.codes, out.scales);
        EXPECT_EQ(tally.failures, 0u) << f.name << ": " << tally.first_failure;
        EXPECT_GE(certified, blocks / 2) << f.name << ": certified " << certified << " of " << blocks;
    }
}

TEST_P(QuantizeOnIsa, MatricesDecideNotTheKindsName) {
    // A checkpoint may store any matrices under "identity" or "hadamard": the runtime must use them.
    const Isa isa = GetParam();
    const std::vector<float> x = make_activations(20, 6);
    const std::size_t n = x.size() / kDin;
    for (wush_format format : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4}) {
        const formats::FormatSpec& f = formats::spec(format);
        const std::size_t g = f.group, blocks = kDin / g;
        const BlockTransform random = make_transform(TransformKind::Random, g);
        const auto r = random.activation_matrices();
        for (TransformKind label : {TransformKind::Identity, TransformKind::Hadamard}) {
            // Block 0 is the identity, the others random rotations; then all blocks the same rotation.
            std::vector<float> mixed(r.begin(), r.end()), same(r.size());
            for (std::size_t e = 0; e < g * g; ++e) mixed[e] = e / g == e % g ? 1.0f : 0.0f;
            for (std::size_t b = 0; b < blocks; ++b)
                std::copy(r.begin() + g * g, r.begin() + 2 * g * g, same.begin() + b * g * g);
            for (const std::vector<float>* mats : {&mixed, &same}) {
                const BlockTransform t(kDin, g, label, *mats);
                EXPECT_EQ(classify_matrices(t), mats == &mixed ? MatrixUse::PerBlock : MatrixUse::Shared);
                const Input in = as_dtype(x, WUSH_DTYPE_F32);
                for (std::size_t tokens : {std::size_t(1), n}) {  // lanes = blocks, then lanes = tokens
                    const Output out = run(isa, t, f, WUSH_DTYPE_F32, in, tokens);
                    const Tally tally = compare(t, format, in.values, tokens, out.codes, out.scales);
                    EXPECT_EQ(tally.failures, 0u)
                        << f.name << " labelled " << transform_kind_name(label) << ": " << tally.first_failure;
                }
            }
        }
    }
}

TEST_P(QuantizeOnIsa, SameBytesAsTheScalarPath) {
    const Isa isa = GetParam();
    const std::vector<float> x = make_activations(70, 2);
    const std::size_t n = x.size() / kDin;
    for (wush_format format : kFormats) {
        const formats::FormatSpec& f = formats::spec(format);
        for (TransformKind kind : {TransformKind::Identity, TransformKind::Hadamard, TransformKind::WUSH}) {
            const BlockTransform t = make_transform(kind, f.group);
            const Input in = as_dtype(x, WUSH_DTYPE_F32);
            const Output a = run(isa, t, f, WUSH_DTYPE_F32, in, n), b = run(Isa::Scalar, t, f, WUSH_DTYPE_F32, in, n);
            EXPECT_EQ(a.codes, b.codes) << f.name << " " << transform_kind_name(kind);
            EXPECT_EQ(a.scales, b.scales) << f.name << " " << transform_kind_name(kind);
        }
    }
}

TEST_P(QuantizeOnIsa, Int4TinyNegativeElementFloorsToMinusOne) {
    // A negative subnormal in an otherwise normal group: y / s underflows to -0 in float32, whose
    // floor is 0, while the float64 definition floors the tiny negative quotient to -1. With the
    // identity the error bound is 0, so only an explicit underflow check sends it to float64.
    const Isa isa = GetParam();
    const formats::FormatSpec& f = formats::spec(WUSH_FORMAT_INT4);
    const BlockTransform t = make_transform(TransformKind::Identity, f.group);
    for (std::size_t tokens : {std::size_t(1), std::size_t(16)}) {  // lanes = blocks, then lanes = tokens
        std::vector<float> x(tokens * kDin);
        for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(8 + int(i % 5));  // rms ~ 10: scale ~ 3.3
        for (std::size_t r = 0; r < tokens; ++r) x[r * kDin + 3] = -0x1p-149f;
        const Input in = as_dtype(x, WUSH_DTYPE_F32);
        const Output out = run(isa, t, f, WUSH_DTYPE_F32, in, tokens),
                     ref = run(Isa::Scalar, t, f, WUSH_DTYPE_F32, in, tokens);
        EXPECT_EQ(out.codes, ref.codes) << "tokens " << tokens;
        EXPECT_EQ(ref.codes[1] >> 4, 0xF) << "the float64 definition floors -2^-149 / s to -1 (code 0xF)";
    }
}

TEST_P(QuantizeOnIsa, EveryTokenCountAndOneTokenPerThread) {
    // Tails of every tile width (1..17 tokens) write exactly their rows.
    const Isa isa = GetParam();
    const formats::FormatSpec& f = formats::spec(WUSH_FORMAT_NVFP4);
    const BlockTransform t = make_transform(TransformKind::WUSH, f.group);
    const std::vector<float> x = make_activations(17, 3);
    const Input in = as_dtype(x, WUSH_DTYPE_F32);
    const Output all = run(isa, t, f, WUSH_DTYPE_F32, in, 17);
    for (std::size_t n = 1; n <= 17; ++n) {
        const Output part = run(isa, t, f, WUSH_DTYPE_F32, in, n);
        EXPECT_TRUE(std::equal(part.codes.begin(), part.codes.end(), all.codes.begin())) << n;
        EXPECT_TRUE(std::equal(part.scales.begin(), part.scales.end(), all.scales.begin())) << n;
    }
}

TEST_P(QuantizeOnIsa, NonFiniteInputIsReportedWithItsPosition) {
    const Isa isa = GetParam();
    for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
        std::vector<float> x = make_activations(20, 4);
        x[13 * kDin + 77] = bad;
        x[19 * kDin + 3] = bad;
        const formats::FormatSpec& f = formats::spec(WUSH_FORMAT_MXFP4);
        for (TransformKind kind : {TransformKind::Identity, TransformKind::WUSH}) {
            const BlockTransform t = make_transform(kind, f.group);
            try {
                run(isa, t, f, WUSH_DTYPE_F32, as_dtype(x, WUSH_DTYPE_F32), x.size() / kDin);
                ADD_FAILURE() << "no error for " << bad;
            } catch (const Error& e) {
                EXPECT_EQ(e.status(), WUSH_ERR_NON_FINITE);
                EXPECT_NE(std::string(e.what()).find("row 13, column 77"), std::string::npos) << e.what();
            }
            try {  // a single token (lanes = blocks)
                const std::vector<float> one(x.begin() + 13 * kDin, x.begin() + 14 * kDin);
                run(isa, t, f, WUSH_DTYPE_F32, as_dtype(one, WUSH_DTYPE_F32), 1);
                ADD_FAILURE() << "no error for " << bad << " in one token";
            } catch (const Error& e) {
                EXPECT_EQ(e.status(), WUSH_ERR_NON_FINITE);
                EXPECT_NE(std::string(e.what()).find("row 0, column 77"), std::string::npos) << e.what();
            }
        }
    }
}

// The bf16 dot-product kernel (bf16 activations, a transform stored as BF16, AVX512_BF16): the
// float64 reference and the scalar path's bytes, on every format and kind, with the edge rows
// (subnormal bf16 inputs, which the instruction reads as zero) and every tile tail.
TEST(QuantizeBf16Pairs, MatchesFloat64ReferenceAndTheScalarPath) {
    if (!isa_supported(Isa::Avx512Vnni) || !cpu_has_avx512_bf16()) GTEST_SKIP() << "this CPU lacks AVX512_BF16";
    const std::vector<float> x = make_activations(45, 8);
    const std::size_t n = x.size() / kDin;
    const Input in = as_dtype(x, WUSH_DTYPE_BF16);
    for (wush_format format : kFormats) {
        const formats::FormatSpec& f = formats::spec(format);
        for (TransformKind kind : kKinds) {
            const BlockTransform t = make_transform(kind, f.group).rounded_to(WUSH_DTYPE_BF16);
            const MatrixUse use = classify_matrices(t);
            ASSERT_EQ(cpu::bf16_matrix_pairs(t, use).empty(), use == MatrixUse::None) << transform_kind_name(kind);
            for (std::size_t tokens : {n, std::size_t(7), std::size_t(17)}) {
                const Output out = run(Isa::Avx512Vnni, t, f, WUSH_DTYPE_BF16, in, tokens, true);
                const Tally tally = compare(t, format, in.values, tokens, out.codes, out.scales);
                EXPECT_EQ(tally.failures, 0u)
                    << f.name << " " << transform_kind_name(kind) << " " << tokens << ": " << tally.first_failure;
                const Output ref = run(Isa::Scalar, t, f, WUSH_DTYPE_BF16, in, tokens);
                EXPECT_EQ(out.codes, ref.codes) << f.name << " " << transform_kind_name(kind) << " " << tokens;
                EXPECT_EQ(out.scales, ref.scales) << f.name << " " << transform_kind_name(kind) << " " << tokens;
            }
        }
    }
}

// The prepared row-norm bounds against two independent facts: an orthogonal matrix's rows have
// norm 1 (Hadamard, random rotations), and a diagonal matrix's row norms are its entries' sizes.
TEST(MatrixNormBounds, BoundTheLargestRowNormTightly) {
    const formats::FormatSpec& f = formats::spec(WUSH_FORMAT_MXFP4);
    for (TransformKind kind : {TransformKind::Hadamard, TransformKind::Random}) {
        const BlockTransform t = make_transform(kind, f.group);
        const MatrixUse use = classify_matrices(t);
        const std::vector<float> b = cpu::matrix_norm_bounds(t, use);
        ASSERT_EQ(b.size(), cpu::quantize_scratch_floats(t, use)) << transform_kind_name(kind);
        for (float v : b) {
            EXPECT_GE(v, 1.0f) << transform_kind_name(kind);
            EXPECT_LE(v, 1.0f + 1e-5f) << transform_kind_name(kind);
        }
    }
    const std::size_t g = f.group, blocks = kDin / g;
    std::vector<float> m(blocks * g * g, 0.0f);
    for (std::size_t b = 0; b < blocks; ++b)
        for (std::size_t i = 0; i < g; ++i) m[(b * g + i) * g + i] = (i == b % g ? -3.0f : 1.0f) * float(b + 1);
    const BlockTransform diag(kDin, g, TransformKind::WUSH, m);
    const std::vector<float> b = cpu::matrix_norm_bounds(diag, MatrixUse::PerBlock);
    ASSERT_EQ(b.size(), blocks);
    for (std::size_t i = 0; i < blocks; ++i) {  // an upper bound, at most a float ulp above
        EXPECT_GE(b[i], 3.0f * float(i + 1)) << "block " << i;
        EXPECT_LE(b[i], std::nextafter(3.0f * float(i + 1), INFINITY)) << "block " << i;
    }
    EXPECT_TRUE(cpu::matrix_norm_bounds(diag, MatrixUse::None).empty());
}

TEST(QuantizeBf16Pairs, OnlyForBf16ExactNormalMatrices) {
    const formats::FormatSpec& f = formats::spec(WUSH_FORMAT_MXFP4);
    const BlockTransform stored_f32 = make_transform(TransformKind::WUSH, f.group);
    EXPECT_TRUE(cpu::bf16_matrix_pairs(stored_f32, classify_matrices(stored_f32)).empty())
        << "a float32 WUSH transform has entries that are not bf16 values";
    const BlockTransform bf16 = stored_f32.rounded_to(WUSH_DTYPE_BF16);
    const std::vector<std::uint32_t> pairs = cpu::bf16_matrix_pairs(bf16, MatrixUse::PerBlock);
    ASSERT_EQ(pairs.size(), bf16.activation_matrices().size() / 2);
    for (std::size_t e = 0; e < pairs.size() * 2; ++e) {  // each half is the entry's top 16 bits
        std::uint32_t u;
        std::memcpy(&u, &bf16.activation_matrices()[e], 4);
        ASSERT_EQ((pairs[e / 2] >> (16 * (e % 2))) & 0xFFFFu, u >> 16) << e;
    }
    // One subnormal entry (bf16-exact, but read as zero by the instruction): the float path.
    std::vector<float> m(bf16.activation_matrices().begin(), bf16.activation_matrices().end());
    m[5] = 0x1p-130f;
    const BlockTransform sub(kDin, f.group, TransformKind::WUSH, m);
    EXPECT_TRUE(cpu::bf16_matrix_pairs(sub, MatrixUse::PerBlock).empty());
}

// A transformed value whose float32 sum loses its sign: row 0 of every block is (1, 1, -1, 0, ...)
// (the other rows the identity's), x starts (1, -2^-30, 1): float32 gives 1 - 2^-30 -> 1, then
// 1 - 1 = +0, while the float64 definition is -2^-30, whose code is the negative zero. The kernels
// must send such a group to float64 (the transform's error bound covers a sign), on every layout.
TEST(QuantizeSigns, ASignLostInFloat32IsRedone) {
    for (wush_format format : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4}) {
        const formats::FormatSpec& f = formats::spec(format);
        const std::size_t g = f.group, blocks = kDin / g;
        std::vector<float> m(blocks * g * g, 0.0f);
        for (std::size_t b = 0; b < blocks; ++b) {
            float* t = m.data() + b * g * g;
            for (std::size_t i = 0; i < g; ++i) t[i * g + i] = 1.0f;
            t[1] = 1.0f;
            t[2] = -1.0f;
        }
        const BlockTransform t(kDin, g, TransformKind::WUSH, m);
        std::vector<float> x(16 * kDin, 0.5f);
        for (std::size_t e = 0; e < x.size(); e += g) {
            x[e] = 1.0f;
            x[e + 1] = -0x1p-30f;
            x[e + 2] = 1.0f;
            x[e + 3] = 2.0f;
        }
        for (Isa isa : supported_isas())
            for (wush_dtype dtype : {WUSH_DTYPE_F32, WUSH_DTYPE_BF16})
                for (std::size_t tokens : {std::size_t(1), std::size_t(16)})
                    for (int variant = 0; variant < 3; ++variant) {  // float path, bf16 pairs, prepared norms
                        const bool pairs = variant == 1;
                        const Input in = as_dtype(x, dtype);
                        const Output out = run(isa, t, f, dtype, in, tokens, pairs, variant == 2);
                        const Tally tally = compare(t, format, in.values, tokens, out.codes, out.scales);
                        EXPECT_EQ(tally.failures, 0u) << isa_name(isa) << " " << f.name << " tokens " << tokens
                                                      << (pairs          ? " pairs"
                                                          : variant == 2 ? " prepared norms"
                                                                         : "")
                                                      << ": " << tally.first_failure;
                        EXPECT_EQ(out.codes[0] & 0xF, 8)
                            << isa_name(isa) << " " << f.name << ": the float64 definition's -2^-30 is a negative zero";
                    }
    }
}

// The kernels' own verdicts: with the identity (no rounding in the transform) a group is sent to
// float64 only when a value lies within float32's rounding of an E2M1 boundary, which random
// values almost never do. A code the kernel gets wrong still comes out right (the value lies
// outside the code's interval, which flags it), so only this rate shows an encoder that is wrong
// for a whole range of values.
TEST(QuantizeKernels, FlagOnlyValuesNearABoundary) {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-20, 20);
    for (wush_format format : kFormats) {
        const formats::FormatSpec& f = formats::spec(format);
        const std::size_t g = f.group, tokens = 16, d_in = 64 * g;
        std::vector<float> x(tokens * d_in);
        for (std::size_t i = 0; i < x.size(); i += g) {  // each group its own magnitude
            const float scale = std::ldexp(1.0f, exponent(rng));
            for (std::size_t j = 0; j < g; ++j) x[i + j] = unit(rng) * scale;
        }
        const formats::PackedSizes sizes = formats::packed_sizes(f, tokens, d_in);
        std::vector<std::uint8_t> codes(sizes.codes), scales(sizes.scales);
        for (Isa isa : supported_isas()) {
            if (isa == Isa::Scalar) continue;
            std::size_t flagged = 0, groups = 0;
            for (std::size_t block = 0; block < d_in / g; ++block) {
                cpu::QuantTile tile{};
                tile.x = x.data();
                tile.dtype = int(WUSH_DTYPE_F32);
                tile.format = int(format);
                tile.group = int(g);
                tile.rows = isa == Isa::Avx512Vnni ? 16 : 8;
                tile.d_in = d_in;
                tile.block = block;
                tile.codes = codes.data();
                tile.scales = scales.data();
                const std::uint32_t redo =
                    isa == Isa::Avx512Vnni ? cpu::avx512::quantize_tile(tile) : cpu::avx2::quantize_tile(tile);
                flagged += std::size_t(__builtin_popcount(redo));
                groups += std::size_t(tile.rows);
            }
            EXPECT_LE(flagged, groups / 100) << isa_name(isa) << " " << f.name << ": " << flagged << " of " << groups;
        }
    }
}

// Row norms given to a lanes = blocks tile belong to their own lanes (one per block), or to all
// lanes when the matrix is shared. Identity matrices and x = +-6 (scaled: +-4.5, half a step from
// any E2M1 threshold; amax two from either power of two) leave nothing near a boundary under a
// true bound of 1; a bound of 1e30 sends its lane to float64, and only its lane.
TEST(QuantizeKernels, GivenRowNormsBoundTheirOwnLanes) {
    const formats::FormatSpec& f = formats::spec(WUSH_FORMAT_MXFP4);
    const std::size_t g = f.group;
    for (Isa isa : supported_isas()) {
        if (isa == Isa::Scalar) continue;
        const int lanes = isa == Isa::Avx512Vnni ? 16 : 8;
        const std::size_t d_in = std::size_t(lanes) * g;
        std::vector<float> x(d_in), eye(std::size_t(lanes) * g * g, 0.0f);
        for (std::size_t i = 0; i < d_in; ++i) x[i] = i % 3 == 0 ? -6.0f : 6.0f;
        for (std::size_t e = 0; e < eye.size(); ++e) eye[e] = e % (g * g) / g == e % g ? 1.0f : 0.0f;
        std::vector<std::uint8_t> codes(d_in / 2), scales(d_in / g);
        const auto redo = [&](const float* norms, std::size_t stride) {
            cpu::QuantTile tile{};
            tile.x = x.data();
            tile.dtype = int(WUSH_DTYPE_F32);
            tile.format = int(WUSH_FORMAT_MXFP4);
            tile.group = int(g);
            tile.rows = lanes;
            tile.by_block = 1;
            tile.d_in = d_in;
            tile.matrix = eye.data();
            tile.matrix_stride = stride;
            tile.row_norms = norms;
            tile.codes = codes.data();
            tile.scales = scales.data();
            return isa == Isa::Avx512Vnni ? cpu::avx512::quantize_tile(tile) : cpu::avx2::quantize_tile(tile);
        };
        std::vector<float> norms(std::size_t(lanes), 1.0f);
        EXPECT_EQ(redo(nullptr, g * g), 0u) << isa_name(isa) << ": norms computed by the kernel";
        EXPECT_EQ(redo(norms.data(), g * g), 0u) << isa_name(isa);
        norms[3] = 1e30f;
        EXPECT_EQ(redo(norms.data(), g * g), 1u << 3) << isa_name(isa) << ": per-block norms";
        std::swap(norms[0], norms[3]);
        EXPECT_EQ(redo(norms.data(), 0), (1u << lanes) - 1) << isa_name(isa) << ": one shared matrix's norm";
    }
}

TEST_P(QuantizeOnIsa, Mxfp4ValuesBeyondItsRangeAreRefused) {
    // 3.2e38 gets MXFP4's largest scale, 2^127, and code 6, which decodes to 6 x 2^127 / 3 = 2^128:
    // refused. 1.6e38 gets 2^126 (the byte below) and decodes finitely.
    const Isa isa = GetParam();
    const formats::FormatSpec& f = formats::spec(WUSH_FORMAT_MXFP4);
    const BlockTransform t = make_transform(TransformKind::Identity, f.group);
    for (std::size_t tokens : {std::size_t(1), std::size_t(16)}) {
        std::vector<float> x(tokens * kDin, 1.0f);
        x[(tokens - 1) * kDin + 70] = 1.6e38f;
        EXPECT_NO_THROW(run(isa, t, f, WUSH_DTYPE_F32, as_dtype(x, WUSH_DTYPE_F32), tokens));
        x[(tokens - 1) * kDin + 70] = 3.2e38f;
        try {
            run(isa, t, f, WUSH_DTYPE_F32, as_dtype(x, WUSH_DTYPE_F32), tokens);
            ADD_FAILURE() << "a group that decodes to infinity was written (tokens " << tokens << ")";
        } catch (const Error& e) {
            EXPECT_EQ(e.status(), WUSH_ERR_NON_FINITE) << e.what();
            EXPECT_NE(std::string(e.what()).find("MXFP4's range"), std::string::npos) << e.what();
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Isas, QuantizeOnIsa, ::testing::ValuesIn(supported_isas()),
                         [](const auto& info) { return std::string(isa_name(info.param)); });

}  // namespace
}  // namespace wush
