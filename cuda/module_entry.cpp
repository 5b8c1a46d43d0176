// The one exported symbol of libwush-cuda.so (src/backend/module_api.h): what the core's registry
// finds with dlsym after opening the module. Everything else in the module is hidden.
#include <cstdio>
#include <exception>

#include "backend/module_api.h"
#include "common/error.h"
#include "cuda_backend.h"

namespace wush::cuda {
namespace {

void report(backend::ModuleError* error, wush_status status, const char* message) {
    if (error == nullptr) return;
    error->status = status;
    std::snprintf(error->message, sizeof error->message, "%s", message);
}

int device_count(backend::ModuleError* error) {
    try {
        const DeviceQuery q = query_devices();
        if (q.count == 0) report(error, WUSH_ERR_UNSUPPORTED, q.error.c_str());
        return q.count;
    } catch (const std::exception& e) {
        report(error, WUSH_ERR_INTERNAL, e.what());
        return 0;
    }
}

backend::Backend* create(int device, backend::ModuleError* error) {
    try {
        return make_backend(device).release();
    } catch (const Error& e) {
        report(error, e.status(), e.what());
    } catch (const std::bad_alloc&) {
        report(error, WUSH_ERR_OUT_OF_MEMORY, "out of host memory creating the CUDA backend");
    } catch (const std::exception& e) {
        report(error, WUSH_ERR_INTERNAL, e.what());
    }
    return nullptr;
}

const backend::ModuleApi kApi = {
    backend::kModuleInterfaceVersion,
    WUSH_BUILD_KEY,
    backend::host_object_layout(),
    WUSH_BACKEND_CUDA,
    &device_count,
    &create,
};

}  // namespace
}  // namespace wush::cuda

extern "C" __attribute__((visibility("default"))) const wush::backend::ModuleApi* wush_backend_module_entry() {
    return &wush::cuda::kApi;
}
