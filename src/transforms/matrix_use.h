// How a runtime reads a transform's block matrices, decided by their values rather than by the
// kind's name (a checkpoint may store any matrices under "identity" or "hadamard"):
//   None      every block is exactly the identity: no multiply (x_b is quantized as it is);
//   Shared    every block equals block 0: one G x G matrix, which stays in L1 / shared memory;
//   PerBlock  otherwise.
// One enum for every backend; plain enough for device code (no includes, no functions).
#pragma once

namespace wush {

enum class MatrixUse : int { None = 0, Shared = 1, PerBlock = 2 };

}  // namespace wush
