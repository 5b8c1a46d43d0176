// Built-in, seeded LLM-like example layers (src/eval/synthetic_layer).
#include <string>

#include "eval/synthetic_layer.h"
#include "guard.h"

using namespace wush::capi;

extern "C" {

WUSH_API size_t wush_example_layer_count(void) {
    return wush::eval::synthetic_preset_names().size();
}

WUSH_API const char* wush_example_layer_name(size_t index) {
    const auto names = wush::eval::synthetic_preset_names();
    return index < names.size() ? names[index] : nullptr;
}

WUSH_API wush_status wush_example_layer_shape(const char* name, size_t* d_out, size_t* d_in) {
    return guarded(__func__, [&] {
        require_pointer(name, "name");
        const wush::eval::SyntheticLayerSpec s = wush::eval::synthetic_preset(name, 1, 1, 0);
        if (d_out) *d_out = s.d_out;
        if (d_in) *d_in = s.d_in;
    });
}

WUSH_API wush_status wush_example_layer_generate(const char* name, uint64_t seed, size_t n_calibration,
                                                 size_t n_heldout, float* weight, size_t weight_count,
                                                 float* calibration, size_t calibration_count, float* heldout,
                                                 size_t heldout_count) {
    return guarded(__func__, [&] {
        require_pointer(name, "name");
        const wush::eval::SyntheticLayerSpec s = wush::eval::synthetic_preset(name, n_calibration, n_heldout, seed);
        const std::size_t w = s.d_out * s.d_in, c = n_calibration * s.d_in, h = n_heldout * s.d_in;
        if (weight_count < w || calibration_count < c || heldout_count < h)
            wush::fail(WUSH_ERR_BUFFER_TOO_SMALL, "buffers hold fewer floats than the layer needs (weight " +
                                                      std::to_string(w) + ", calibration " + std::to_string(c) +
                                                      ", held-out " + std::to_string(h) + ")");
        // An empty set may come with a NULL buffer (a caller that wants no held-out tokens).
        // Straight into the caller's buffers: no second copy of the tokens (`wush eval` sizes its
        // memory check by them).
        if (w > 0) require_pointer(weight, "weight");
        if (c > 0) require_pointer(calibration, "calibration");
        if (h > 0) require_pointer(heldout, "heldout");
        wush::eval::generate_layer(s, weight, calibration, heldout);
    });
}

}  // extern "C"
