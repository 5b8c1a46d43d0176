// The one place that knows every backend. Adding a backend adds a case here and its own files;
// the C API only ever sees backend::Backend.
#include <string>

#include "backend/backend.h"
#include "common/error.h"
#include "cpu/cpu_backend.h"
#ifdef WUSH_HAVE_CUDA
#include "cuda_backend.h"  // cuda/: plain C++ entry points of the CUDA backend
#endif

namespace wush::backend {

namespace {

std::unique_ptr<Backend> make_cuda(int device) {
    if (device < 0) fail(WUSH_ERR_INVALID_ARGUMENT, "CUDA device index " + std::to_string(device) + " is negative");
#ifdef WUSH_HAVE_CUDA
    const cuda::DeviceQuery q = cuda::query_devices();
    if (q.count == 0) fail(WUSH_ERR_UNSUPPORTED, "no usable CUDA device: " + q.error);
    if (device >= q.count)
        fail(WUSH_ERR_INVALID_ARGUMENT,
             "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(q.count) + " present)");
    return cuda::make_backend(device);
#else
    fail(WUSH_ERR_UNSUPPORTED, "this libwush was built without the CUDA backend (WUSH_CUDA=OFF or no nvcc)");
#endif
}

}  // namespace

std::unique_ptr<Backend> make_backend(wush_backend kind, int device) {
    switch (kind) {
        case WUSH_BACKEND_CPU:
            if (device != 0) fail(WUSH_ERR_INVALID_ARGUMENT, "a CPU context takes device 0, got " + std::to_string(device));
            return runtime::make_cpu_backend();
        case WUSH_BACKEND_CUDA: return make_cuda(device);
        default: break;  // out-of-range values are handled after the switch
    }
    fail(WUSH_ERR_INVALID_ARGUMENT, "unknown wush_backend " + std::to_string(int(kind)));
}

}  // namespace wush::backend
