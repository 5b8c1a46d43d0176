// GPTQ-WUSH (Algorithm 2, GPTQ case).
//
// Oracle: with the identity transform, Algorithm 2 is textbook GPTQ with group = block and the
// group's scales fixed from the updated weights at the group's first column. The textbook version
// below is written independently in float64: own Cholesky and triangular inverses (no LAPACK),
// the column-by-column error feedback into ALL later columns (no lazy batches, no per-block
// transforms), and the MXFP4 rule of docs/BLOCK_FORMATS.md written from its definition.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "calibration/calibrator.h"
#include "common/error.h"
#include "eval/layer_loss.h"
#include "eval/synthetic_layer.h"
#include "formats/block_format.h"
#include "prequant/gptq.h"
#include "prequant/rtn.h"
#include "transforms/block_transform.h"

namespace wush {
namespace {

using Mat = std::vector<double>;  // row-major n x n

Mat cholesky_lower(const Mat& a, std::size_t n) {
    Mat l(n * n, 0.0);
    for (std::size_t j = 0; j < n; ++j) {
        double d = a[j * n + j];
        for (std::size_t k = 0; k < j; ++k) d -= l[j * n + k] * l[j * n + k];
        if (!(d > 0.0)) throw std::runtime_error("oracle: not positive definite");
        l[j * n + j] = std::sqrt(d);
        for (std::size_t i = j + 1; i < n; ++i) {
            double s = a[i * n + j];
            for (std::size_t k = 0; k < j; ++k) s -= l[i * n + k] * l[j * n + k];
            l[i * n + j] = s / l[j * n + j];
        }
    }
    return l;
}

// A^{-1} from A = L L^T: (L^{-1})^T L^{-1}.
Mat spd_inverse(const Mat& a, std::size_t n) {
    const Mat l = cholesky_lower(a, n);
    Mat li(n * n, 0.0);  // L^{-1}, lower
    for (std::size_t j = 0; j < n; ++j) {
        li[j * n + j] = 1.0 / l[j * n + j];
        for (std::size_t i = j + 1; i < n; ++i) {
            double s = 0.0;
            for (std::size_t k = j; k < i; ++k) s += l[i * n + k] * li[k * n + j];
            li[i * n + j] = -s / l[i * n + i];
        }
    }
    Mat inv(n * n, 0.0);
    for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < n; ++j) {
            double s = 0.0;
            for (std::size_t k = std::max(i, j); k < n; ++k) s += li[k * n + i] * li[k * n + j];
            inv[i * n + j] = s;
        }
    return inv;
}

// MXFP4 (default rule) of one value under exponent e: E2M1 magnitude index and sign -> nibble.
const double kE2M1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
std::uint8_t mx_nibble(double x, int e) {
    const double a = std::fabs(x) * 3.0 / std::ldexp(1.0, e);
    int best = 0;
    for (int i = 1; i < 8; ++i) {
        const double di = std::fabs(kE2M1[i] - a), db = std::fabs(kE2M1[best] - a);
        if (di < db || (di == db && i % 2 == 0)) best = i;
    }
    return std::uint8_t(best | (std::signbit(x) ? 8 : 0));
}
double mx_value(std::uint8_t nibble, int e) {
    return (nibble & 8 ? -1.0 : 1.0) * kE2M1[nibble & 7] * std::ldexp(1.0, e) / 3.0;
}
int mx_exponent(const double* x, std::size_t n) {
    double amax = 0.0;
    for (std::size_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
    return amax > 0.0 ? std::ilogb(amax) : -127;
}

struct Textbook {
    std::vector<std::uint8_t> nibbles;  // d_out x d_in, one per element
    std::vector<int> exponents;         // d_out x (d_in / 32)
    std::vector<double> dequantized;    // d_out x d_in
};

Textbook textbook_gptq_mxfp4(const std::vector<float>& w, std::size_t d_out, std::size_t d_in,
                             const std::vector<float>& x, std::size_t n, double lambda) {
    constexpr std::size_t g = 32;
    Mat h(d_in * d_in, 0.0);
    for (std::size_t t = 0; t < n; ++t)
        for (std::size_t i = 0; i < d_in; ++i)
            for (std::size_t j = 0; j < d_in; ++j)
                h[i * d_in + j] += double(x[t * d_in + i]) * x[t * d_in + j] / double(n);
    double tr = 0.0;
    for (std::size_t i = 0; i < d_in; ++i) tr += h[i * d_in + i];
    for (std::size_t i = 0; i < d_in; ++i) h[i * d_in + i] += lambda * tr / double(d_in);
    const Mat hinv = spd_inverse(h, d_in);
    const Mat lh = cholesky_lower(hinv, d_in);  // Hinv = Lh Lh^T = U^T U with U = Lh^T
    auto u = [&](std::size_t i, std::size_t j) { return lh[j * d_in + i]; };

    Textbook out{std::vector<std::uint8_t>(d_out * d_in), std::vector<int>(d_out * (d_in / g)), Mat(d_out * d_in)};
    Mat wd(w.begin(), w.end());
    for (std::size_t j = 0; j < d_in; ++j) {
        for (std::size_t r = 0; r < d_out; ++r) {
            double* row = wd.data() + r * d_in;
            int& e = out.exponents[r * (d_in / g) + j / g];
            if (j % g == 0) e = mx_exponent(row + j, g);  // scales fixed at the group's start
            const std::uint8_t nib = mx_nibble(row[j], e);
            const double q = mx_value(nib, e);
            out.nibbles[r * d_in + j] = nib;
            out.dequantized[r * d_in + j] = q;
            const double err = (row[j] - q) / u(j, j);
            for (std::size_t k = j + 1; k < d_in; ++k) row[k] -= err * u(j, k);
        }
    }
    return out;
}

// Activations with correlated channels (so the Hessian's off-diagonal blocks matter) and two
// outlier channels.
std::vector<float> correlated_activations(std::size_t n, std::size_t d, std::uint64_t seed) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<double> normal;
    std::vector<double> mix(d * 8);
    for (double& v : mix) v = normal(gen);
    std::vector<float> x(n * d);
    for (std::size_t t = 0; t < n; ++t) {
        double f[8];
        for (double& v : f) v = normal(gen);
        for (std::size_t j = 0; j < d; ++j) {
            double v = 0.5 * normal(gen);
            for (int k = 0; k < 8; ++k) v += mix[j * 8 + k] * f[k];
            x[t * d + j] = float(v * (j == 5 ? 20.0 : j == 77 ? 8.0 : 1.0));
        }
    }
    return x;
}

std::vector<float> gaussian(std::size_t count, std::uint64_t seed, double scale) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<double> normal(0.0, scale);
    std::vector<float> v(count);
    for (float& f : v) f = float(normal(gen));
    return v;
}

Calibrator full_calibrator(const std::vector<float>& x, std::size_t n, std::size_t d, std::size_t g) {
    Calibrator cal(d, g, MomentMode::Full);
    cal.add(WUSH_DTYPE_F32, x.data(), n);
    return cal;
}

// The dequantized pre-quantized weights mapped back to the original space, w_b = T_act^T (T_w w_b)
// per block (float64, d_out x d_in): the weights the layer effectively multiplies unquantized
// activations with.
std::vector<double> original_space_weights(const BlockTransform& t, const formats::PackedMatrix& q) {
    const std::vector<float> wt = eval::dequantize(q);
    const std::size_t d_out = q.d_out, d_in = q.d_in, gs = t.group();
    std::vector<double> out(d_out * d_in, 0.0);
    const auto act = t.activation_matrices();
    for (std::size_t r = 0; r < d_out; ++r)
        for (std::size_t b = 0; b < d_in / gs; ++b)
            for (std::size_t i = 0; i < gs; ++i)
                for (std::size_t k = 0; k < gs; ++k)
                    out[r * d_in + b * gs + i] += double(act[b * gs * gs + k * gs + i]) * wt[r * d_in + b * gs + k];
    return out;
}

// ||X Wq^T - X W^T||_F^2 / (d_out n): the output error of the weight quantization alone (W4A16).
double weight_only_loss(const std::vector<double>& wq, const std::vector<float>& w, std::size_t d_out,
                        const std::vector<float>& x, std::size_t n) {
    const std::size_t d_in = w.size() / d_out;
    double total = 0.0;
    for (std::size_t t = 0; t < n; ++t)
        for (std::size_t o = 0; o < d_out; ++o) {
            double e = 0.0;
            for (std::size_t j = 0; j < d_in; ++j) e += double(x[t * d_in + j]) * (wq[o * d_in + j] - w[o * d_in + j]);
            total += e * e;
        }
    return total / double(d_out * n);
}

TEST(Gptq, IdentityTransformIsTextbookGptq) {
    const std::size_t d_out = 48, d_in = 256, n = 1024, n_held = 256;
    const double lambda = 0.01;
    const std::vector<float> x = correlated_activations(n + n_held, d_in, 11);
    const std::vector<float> w = gaussian(d_out * d_in, 12, 0.05);
    const std::vector<float> held(x.begin() + n * d_in, x.end());
    const Calibrator cal = full_calibrator(x, n, d_in, 32);
    const formats::FormatSpec& mx = formats::spec(WUSH_FORMAT_MXFP4);

    const gptq::Result ours = gptq::quantize({TransformKind::Identity, lambda, 0}, mx, cal, w, d_out);
    const Textbook ref = textbook_gptq_mxfp4(w, d_out, d_in, x, n, lambda);
    EXPECT_EQ(ours.damping_used, lambda);

    std::size_t same_codes = 0, same_scales = 0;
    const std::uint8_t* codes = ours.weights.codes.data();
    for (std::size_t r = 0; r < d_out; ++r)
        for (std::size_t j = 0; j < d_in; ++j) {
            const std::uint8_t byte = codes[(r * d_in + j) / 2];
            const std::uint8_t nib = j % 2 ? byte >> 4 : byte & 0xF;
            same_codes += nib == ref.nibbles[r * d_in + j];
        }
    for (std::size_t k = 0; k < ref.exponents.size(); ++k)
        same_scales += ours.weights.scales.data()[k] == ref.exponents[k] + 127;
    const double code_agreement = double(same_codes) / double(d_out * d_in);
    std::printf("  identity GPTQ vs textbook: %.5f of codes and %zu/%zu scales agree\n", code_agreement, same_scales,
                ref.exponents.size());
    EXPECT_GE(code_agreement, 0.999);

    // The same held-out loss (W4A4, activations quantized identically on both sides: the library's
    // activation path with the identity transform).
    std::vector<float> ref_w(ref.dequantized.begin(), ref.dequantized.end());
    std::vector<float> ours_w = eval::dequantize(ours.weights);
    const BlockTransform identity = build_data_free_transform({TransformKind::Identity, 0, 0}, d_in, 32);
    std::vector<float> xq(held.size());
    {
        std::vector<std::uint8_t> c(held.size() / 2), s(held.size() / 32);
        formats::quantize_rows(mx, held, n_held, d_in, c, s);
        formats::dequantize_rows(mx, c, s, n_held, d_in, xq);
    }
    auto loss = [&](const std::vector<float>& wq) {
        double total = 0.0;
        for (std::size_t t = 0; t < n_held; ++t)
            for (std::size_t o = 0; o < d_out; ++o) {
                double y = 0.0, yq = 0.0;
                for (std::size_t j = 0; j < d_in; ++j) {
                    y += double(held[t * d_in + j]) * w[o * d_in + j];
                    yq += double(xq[t * d_in + j]) * wq[o * d_in + j];
                }
                total += (yq - y) * (yq - y);
            }
        return total / double(d_out * n_held);
    };
    const double ours_loss = eval::layer_loss(identity, ours.weights, w, held, n_held);
    const double ref_loss = loss(ref_w);
    // The library's loss is this loss, up to the float32 rounding of the dequantized values here
    // (the library multiplies them exactly: eval/quantized_product.h).
    EXPECT_NEAR(loss(ours_w), ours_loss, 1e-6 * ours_loss);
    EXPECT_NEAR(ours_loss, ref_loss, 1e-6 * ref_loss) << "ours " << ours_loss << " textbook " << ref_loss;
}

// The weight-only objective GPTQ minimizes, tr((W_q - W) H (W_q - W)^T) / d_out in the original
// space, is below RTN's for every transform: a theorem-like property of the error feedback that
// holds layer by layer (checked on a small layer, all formats).
TEST(Gptq, LowersTheHessianWeightedErrorForEveryTransform) {
    const std::size_t d_out = 32, d_in = 128, n = 512;
    const std::vector<float> x = correlated_activations(n, d_in, 21);
    const std::vector<float> w = gaussian(d_out * d_in, 22, 0.05);
    for (wush_format f : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4}) {
        const formats::FormatSpec& fs = formats::spec(f);
        const Calibrator cal = full_calibrator(x, n, d_in, fs.group);
        const std::vector<double> h = cal.full_second_moment();
        for (TransformKind kind : {TransformKind::Identity, TransformKind::Hadamard, TransformKind::Random,
                                   TransformKind::WUS, TransformKind::WUSH}) {
            const gptq::Result g = gptq::quantize({kind, 0.01, 3}, fs, cal, w, d_out);
            auto objective = [&](const std::vector<double>& wq) {
                double total = 0.0;
                for (std::size_t r = 0; r < d_out; ++r)
                    for (std::size_t i = 0; i < d_in; ++i) {
                        const double ei = wq[r * d_in + i] - w[r * d_in + i];
                        for (std::size_t j = 0; j < d_in; ++j)
                            total += ei * h[i * d_in + j] * (wq[r * d_in + j] - w[r * d_in + j]);
                    }
                return total / double(d_out);
            };
            const double gptq_obj = objective(original_space_weights(g.transform, g.weights));
            const BlockTransform rt = build_transform({kind, 0.01, 3}, cal, w, d_out);
            const double rtn_obj = objective(original_space_weights(rt, prequantize_rtn(rt, fs, w, d_out)));
            EXPECT_LT(gptq_obj, rtn_obj) << fs.name << " " << transform_kind_name(kind);
        }
    }
}

// Built-in layers, held-out tokens: GPTQ-X beats RTN-X for every transform X and format on the
// error GPTQ minimizes (the weight quantization's output error, W4A16) and on the W4A4 layer loss
// (within 1%: where the activations' own quantization error dominates, e.g. INT4 without a
// transform, GPTQ's weight-only objective moves the total little either way); GPTQ-WUSH has the
// lowest W4A4 loss of all GPTQ transforms for MXFP4 (the paper's table). Prints the margins.
TEST(Gptq, BuiltInLayersBeatRtnAndWushIsBestForMxfp4) {
    for (const char* name : {"small_256x512", "small_512x256"}) {
        const eval::SyntheticLayer layer = eval::generate_layer(eval::synthetic_preset(name, 2048, 512, 1));
        const auto& s = layer.spec;
        for (wush_format f : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4}) {
            const formats::FormatSpec& fs = formats::spec(f);
            const Calibrator cal = full_calibrator(layer.calibration, s.n_tokens, s.d_in, fs.group);
            std::map<TransformKind, double> gptq_loss;
            for (TransformKind kind : {TransformKind::Identity, TransformKind::Hadamard, TransformKind::Random,
                                       TransformKind::WUS, TransformKind::WUSH}) {
                const TransformOptions o{kind, 0.01, 1};
                const gptq::Result g = gptq::quantize(o, fs, cal, layer.weight, s.d_out);
                const BlockTransform rt = build_transform(o, cal, layer.weight, s.d_out);
                const formats::PackedMatrix rq = prequantize_rtn(rt, fs, layer.weight, s.d_out);
                const double lg = eval::layer_loss(g.transform, g.weights, layer.weight, layer.heldout, s.n_heldout);
                const double lr = eval::layer_loss(rt, rq, layer.weight, layer.heldout, s.n_heldout);
                const double wg = weight_only_loss(original_space_weights(g.transform, g.weights), layer.weight,
                                                   s.d_out, layer.heldout, s.n_heldout);
                const double wr =
                    weight_only_loss(original_space_weights(rt, rq), layer.weight, s.d_out, layer.heldout, s.n_heldout);
                std::printf("  %-14s %-6s %-8s W4A4 rtn %.4e gptq %.4e (%.3f)   W4A16 rtn %.4e gptq %.4e (%.3f)\n",
                            name, fs.name, transform_kind_name(kind), lr, lg, lg / lr, wr, wg, wg / wr);
                EXPECT_LT(wg, wr) << name << " " << fs.name << " " << transform_kind_name(kind);
                EXPECT_LE(lg, 1.01 * lr) << name << " " << fs.name << " " << transform_kind_name(kind);
                gptq_loss[kind] = lg;
            }
            if (f != WUSH_FORMAT_MXFP4) continue;
            for (const auto& [kind, l] : gptq_loss) {
                if (kind == TransformKind::WUSH) continue;
                EXPECT_LT(gptq_loss[TransformKind::WUSH], l) << name << " vs " << transform_kind_name(kind);
            }
        }
    }
}

TEST(Gptq, TransformDtypeRoundsTheStoredTransform) {
    const std::size_t d_out = 16, d_in = 64, n = 256;
    const std::vector<float> x = correlated_activations(n, d_in, 31);
    const std::vector<float> w = gaussian(d_out * d_in, 32, 0.05);
    const Calibrator cal = full_calibrator(x, n, d_in, 32);
    const gptq::Result g = gptq::quantize({TransformKind::WUSH, 0.01, 0, WUSH_DTYPE_BF16},
                                          formats::spec(WUSH_FORMAT_MXFP4), cal, w, d_out);
    for (float v : g.transform.activation_matrices()) ASSERT_EQ(v, round_for_storage(v, WUSH_DTYPE_BF16));
}

// The inverse Hessian factor computed once and shared (as the search's guard shares it between its
// builds) gives every transform kind the very layer quantize() computes alone — also when the
// damping had to be escalated, or the transform is damped apart from the Hessian — and a factor of
// another damping or layer is refused.
TEST(Gptq, SharedInverseHessianGivesTheSameLayerBitForBit) {
    const std::size_t d_out = 24, d_in = 128, n = 384;
    const std::vector<float> x = correlated_activations(n, d_in, 51);
    const std::vector<float> w = gaussian(d_out * d_in, 52, 0.05);
    const formats::FormatSpec& mx = formats::spec(WUSH_FORMAT_MXFP4);
    const auto same = [](const gptq::Result& a, const gptq::Result& b) {
        const auto eq = [](auto p, auto q) { return std::equal(p.begin(), p.end(), q.begin(), q.end()); };
        return eq(a.weights.codes.span(), b.weights.codes.span()) &&
               eq(a.weights.scales.span(), b.weights.scales.span()) &&
               eq(a.transform.activation_matrices(), b.transform.activation_matrices()) &&
               a.damping_used == b.damping_used;
    };
    const Calibrator cal = full_calibrator(x, n, d_in, mx.group);
    const gptq::InverseHessian inv = gptq::inverse_hessian(cal, 0.01);
    TransformOptions searched{TransformKind::WUSH, 0.01, 5};
    searched.search.enabled = true;
    for (const TransformOptions& o :
         {TransformOptions{TransformKind::WUSH, 0.01, 5}, searched, TransformOptions{TransformKind::Identity, 0.01, 5},
          TransformOptions{TransformKind::Hadamard, 0.01, 5}, TransformOptions{TransformKind::Random, 0.01, 5}}) {
        const gptq::Result alone = gptq::quantize(o, mx, cal, w, d_out);
        EXPECT_TRUE(same(gptq::quantize(o, mx, cal, inv, w, d_out), alone)) << transform_kind_name(o.kind);
        // The factor does not depend on the rows quantized either (the guard's scored rows).
        const std::span<const float> first_rows = std::span(w).first(8 * d_in);
        EXPECT_TRUE(same(gptq::quantize(o, mx, cal, inv, first_rows, 8), gptq::quantize(o, mx, cal, first_rows, 8)));
    }
    // Undamped on too few tokens: the shared factor carries the escalated damping.
    const Calibrator few = full_calibrator(x, 16, d_in, mx.group);
    const TransformOptions undamped{TransformKind::Hadamard, 0.0, 0};
    const gptq::InverseHessian escalated = gptq::inverse_hessian(few, 0.0);
    EXPECT_GT(escalated.lambda, 0.0);
    EXPECT_TRUE(
        same(gptq::quantize(undamped, mx, few, escalated, w, d_out), gptq::quantize(undamped, mx, few, w, d_out)));
    // The transform damped apart from the Hessian (the guard's shrunk candidate): the factor of
    // the Hessian's damping gives the same layer, and that layer is neither the all-0.01 nor the
    // all-1 one.
    TransformOptions split{TransformKind::WUSH, 1.0, 5};
    split.hessian_damping = 0.01;
    const gptq::Result apart = gptq::quantize(split, mx, cal, w, d_out);
    EXPECT_TRUE(same(gptq::quantize(split, mx, cal, inv, w, d_out), apart));
    EXPECT_EQ(apart.damping_used, inv.lambda);
    EXPECT_EQ(apart.transform.damping(), 1.0);
    const auto codes_differ = [](const gptq::Result& a, const gptq::Result& b) {
        const auto p = a.weights.codes.span(), q = b.weights.codes.span();
        return !std::equal(p.begin(), p.end(), q.begin(), q.end());
    };
    EXPECT_TRUE(codes_differ(apart, gptq::quantize({TransformKind::WUSH, 1.0, 5}, mx, cal, w, d_out)));
    EXPECT_TRUE(codes_differ(apart, gptq::quantize({TransformKind::WUSH, 0.01, 5}, mx, cal, w, d_out)));
    // Another damping, or another layer's factor: refused.
    EXPECT_THROW(gptq::quantize({TransformKind::WUSH, 0.02, 5}, mx, cal, inv, w, d_out), Error);
    split.hessian_damping = 0.02;
    EXPECT_THROW(gptq::quantize(split, mx, cal, inv, w, d_out), Error);
    const Calibrator narrow = full_calibrator(x, n, d_in / 2, mx.group);
    EXPECT_THROW(
        gptq::quantize({TransformKind::WUSH, 0.01, 5}, mx, narrow, inv, std::span(w).first(d_out * d_in / 2), d_out),
        Error);
    Calibrator block(d_in, 32, MomentMode::BlockDiagonal);
    block.add(WUSH_DTYPE_F32, x.data(), n);
    EXPECT_THROW(gptq::inverse_hessian(block, 0.01), Error);
}

TEST(Gptq, BadInput) {
    const std::size_t d_out = 8, d_in = 64, n = 128;
    const std::vector<float> x = correlated_activations(n, d_in, 41);
    const std::vector<float> w = gaussian(d_out * d_in, 42, 0.05);
    const formats::FormatSpec& mx = formats::spec(WUSH_FORMAT_MXFP4);
    auto status_of = [](auto&& fn) {
        try {
            fn();
        } catch (const Error& e) {
            return e.status();
        }
        return WUSH_OK;
    };
    Calibrator block(d_in, 32, MomentMode::BlockDiagonal);
    block.add(WUSH_DTYPE_F32, x.data(), n);
    EXPECT_EQ(status_of([&] { gptq::quantize({}, mx, block, w, d_out); }), WUSH_ERR_INVALID_ARGUMENT);
    const Calibrator cal = full_calibrator(x, n, d_in, 32);
    EXPECT_EQ(status_of([&] { gptq::quantize({}, formats::spec(WUSH_FORMAT_NVFP4), cal, w, d_out); }),
              WUSH_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(status_of([&] { gptq::quantize({}, mx, cal, std::span(w).first(10), d_out); }),
              WUSH_ERR_INVALID_ARGUMENT);
    std::vector<float> bad = w;
    bad[7] = NAN;
    EXPECT_EQ(status_of([&] { gptq::quantize({}, mx, cal, bad, d_out); }), WUSH_ERR_NON_FINITE);
    // An all-zero Hessian cannot be damped into anything meaningful.
    const std::vector<float> zeros(n * d_in, 0.0f);
    const Calibrator zero = full_calibrator(zeros, n, d_in, 32);
    EXPECT_EQ(status_of([&] { gptq::quantize({}, mx, zero, w, d_out); }), WUSH_ERR_NUMERICAL);
    // Undamped, a rank-deficient Hessian (fewer tokens than channels) is escalated, not rejected.
    const Calibrator few = full_calibrator(x, 16, d_in, 32);
    const gptq::Result r = gptq::quantize({TransformKind::Identity, 0.0, 0}, mx, few, w, d_out);
    EXPECT_GT(r.damping_used, 0.0);
}

}  // namespace
}  // namespace wush
