#include "options.h"

#include <cmath>
#include <memory>
#include <string>

#include "guard.h"

using namespace wush::capi;

namespace wush::capi {

const wush_options& options_or_defaults(const wush_options* options) {
    static const wush_options kDefaults{};
    if (options == nullptr) return kDefaults;
    options = require_handle(options, HandleType::Options, "options");
    return *options;
}

}  // namespace wush::capi

namespace {

[[noreturn]] void bad_option(wush_option option, const char* type) {
    wush::fail(WUSH_ERR_INVALID_ARGUMENT,
               "option " + std::to_string(int(option)) + " is not a known " + type + " option");
}

}  // namespace

extern "C" {

WUSH_API wush_status wush_options_create(wush_options** options) {
    return guarded(__func__, [&] {
        require_pointer(options, "options");
        auto o = std::make_unique<wush_options>();
        *options = hand_out(o.get(), HandleType::Options);
        o.release();
    });
}

WUSH_API void wush_options_destroy(wush_options* options) {
    delete take_back(options, HandleType::Options);
}

WUSH_API wush_status wush_options_set_double(wush_options* options, wush_option option, double value) {
    return guarded(__func__, [&] {
        options = require_handle(options, HandleType::Options, "options");
        if (option != WUSH_OPTION_DAMPING && option != WUSH_OPTION_HESSIAN_DAMPING) bad_option(option, "double");
        const char* name = option == WUSH_OPTION_DAMPING ? "WUSH_OPTION_DAMPING" : "WUSH_OPTION_HESSIAN_DAMPING";
        if (!(value >= 0.0 && value <= 1e6))
            wush::fail(WUSH_ERR_INVALID_ARGUMENT,
                       std::string(name) + " must be in [0, 1e6], got " + std::to_string(value));
        if (option == WUSH_OPTION_DAMPING) options->damping = value;
        else options->hessian_damping = value;
    });
}

WUSH_API wush_status wush_options_set_int(wush_options* options, wush_option option, int64_t value) {
    return guarded(__func__, [&] {
        options = require_handle(options, HandleType::Options, "options");
        if (option == WUSH_OPTION_SEED) {
            if (value < 0 || value > (int64_t(1) << 62))
                wush::fail(WUSH_ERR_INVALID_ARGUMENT,
                           "WUSH_OPTION_SEED must be in [0, 2^62], got " + std::to_string(value));
            options->seed = value;
        } else if (option == WUSH_OPTION_TRANSFORM_DTYPE) {
            if (value != WUSH_DTYPE_F32 && value != WUSH_DTYPE_BF16 && value != WUSH_DTYPE_F16)
                wush::fail(WUSH_ERR_INVALID_ARGUMENT,
                           "WUSH_OPTION_TRANSFORM_DTYPE must be a wush_dtype, got " + std::to_string(value));
            options->transform_dtype = wush_dtype(value);
        } else if (option == WUSH_OPTION_SEARCH) {
            if (value != 0 && value != 1)
                wush::fail(WUSH_ERR_INVALID_ARGUMENT,
                           "WUSH_OPTION_SEARCH must be 0 or 1, got " + std::to_string(value));
            options->search = value == 1;
        } else if (option == WUSH_OPTION_SEARCH_TOKENS) {
            if (value < 16 || value > 65536)
                wush::fail(WUSH_ERR_INVALID_ARGUMENT,
                           "WUSH_OPTION_SEARCH_TOKENS must be in [16, 65536], got " + std::to_string(value));
            options->search_tokens = value;
        } else if (option == WUSH_OPTION_SEARCH_GUARD) {
            if (value != 0 && value != 1)
                wush::fail(WUSH_ERR_INVALID_ARGUMENT,
                           "WUSH_OPTION_SEARCH_GUARD must be 0 or 1, got " + std::to_string(value));
            options->search_guard = value == 1;
        } else {
            bad_option(option, "integer");
        }
    });
}

WUSH_API wush_status wush_options_get_double(const wush_options* options, wush_option option, double* value) {
    return guarded(__func__, [&] {
        options = require_handle(options, HandleType::Options, "options");
        require_pointer(value, "value");
        if (option == WUSH_OPTION_DAMPING) *value = options->damping;
        else if (option == WUSH_OPTION_HESSIAN_DAMPING) *value = options->hessian_damping.value_or(options->damping);
        else bad_option(option, "double");
    });
}

WUSH_API wush_status wush_options_get_int(const wush_options* options, wush_option option, int64_t* value) {
    return guarded(__func__, [&] {
        options = require_handle(options, HandleType::Options, "options");
        require_pointer(value, "value");
        if (option == WUSH_OPTION_SEED) *value = options->seed;
        else if (option == WUSH_OPTION_TRANSFORM_DTYPE) *value = options->transform_dtype;
        else if (option == WUSH_OPTION_SEARCH) *value = options->search ? 1 : 0;
        else if (option == WUSH_OPTION_SEARCH_TOKENS) *value = options->search_tokens;
        else if (option == WUSH_OPTION_SEARCH_GUARD) *value = options->search_guard ? 1 : 0;
        else bad_option(option, "integer");
    });
}

WUSH_API wush_status wush_options_sample_size(const wush_options* options, size_t* tokens) {
    return guarded(__func__, [&] {
        const wush_options& o = options_or_defaults(options);
        require_pointer(tokens, "tokens");
        *tokens = o.search ? std::size_t(o.search_tokens) * (o.search_guard ? 2 : 1) : 0;
    });
}

WUSH_API wush_status wush_options_set_progress(wush_options* options, wush_progress_fn fn, void* user_data) {
    return guarded(__func__, [&] {
        options = require_handle(options, HandleType::Options, "options");
        options->progress = fn;
        options->progress_user = user_data;
    });
}

}  // extern "C"
