// The CUDA runtime as the C API needs it: which devices are usable. Plain C++ interface so that
// capi/ needs no CUDA headers.
#pragma once

#include <string>

namespace wush::cuda {

struct DeviceQuery {
    int count = 0;       // usable devices; 0 when there is no driver or no device
    std::string error;   // the CUDA runtime's explanation when count == 0
};

DeviceQuery query_devices();

}  // namespace wush::cuda
