// Forwarding header: the runtime loss is an evaluation concern and lives in eval/runtime_loss.h.
// Kept only until capi/runtime.cpp includes that header.
#pragma once

#include "eval/runtime_loss.h"

namespace wush::runtime {
using eval::runtime_layer_loss;
}  // namespace wush::runtime
