// The wush_options object: builder settings and the progress callback.
#pragma once

#include <cstdint>
#include <optional>

#include "common/progress.h"
#include "handles.h"
#include "wush/wush.h"

struct wush_options {
    double damping = 0.01;
    std::optional<double> hessian_damping;  // WUSH_OPTION_HESSIAN_DAMPING; unset: `damping`
    std::int64_t seed = 0;
    wush_dtype transform_dtype = WUSH_DTYPE_F32;
    bool search = false;               // WUSH_OPTION_SEARCH
    std::int64_t search_tokens = 256;  // WUSH_OPTION_SEARCH_TOKENS
    bool search_guard = true;          // WUSH_OPTION_SEARCH_GUARD
    wush_progress_fn progress = nullptr;
    void* progress_user = nullptr;
};

namespace wush::capi {

// The options behind a possibly-NULL handle (NULL = defaults); throws for a bad handle.
const wush_options& options_or_defaults(const wush_options* options);

// A Progress that forwards to the options' callback.
inline Progress make_progress(const wush_options& o) {
    if (o.progress == nullptr) return Progress();
    return Progress([fn = o.progress, user = o.progress_user](double f) { return fn(user, f) == 0; });
}

}  // namespace wush::capi
