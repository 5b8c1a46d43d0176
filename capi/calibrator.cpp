// wush_calibrator: streaming second moments (src/calibration).
#include <memory>
#include <string>

#include "context.h"
#include "guard.h"
#include "objects.h"

using namespace wush::capi;

namespace {

wush::MomentMode moment_mode(wush_moment_mode mode) {
    switch (mode) {
        case WUSH_MOMENTS_BLOCK_DIAGONAL: return wush::MomentMode::BlockDiagonal;
        case WUSH_MOMENTS_FULL: return wush::MomentMode::Full;
        default: break;
    }
    wush::fail(WUSH_ERR_INVALID_ARGUMENT, "unknown wush_moment_mode " + std::to_string(int(mode)));
}

void require_size(std::size_t have, std::size_t need, const char* name) {
    if (have < need)
        wush::fail(WUSH_ERR_BUFFER_TOO_SMALL, std::string(name) + " holds " + std::to_string(have) + " doubles, " +
                                                  std::to_string(need) + " are needed");
}

std::size_t state_size_of(const wush::Calibrator& c) {
    return wush::Calibrator::state_size(c.d_in(), c.group(), c.mode(), c.sample_capacity(), c.validation_capacity());
}

}  // namespace

extern "C" {

WUSH_API wush_status wush_calibrator_create(size_t d_in, size_t group_size, wush_moment_mode mode,
                                            wush_calibrator** calibrator) {
    return guarded(__func__, [&] {
        require_pointer(calibrator, "calibrator");
        auto c = std::make_unique<wush_calibrator>(wush::Calibrator(d_in, group_size, moment_mode(mode)));
        *calibrator = hand_out(c.get(), HandleType::Calibrator);
        c.release();
    });
}

WUSH_API void wush_calibrator_destroy(wush_calibrator* calibrator) {
    delete take_back(calibrator, HandleType::Calibrator);
}

WUSH_API wush_status wush_calibrator_add(wush_context* ctx, wush_calibrator* calibrator, wush_dtype dtype,
                                         const void* x, size_t n_tokens) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        calibrator = require_handle(calibrator, HandleType::Calibrator, "calibrator");
        require_pointer(x, "x");
        use.backend().calibrate(calibrator->core, dtype, x, n_tokens, 0);
    });
}

WUSH_API wush_status wush_calibrator_add_sequences(wush_context* ctx, wush_calibrator* calibrator, wush_dtype dtype,
                                                   const void* x, size_t n_tokens, size_t sequence_length) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        calibrator = require_handle(calibrator, HandleType::Calibrator, "calibrator");
        require_pointer(x, "x");
        if (sequence_length == 0 || n_tokens % sequence_length != 0)
            wush::fail(WUSH_ERR_INVALID_ARGUMENT, "sequence_length " + std::to_string(sequence_length) +
                                                      " does not divide n_tokens " + std::to_string(n_tokens));
        use.backend().calibrate(calibrator->core, dtype, x, n_tokens, sequence_length);
    });
}

WUSH_API wush_status wush_calibrator_add_document(wush_context* ctx, wush_calibrator* calibrator, wush_dtype dtype,
                                                  const void* x, size_t n_tokens, uint64_t document) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        calibrator = require_handle(calibrator, HandleType::Calibrator, "calibrator");
        require_pointer(x, "x");
        // The backends add through Calibrator::add, which marks the tokens while the scope lives.
        wush::Calibrator::DocumentScope scope(calibrator->core, document);
        use.backend().calibrate(calibrator->core, dtype, x, n_tokens, 0);
    });
}

WUSH_API wush_status wush_calibrator_merge(wush_calibrator* into, const wush_calibrator* from) {
    return guarded(__func__, [&] {
        into = require_handle(into, HandleType::Calibrator, "into");
        from = require_handle(from, HandleType::Calibrator, "from");
        if (into == from) wush::fail(WUSH_ERR_INVALID_ARGUMENT, "cannot merge a calibrator into itself");
        into->core.merge(from->core);
    });
}

WUSH_API wush_status wush_calibrator_token_count(const wush_calibrator* calibrator, uint64_t* n_tokens) {
    return guarded(__func__, [&] {
        calibrator = require_handle(calibrator, HandleType::Calibrator, "calibrator");
        require_pointer(n_tokens, "n_tokens");
        *n_tokens = calibrator->core.tokens();
    });
}

WUSH_API wush_status wush_calibrator_second_moment(const wush_calibrator* calibrator, size_t block, double* m,
                                                   size_t count) {
    return guarded(__func__, [&] {
        calibrator = require_handle(calibrator, HandleType::Calibrator, "calibrator");
        require_pointer(m, "m");
        const std::size_t g = calibrator->core.group();
        require_size(count, g * g, "m");
        const std::vector<double> moment = calibrator->core.second_moment(block);
        std::copy(moment.begin(), moment.end(), m);
    });
}

WUSH_API wush_status wush_calibrator_state_size(const wush_calibrator* calibrator, size_t* n_doubles) {
    return guarded(__func__, [&] {
        calibrator = require_handle(calibrator, HandleType::Calibrator, "calibrator");
        require_pointer(n_doubles, "n_doubles");
        *n_doubles = state_size_of(calibrator->core);
    });
}

WUSH_API wush_status wush_calibrator_export_state(const wush_calibrator* calibrator, double* state, size_t n_doubles) {
    return guarded(__func__, [&] {
        calibrator = require_handle(calibrator, HandleType::Calibrator, "calibrator");
        require_pointer(state, "state");
        const wush::Calibrator& c = calibrator->core;
        require_size(n_doubles, state_size_of(c), "state");
        const std::vector<double> s = c.export_state();
        std::copy(s.begin(), s.end(), state);
    });
}

WUSH_API wush_status wush_calibrator_import_state(wush_calibrator* calibrator, const double* state, size_t n_doubles) {
    return guarded(__func__, [&] {
        calibrator = require_handle(calibrator, HandleType::Calibrator, "calibrator");
        require_pointer(state, "state");
        const wush::Calibrator& c = calibrator->core;
        // Older layouts still import: version 1 (no samples) and version 2 (no validation sample).
        const std::size_t need = state_size_of(c);
        const std::size_t need_v1 = wush::Calibrator::state_size(c.d_in(), c.group(), c.mode());
        const std::size_t need_v2 = wush::Calibrator::state_size(c.d_in(), c.group(), c.mode(), c.sample_capacity());
        if (n_doubles != need && n_doubles != need_v1 && n_doubles != need_v2)
            wush::fail(WUSH_ERR_INVALID_ARGUMENT, "state holds " + std::to_string(n_doubles) +
                                                      " doubles, this calibrator's "
                                                      "state has " +
                                                      std::to_string(need));
        wush::Calibrator imported =
            wush::Calibrator::import_state({state, n_doubles}, c.sample_capacity(), c.validation_capacity());
        if (imported.d_in() != c.d_in() || imported.group() != c.group() || imported.mode() != c.mode() ||
            imported.sample_capacity() != c.sample_capacity() ||
            imported.validation_capacity() != c.validation_capacity())
            wush::fail(WUSH_ERR_INVALID_ARGUMENT,
                       "the state's geometry (d_in, G, mode, token and validation sample "
                       "sizes) differs from the calibrator's");
        calibrator->core = std::move(imported);
    });
}

WUSH_API wush_status wush_calibrator_set_sample_size(wush_calibrator* calibrator, size_t n_tokens) {
    return guarded(__func__, [&] {
        calibrator = require_handle(calibrator, HandleType::Calibrator, "calibrator");
        calibrator->core.set_sample_capacity(n_tokens);
    });
}

WUSH_API wush_status wush_calibrator_sample_count(const wush_calibrator* calibrator, size_t* n_tokens) {
    return guarded(__func__, [&] {
        calibrator = require_handle(calibrator, HandleType::Calibrator, "calibrator");
        require_pointer(n_tokens, "n_tokens");
        *n_tokens = calibrator->core.sample_count();
    });
}

WUSH_API wush_status wush_calibrator_set_validation_size(wush_calibrator* calibrator, size_t n_tokens) {
    return guarded(__func__, [&] {
        calibrator = require_handle(calibrator, HandleType::Calibrator, "calibrator");
        calibrator->core.set_validation_capacity(n_tokens);
    });
}

WUSH_API wush_status wush_calibrator_add_validation(wush_context* ctx, wush_calibrator* calibrator, wush_dtype dtype,
                                                    const void* x, size_t n_tokens) {
    return guarded(__func__, [&] {
        ContextUse use(ctx, "ctx");
        calibrator = require_handle(calibrator, HandleType::Calibrator, "calibrator");
        require_pointer(x, "x");
        use.backend().add_validation(calibrator->core, dtype, x, n_tokens);
    });
}

WUSH_API wush_status wush_calibrator_validation_count(const wush_calibrator* calibrator, size_t* n_tokens) {
    return guarded(__func__, [&] {
        calibrator = require_handle(calibrator, HandleType::Calibrator, "calibrator");
        require_pointer(n_tokens, "n_tokens");
        *n_tokens = calibrator->core.validation_count();
    });
}

}  // extern "C"
