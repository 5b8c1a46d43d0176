// wush_transform and wush_qweight: argument checks and handles around the per-block transforms
// (src/transforms), weight pre-quantization (src/prequant), the layer pipeline (src/pipeline) and
// the layerwise loss (src/eval).
#include <algorithm>
#include <iterator>
#include <memory>
#include <string>

#include "context.h"
#include "dense_input.h"
#include "enum_mirrors.h"
#include "eval/layer_loss.h"
#include "guard.h"
#include "objects.h"
#include "options.h"
#include "pipeline/layer_pipeline.h"
#include "prequant/rtn.h"

using namespace wush::capi;

namespace wush::capi {

const char* method_name(wush_method method) {
    const char* name = wush_method_name(method);
    return name ? name : "unknown";
}

wush_method method_from_name(const std::string& name) {
    const auto m = wush::parse_name<wush_method>(wush::kMethodNames, name);
    if (!m)
        wush::fail(WUSH_ERR_INVALID_ARGUMENT,
                   "unknown method \"" + name + "\" (" + wush::name_list<wush_method>(wush::kMethodNames) + ")");
    return *m;
}

}  // namespace wush::capi

namespace {

wush::TransformKind transform_kind(wush_transform_kind kind) {
    for (const wush::TransformKind k : wush::kTransformKinds)
        if (mirror<wush_transform_kind>(k) == kind) return k;
    wush::fail(WUSH_ERR_INVALID_ARGUMENT, "unknown wush_transform_kind " + std::to_string(int(kind)));
}

using wush::pipeline::is_data_free;

// `format`: the quantizer a search (WUSH_OPTION_SEARCH) scores candidates with; without one the
// search stays off (the data-free builders and the checks below never search).
wush::TransformOptions transform_options(wush::TransformKind kind, const wush_options& o,
                                         const wush::formats::FormatSpec* format = nullptr) {
    wush::TransformOptions t;
    t.kind = kind;
    t.damping = o.damping;
    t.hessian_damping = o.hessian_damping;
    t.seed = std::uint64_t(o.seed);
    t.storage = o.transform_dtype;  // the core builders round to it (one rule for RTN and GPTQ)
    if (o.search && format != nullptr) {
        t.search.enabled = true;
        t.search.format = format->id;
        t.search.sample_tokens = std::size_t(o.search_tokens);
    }
    return t;
}

// The CLI's short names (wush_transform_kind_name); the long ones are the core's
// (kTransformKindNames, the names checkpoints store). Either is read back, in any case.
constexpr wush::Named<wush::TransformKind> kKindNames[] = {{wush::TransformKind::Identity, "i"},
                                                           {wush::TransformKind::Hadamard, "h"},
                                                           {wush::TransformKind::Random, "r"},
                                                           {wush::TransformKind::WUS, "wus"},
                                                           {wush::TransformKind::WUSH, "wush"}};
static_assert(std::size(kKindNames) == std::size(wush::kTransformKinds));

const char* short_name(wush::TransformKind k) {
    return wush::name_of<wush::TransformKind>(kKindNames, k).data();  // the literals end in NUL
}

// I, H and R have no free parameters: a search asked of them would silently be the plain
// transform, so it is refused rather than ignored.
void reject_search_of_data_free(wush::TransformKind k, const wush_options& o) {
    if (o.search && is_data_free(k))
        wush::fail(WUSH_ERR_INVALID_ARGUMENT, std::string("WUSH_OPTION_SEARCH: transform \"") + short_name(k) +
                                                  "\" has nothing to search (only wus and wush have free parameters)");
}

// The search picks per block what a given format quantizes best, so it needs the format: a
// transform built without one would silently not be the searched transform.
void reject_search_in_build(wush::TransformKind k, const wush_options& o) {
    reject_search_of_data_free(k, o);
    if (o.search)
        wush::fail(WUSH_ERR_INVALID_ARGUMENT,
                   "WUSH_OPTION_SEARCH chooses each block for one format: use wush_layer_quantize(), which has it");
}

wush_transform* publish(wush::BlockTransform t) {
    auto h = std::make_unique<wush_transform>(std::move(t));
    wush_transform* handle = hand_out(h.get(), HandleType::Transform);
    h.release();
    return handle;
}

// The calibrator and the shapes wush_layer_quantize is given belong to one layer.
void require_layer_shape(const wush::Calibrator& cal, size_t d_out, size_t d_in) {
    if (d_in != cal.d_in())
        wush::fail(WUSH_ERR_INVALID_ARGUMENT,
                   "d_in = " + std::to_string(d_in) + " but the calibrator has d_in = " + std::to_string(cal.d_in()));
    if (d_out == 0) wush::fail(WUSH_ERR_INVALID_ARGUMENT, "d_out is 0");
}

// Hands a transform and its qweight to the caller as live handles: both or neither.
void publish(std::unique_ptr<wush_transform> t, std::unique_ptr<wush_qweight> q, wush_transform** transform,
             wush_qweight** qweight) {
    wush_transform* t_handle = hand_out(t.get(), HandleType::Transform);
    try {
        *qweight = hand_out(q.get(), HandleType::QWeight);
    } catch (...) {
        forget_object(t.get(), HandleType::Transform);
        throw;
    }
    *transform = t_handle;
    t.release();
    q.release();
}

}  // namespace

extern "C" {

WUSH_API const char* wush_transform_kind_name(wush_transform_kind kind) {
    for (const wush::TransformKind k : wush::kTransformKinds)
        if (mirror<wush_transform_kind>(k) == kind) return short_name(k);
    return nullptr;
}

WUSH_API wush_status wush_transform_kind_from_name(const char* name, wush_transform_kind* kind) {
    return guarded(__func__, [&] {
        require_pointer(name, "name");
        require_pointer(kind, "kind");
        auto k = wush::parse_name<wush::TransformKind>(kKindNames, name);
        if (!k) k = wush::transform_kind_from_name(name);
        if (k) {
            *kind = mirror<wush_transform_kind>(*k);
            return;
        }
        wush::fail(WUSH_ERR_INVALID_ARGUMENT, std::string("unknown transform \"") + name + "\" (i, h, r, wus, wush)");
    });
}

WUSH_API wush_status wush_transform_spec_from_name(const char* name, wush_transform_kind* kind, int* search) {
    return guarded(__func__, [&] {
        require_pointer(name, "name");
        require_pointer(kind, "kind");
        require_pointer(search, "search");
        std::string base(name);
        const bool searched = base.size() > 2 && base.compare(base.size() - 2, 2, "+s") == 0;
        if (searched) base.resize(base.size() - 2);
        wush_transform_kind k = WUSH_TRANSFORM_IDENTITY;
        if (wush_transform_kind_from_name(base.c_str(), &k) != WUSH_OK)
            wush::fail(WUSH_ERR_INVALID_ARGUMENT, std::string("unknown transform \"") + name +
                                                      "\" (i, h, r, wus, wush; wus+s, wush+s: with the search)");
        if (searched && k != WUSH_TRANSFORM_WUS && k != WUSH_TRANSFORM_WUSH)
            wush::fail(WUSH_ERR_INVALID_ARGUMENT,
                       std::string("transform \"") + name + "\": only wus and wush have a search (+s)");
        *kind = k;
        *search = searched ? 1 : 0;
    });
}

WUSH_API const char* wush_method_name(wush_method method) {
    const std::string_view name = wush::name_of<wush_method>(wush::kMethodNames, method);
    return name.empty() ? nullptr : name.data();  // the table's literals end in NUL
}

WUSH_API wush_status wush_method_from_name(const char* name, wush_method* method) {
    return guarded(__func__, [&] {
        require_pointer(name, "name");
        require_pointer(method, "method");
        *method = method_from_name(name);
    });
}

WUSH_API wush_status wush_transform_build(wush_context* ctx, const wush_calibrator* calibrator, wush_dtype dtype,
                                          const void* weight, size_t d_out, size_t d_in, wush_transform_kind kind,
                                          const wush_options* options, wush_transform** transform) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        calibrator = require_handle(calibrator, HandleType::Calibrator, "calibrator");
        const wush::Calibrator& cal = calibrator->core;
        require_pointer(transform, "transform");
        const wush::TransformKind k = transform_kind(kind);
        const wush_options& o = options_or_defaults(options);
        if (d_in != cal.d_in())
            wush::fail(WUSH_ERR_INVALID_ARGUMENT, "d_in = " + std::to_string(d_in) +
                                                      " but the calibrator has d_in = " + std::to_string(cal.d_in()));
        reject_search_in_build(k, o);
        if (is_data_free(k)) {
            *transform = publish(wush::build_data_free_transform(transform_options(k, o), cal.d_in(), cal.group()));
            return;
        }
        if (d_out == 0) wush::fail(WUSH_ERR_INVALID_ARGUMENT, "d_out is 0");
        const FloatMatrix w(dtype, weight, d_out, d_in, "weight");
        wush::Progress progress = make_progress(o);
        *transform = publish(wush::build_transform(transform_options(k, o), cal, w.span(), d_out, &progress));
    });
}

WUSH_API wush_status wush_transform_create_fixed(wush_transform_kind kind, size_t d_in, size_t group_size,
                                                 const wush_options* options, wush_transform** transform) {
    return guarded(__func__, [&] {
        require_pointer(transform, "transform");
        const wush::TransformKind k = transform_kind(kind);
        if (!is_data_free(k))
            wush::fail(WUSH_ERR_INVALID_ARGUMENT, "WUS and WUSH transforms need data: use wush_transform_build()");
        const wush_options& o = options_or_defaults(options);
        reject_search_of_data_free(k, o);
        *transform = publish(wush::build_data_free_transform(transform_options(k, o), d_in, group_size));
    });
}

WUSH_API void wush_transform_destroy(wush_transform* transform) {
    delete take_back(transform, HandleType::Transform);
}

WUSH_API wush_status wush_transform_info(const wush_transform* transform, wush_transform_kind* kind, size_t* d_in,
                                         size_t* group_size) {
    return guarded(__func__, [&] {
        transform = require_handle(transform, HandleType::Transform, "transform");
        if (kind) *kind = mirror<wush_transform_kind>(transform->core.kind());
        if (d_in) *d_in = transform->core.d_in();
        if (group_size) *group_size = transform->core.group();
    });
}

WUSH_API wush_status wush_transform_matrices(const wush_transform* transform, float* out, size_t count) {
    return guarded(__func__, [&] {
        transform = require_handle(transform, HandleType::Transform, "transform");
        require_pointer(out, "out");
        const auto m = transform->core.activation_matrices();
        require_size(count, m.size(), "out", "elements");
        std::copy(m.begin(), m.end(), out);
    });
}

WUSH_API wush_status wush_transform_fallback_blocks(const wush_transform* transform, size_t* n_blocks, size_t* blocks,
                                                    size_t count) {
    return guarded(__func__, [&] {
        transform = require_handle(transform, HandleType::Transform, "transform");
        require_pointer(n_blocks, "n_blocks");
        const auto& fb = transform->core.stats().fallback_blocks;
        *n_blocks = fb.size();
        if (blocks != nullptr) std::copy_n(fb.begin(), std::min(count, fb.size()), blocks);
    });
}

WUSH_API wush_status wush_transform_singular_values(const wush_transform* transform, double* out, size_t count) {
    return guarded(__func__, [&] {
        transform = require_handle(transform, HandleType::Transform, "transform");
        require_pointer(out, "out");
        const std::size_t n = transform->core.d_in();
        require_size(count, n, "out", "elements");
        const auto& s = transform->core.stats().singular_values;
        std::fill_n(out, n, 0.0);
        std::copy_n(s.begin(), std::min(n, s.size()), out);
    });
}

WUSH_API wush_status wush_transform_guard(const wush_transform* transform, wush_guard_source* source, size_t* n_tokens,
                                          wush_guard_candidate* kept) {
    return guarded(__func__, [&] {
        transform = require_handle(transform, HandleType::Transform, "transform");
        const wush::pipeline::GuardReport& r = transform->guard;
        if (source) *source = mirror<wush_guard_source>(r.source);
        if (n_tokens) *n_tokens = r.n_tokens;
        if (kept) *kept = wush_guard_candidate(r.kept);  // an index in the C enum's order (enum_mirrors.h)
    });
}

WUSH_API wush_status wush_transform_guard_candidate(const wush_transform* transform, wush_guard_candidate candidate,
                                                    double* loss, double* difference, double* std_error,
                                                    int* replaces) {
    return guarded(__func__, [&] {
        transform = require_handle(transform, HandleType::Transform, "transform");
        const int c = int(candidate);
        if (c < 0 || std::size_t(c) >= wush::pipeline::kGuardCandidates)
            wush::fail(WUSH_ERR_INVALID_ARGUMENT, "unknown wush_guard_candidate " + std::to_string(c));
        const wush::pipeline::GuardReport& r = transform->guard;
        if (r.source == wush::pipeline::GuardSource::None)
            wush::fail(WUSH_ERR_INVALID_ARGUMENT,
                       "no per-layer guard ran for this transform (wush_transform_guard reports WUSH_GUARD_NONE)");
        const wush::pipeline::GuardCandidateScore& s = r.candidates[std::size_t(c)];
        if (loss) *loss = s.loss;
        if (difference) *difference = s.difference;
        if (std_error) *std_error = s.std_error;
        if (replaces) *replaces = s.clearly_better ? 1 : 0;
    });
}

WUSH_API wush_status wush_transform_guard_undecided(const wush_transform* transform, int* undecided,
                                                    wush_guard_candidate* candidate, size_t* n_sequences) {
    return guarded(__func__, [&] {
        transform = require_handle(transform, HandleType::Transform, "transform");
        const wush::pipeline::GuardReport& r = transform->guard;
        if (undecided) *undecided = r.undecided ? 1 : 0;
        if (candidate) *candidate = wush_guard_candidate(r.undecided_candidate);  // the C enum's order
        if (n_sequences) *n_sequences = r.n_sequences;
    });
}

WUSH_API wush_status wush_qweight_create(wush_context* ctx, const wush_transform* transform, wush_format format,
                                         wush_method method, wush_dtype dtype, const void* weight, size_t d_out,
                                         size_t d_in, const wush_options* options, wush_qweight** qweight) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        transform = require_handle(transform, HandleType::Transform, "transform");
        require_pointer(qweight, "qweight");
        const wush::formats::FormatSpec& f = wush::formats::spec(format);
        options_or_defaults(options);
        if (method == WUSH_METHOD_GPTQ)
            wush::fail(WUSH_ERR_INVALID_ARGUMENT,
                       "GPTQ builds the transform and the weights together: use wush_layer_quantize()");
        if (method != WUSH_METHOD_RTN)
            wush::fail(WUSH_ERR_INVALID_ARGUMENT, "unknown wush_method " + std::to_string(int(method)));
        if (d_in != transform->core.d_in())
            wush::fail(WUSH_ERR_INVALID_ARGUMENT, "d_in = " + std::to_string(d_in) + " but the transform has d_in = " +
                                                      std::to_string(transform->core.d_in()));
        if (d_out == 0) wush::fail(WUSH_ERR_INVALID_ARGUMENT, "d_out is 0");
        const FloatMatrix w(dtype, weight, d_out, d_in, "weight");
        auto q = std::make_unique<wush_qweight>();
        q->core = wush::prequantize_rtn(transform->core, f, w.span(), d_out);
        q->method = method;
        *qweight = hand_out(q.get(), HandleType::QWeight);
        q.release();
    });
}

WUSH_API wush_status wush_layer_quantize(wush_context* ctx, const wush_calibrator* calibrator, wush_transform_kind kind,
                                         wush_format format, wush_method method, wush_dtype dtype, const void* weight,
                                         size_t d_out, size_t d_in, const wush_options* options,
                                         wush_transform** transform, wush_qweight** qweight) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        calibrator = require_handle(calibrator, HandleType::Calibrator, "calibrator");
        require_pointer(transform, "transform");
        require_pointer(qweight, "qweight");
        const wush::Calibrator& cal = calibrator->core;
        const wush::TransformKind k = transform_kind(kind);
        const wush::formats::FormatSpec& f = wush::formats::spec(format);
        const wush_options& o = options_or_defaults(options);
        if (method != WUSH_METHOD_RTN && method != WUSH_METHOD_GPTQ)
            wush::fail(WUSH_ERR_INVALID_ARGUMENT, "unknown wush_method " + std::to_string(int(method)));
        require_layer_shape(cal, d_out, d_in);
        reject_search_of_data_free(k, o);
        if (method == WUSH_METHOD_RTN && f.group != cal.group())
            wush::fail(WUSH_ERR_INVALID_ARGUMENT, std::string("format ") + f.name + " has group size " +
                                                      std::to_string(f.group) +
                                                      ", the calibrator G = " + std::to_string(cal.group()));
        const FloatMatrix w(dtype, weight, d_out, d_in, "weight");
        wush::Progress progress = make_progress(o);
        const auto m = method == WUSH_METHOD_GPTQ ? wush::pipeline::Method::Gptq : wush::pipeline::Method::Rtn;
        wush::pipeline::GuardSettings guard;
        guard.hold_out_sample = o.search_guard;
        wush::pipeline::QuantizedLayer layer =
            wush::pipeline::guarded_layer(transform_options(k, o, &f), f, m, cal, w.span(), d_out, &progress, guard);
        auto t = std::make_unique<wush_transform>(std::move(layer.transform));
        t->guard = layer.guard;
        auto q = std::make_unique<wush_qweight>();
        q->core = std::move(layer.weights);
        q->method = method;
        publish(std::move(t), std::move(q), transform, qweight);
    });
}

WUSH_API void wush_qweight_destroy(wush_qweight* qweight) {
    delete take_back(qweight, HandleType::QWeight);
}

WUSH_API wush_status wush_qweight_info(const wush_qweight* qweight, wush_format* format, wush_method* method,
                                       size_t* d_out, size_t* d_in) {
    return guarded(__func__, [&] {
        qweight = require_handle(qweight, HandleType::QWeight, "qweight");
        if (format) *format = qweight->core.format;
        if (method) *method = qweight->method;
        if (d_out) *d_out = qweight->core.d_out;
        if (d_in) *d_in = qweight->core.d_in;
    });
}

WUSH_API wush_status wush_qweight_data(const wush_qweight* qweight, const void** codes, size_t* codes_bytes,
                                       const void** scales, size_t* scales_bytes) {
    return guarded(__func__, [&] {
        qweight = require_handle(qweight, HandleType::QWeight, "qweight");
        if (codes) *codes = qweight->core.codes.data();
        if (codes_bytes) *codes_bytes = qweight->core.codes.size();
        if (scales) *scales = qweight->core.scales.data();
        if (scales_bytes) *scales_bytes = qweight->core.scales.size();
    });
}

WUSH_API wush_status wush_layer_loss(wush_context* ctx, const wush_transform* transform, const wush_qweight* qweight,
                                     wush_dtype w_dtype, const void* weight, wush_dtype x_dtype, const void* x,
                                     size_t n_tokens, double* loss) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        transform = require_handle(transform, HandleType::Transform, "transform");
        qweight = require_handle(qweight, HandleType::QWeight, "qweight");
        require_pointer(loss, "loss");
        const wush::eval::QuantizedWeights& q = qweight->core;
        if (q.d_in != transform->core.d_in())
            wush::fail(WUSH_ERR_INVALID_ARGUMENT, "the qweight's d_in (" + std::to_string(q.d_in) +
                                                      ") differs from the transform's (" +
                                                      std::to_string(transform->core.d_in()) + ")");
        if (n_tokens == 0) wush::fail(WUSH_ERR_INVALID_ARGUMENT, "n_tokens is 0");
        const FloatMatrix w(w_dtype, weight, q.d_out, q.d_in, "weight");
        const FloatMatrix xs(x_dtype, x, n_tokens, q.d_in, "x");
        *loss = wush::eval::layer_loss(transform->core, q, w.span(), xs.span(), n_tokens);
    });
}

}  // extern "C"
