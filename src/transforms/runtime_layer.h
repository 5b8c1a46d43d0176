// What every runtime backend checks and derives from a layer (a transform and its packed weights)
// before it runs it: one definition, so the CPU and CUDA backends, the C API and eval agree.
#pragma once

#include "formats/packed_matrix.h"
#include "transforms/block_transform.h"
#include "transforms/matrix_use.h"

namespace wush {

// One pass over the C G x G matrices; callers that reuse a transform keep the result.
MatrixUse classify_matrices(const BlockTransform& transform);

// The transform and the weights form one runnable layer: the weights' format has the transform's
// group size (16 or 32, what the runtimes support) and the same d_in. Throws INVALID_ARGUMENT or
// UNSUPPORTED with the reason.
void require_layer(const BlockTransform& transform, const formats::PackedMatrix& weights);

}  // namespace wush
