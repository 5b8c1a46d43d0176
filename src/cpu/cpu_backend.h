// The CPU backend: the runtime kernels of src/cpu behind backend::Backend.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace wush::cpu {

std::unique_ptr<backend::Backend> make_cpu_backend();

}  // namespace wush::cpu
