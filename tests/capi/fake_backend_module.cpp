// A backend module from "another build" (tests/capi/test_cuda_module.c): it exports the entry
// point with a build key no libwush has, so the core must refuse it before using anything in it.
#include "backend/module_api.h"

namespace {

int no_devices(wush::backend::ModuleError*) {
    return 0;
}
wush::backend::Backend* no_backend(int, wush::backend::ModuleError*) {
    return nullptr;
}

const wush::backend::ModuleApi kApi = {
    wush::backend::kModuleInterfaceVersion,
    "0.0.0+not-this-build",
    wush::backend::host_object_layout(),
    WUSH_BACKEND_CUDA,
    &no_devices,
    &no_backend,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const wush::backend::ModuleApi* wush_backend_module_entry() {
    return &kApi;
}
