// The CUDA backend's entry points as the rest of the library sees them: plain C++ (no CUDA
// headers), so that cuda/module_entry.cpp (the module's one exported symbol, which the core's
// capi/backend_registry.cpp opens at run time) can name them without nvcc.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"

namespace wush::cuda {

struct DeviceQuery {
    int count = 0;      // usable devices; 0 when there is no driver or no device
    std::string error;  // the CUDA runtime's explanation when count == 0
};

DeviceQuery query_devices();

// A backend on CUDA device `device` (0 <= device < query_devices().count, checked by the caller).
// Throws wush::Error(CUDA) with the runtime's error text if the device cannot be initialized.
std::unique_ptr<backend::Backend> make_backend(int device);

}  // namespace wush::cuda
