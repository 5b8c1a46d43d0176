#include "eval/synthetic_layer.h"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <string>

#include "common/checked_math.h"
#include "common/error.h"
#include "transforms/rng.h"

namespace wush::eval {

namespace {

// Independent streams per ingredient, so e.g. the token count never changes the weights.
enum Stream : std::uint64_t { kChannelScales = 1, kFactors, kOutliers, kCalibTokens, kHeldoutTokens, kWeights };

std::uint64_t stream_seed(std::uint64_t seed, Stream s) {
    return rng::mix_seed(seed) ^ (std::uint64_t(s) * 0x9E3779B97F4A7C15ull);
}

struct ActivationModel {
    std::vector<double> factors;  // d_in x rank
    std::vector<double> scales;   // d_in
};

ActivationModel activation_model(const SyntheticLayerSpec& s) {
    ActivationModel m;
    rng::Rng scale_rng(stream_seed(s.seed, kChannelScales));
    m.scales.resize(s.d_in);
    for (double& c : m.scales) c = std::exp(0.5 * scale_rng.gaussian());
    // Outlier positions: a seeded partial Fisher-Yates shuffle picks distinct channels.
    rng::Rng outlier_rng(stream_seed(s.seed, kOutliers));
    std::vector<std::size_t> order(s.d_in);
    for (std::size_t j = 0; j < s.d_in; ++j) order[j] = j;
    for (std::size_t k = 0; k < s.outlier_channels && k < s.d_in; ++k) {
        const std::size_t pick = k + std::size_t(outlier_rng.uniform() * double(s.d_in - k));
        std::swap(order[k], order[std::min(pick, s.d_in - 1)]);
        m.scales[order[k]] *= s.outlier_scale;
    }
    rng::Rng factor_rng(stream_seed(s.seed, kFactors));
    m.factors.resize(s.d_in * s.rank);
    const double f = 1.0 / std::sqrt(double(s.rank));
    for (double& v : m.factors) v = f * factor_rng.gaussian();
    return m;
}

// Writes n tokens to out (n x d_in). Token by token (latent then noise) so the first k tokens do
// not depend on n; in chunks of tokens, so that the float64 temporaries stay small whatever n is
// (each row of the product depends only on its own latent row).
void sample_tokens(const SyntheticLayerSpec& s, const ActivationModel& m, std::size_t n, Stream stream, float* out) {
    if (n == 0) return;
    constexpr std::size_t kChunk = 1024;
    rng::Rng r(stream_seed(s.seed, stream));
    const std::size_t chunk = std::min(n, kChunk);
    std::vector<double> latent(chunk * s.rank), x(chunk * s.d_in);
    for (std::size_t t0 = 0; t0 < n; t0 += chunk) {
        const std::size_t c = std::min(chunk, n - t0);
        for (std::size_t t = 0; t < c; ++t) {
            for (std::size_t k = 0; k < s.rank; ++k) latent[t * s.rank + k] = r.student_t(s.student_nu);
            for (std::size_t j = 0; j < s.d_in; ++j) x[t * s.d_in + j] = 0.5 * r.student_t(s.student_nu);
        }
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(c), int(s.d_in), int(s.rank), 1.0, latent.data(),
                    int(s.rank), m.factors.data(), int(s.rank), 1.0, x.data(), int(s.d_in));
        float* o = out + t0 * s.d_in;
        for (std::size_t t = 0; t < c; ++t)
            for (std::size_t j = 0; j < s.d_in; ++j) o[t * s.d_in + j] = float(m.scales[j] * x[t * s.d_in + j]);
    }
}

void sample_weight(const SyntheticLayerSpec& s, float* out) {
    rng::Rng r(stream_seed(s.seed, kWeights));
    const std::size_t rk = s.weight_rank;
    std::vector<double> a(s.d_out), b(s.d_in), p(s.d_out * rk), q(s.d_in * rk);
    for (double& v : a) v = std::exp(0.3 * r.gaussian());
    for (double& v : b) v = std::exp(0.5 * r.gaussian());
    for (double& v : p) v = r.gaussian();
    const double qs = std::sqrt(0.5 / double(rk));
    for (double& v : q) v = qs * r.gaussian();
    std::vector<double> w(checked_mul(s.d_out, s.d_in, "weight size"));
    for (double& v : w) v = r.gaussian();
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(s.d_out), int(s.d_in), int(rk), 1.0, p.data(), int(rk),
                q.data(), int(rk), 1.0, w.data(), int(s.d_in));
    const double norm = 1.0 / std::sqrt(double(s.d_in));
    for (std::size_t o = 0; o < s.d_out; ++o)
        for (std::size_t j = 0; j < s.d_in; ++j) out[o * s.d_in + j] = float(norm * a[o] * b[j] * w[o * s.d_in + j]);
}

}  // namespace

namespace {

struct Shape {
    const char* name;
    std::size_t d_in, d_out;
};
constexpr Shape kShapes[] = {{"small_256x512", 256, 512}, {"small_512x256", 512, 256}, {"4096x4096", 4096, 4096},
                             {"4096x14336", 4096, 14336}, {"14336x4096", 14336, 4096}, {"384x384", 384, 384},
                             {"384x1536", 384, 1536},     {"1536x384", 1536, 384},     {"576x576", 576, 576},
                             {"576x192", 576, 192},       {"576x1536", 576, 1536},     {"1536x576", 1536, 576}};
constexpr auto kShapeNames = [] {
    std::array<const char*, std::size(kShapes)> names{};
    for (std::size_t i = 0; i < names.size(); ++i) names[i] = kShapes[i].name;
    return names;
}();

}  // namespace

std::span<const char* const> synthetic_preset_names() {
    return kShapeNames;
}

SyntheticLayerSpec synthetic_preset(std::string_view name, std::size_t n_tokens, std::size_t n_heldout,
                                    std::uint64_t seed) {
    for (const Shape& s : kShapes) {
        if (std::string_view(s.name) != name) continue;
        SyntheticLayerSpec spec;
        spec.d_in = s.d_in;
        spec.d_out = s.d_out;
        spec.n_tokens = n_tokens;
        spec.n_heldout = n_heldout;
        spec.seed = seed;
        return spec;
    }
    fail(WUSH_ERR_INVALID_ARGUMENT, "unknown synthetic layer preset '" + std::string(name) + "'");
}

void generate_layer(const SyntheticLayerSpec& spec, float* weight, float* calibration, float* heldout) {
    require(spec.d_in > 0 && spec.d_out > 0, "synthetic layer: d_in and d_out must be positive");
    require(spec.rank > 0 && spec.weight_rank > 0, "synthetic layer: ranks must be positive");
    require(spec.student_nu >= 1 && spec.student_nu <= 1000, "synthetic layer: nu must be in [1, 1000]");
    require(spec.outlier_scale > 0.0 && std::isfinite(spec.outlier_scale),
            "synthetic layer: outlier scale must be positive");
    checked_mul(spec.n_tokens, spec.d_in, "activation size");
    checked_mul(spec.n_heldout, spec.d_in, "activation size");
    const ActivationModel model = activation_model(spec);
    sample_weight(spec, weight);
    sample_tokens(spec, model, spec.n_tokens, kCalibTokens, calibration);
    sample_tokens(spec, model, spec.n_heldout, kHeldoutTokens, heldout);
}

SyntheticLayer generate_layer(const SyntheticLayerSpec& spec) {
    SyntheticLayer layer;
    layer.spec = spec;
    layer.weight.resize(checked_mul(spec.d_out, spec.d_in, "weight size"));
    layer.calibration.resize(checked_mul(spec.n_tokens, spec.d_in, "activation size"));
    layer.heldout.resize(checked_mul(spec.n_heldout, spec.d_in, "activation size"));
    generate_layer(spec, layer.weight.data(), layer.calibration.data(), layer.heldout.data());
    return layer;
}

}  // namespace wush::eval
