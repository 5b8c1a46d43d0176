// The C API's core-backed objects. Each wraps one C++ core object; the handle table (handles.h)
// knows their types.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "calibration/calibrator.h"
#include "eval/layer_loss.h"
#include "pipeline/layer_pipeline.h"
#include "transforms/block_transform.h"
#include "transforms/runtime_layer.h"
#include "wush/wush.h"

struct wush_calibrator {
    explicit wush_calibrator(wush::Calibrator c) : core(std::move(c)) {}
    wush::Calibrator core;
};

struct wush_transform {
    explicit wush_transform(wush::BlockTransform t) : core(std::move(t)), runtime_use(wush::classify_matrices(core)) {}
    wush::BlockTransform core;
    // How the CPU runtime reads the matrices (by their values, classified once: the runtime's
    // per-call path then never rescans them).
    wush::MatrixUse runtime_use;
    // What the search's per-layer guard decided (wush_layer_quantize only; source None otherwise).
    wush::pipeline::GuardReport guard;
};

struct wush_qweight {
    wush::eval::QuantizedWeights core;
    wush_method method = WUSH_METHOD_RTN;
};

// A prepared layer: a transform and a qweight bound to the backend of one context.
struct wush_linear {
    const wush_context* context;       // the context it was prepared on (checked on every use)
    std::uint64_t context_generation;  // and its registration (a new context may reuse the address)
    std::unique_ptr<wush::backend::PreparedLayer> layer;
};

namespace wush::capi {

const char* method_name(wush_method method);            // "rtn", "gptq"
wush_method method_from_name(const std::string& name);  // throws for an unknown name

}  // namespace wush::capi
