// The one place that knows every backend, above both of them: the CPU backend is part of the
// core; the CUDA backend is a separate shared object (libwush-cuda.so) opened on demand, so that a
// host which never creates a CUDA context never loads the CUDA runtime or cuBLAS — and a machine
// without them can load libwush at all (docs/RUNTIME.md, "Backends as modules").
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "backend/backend.h"
#include "backend/module_api.h"
#include "backend/module_file.h"
#include "common/error.h"
#include "cpu/cpu_backend.h"

namespace wush::backend {

namespace {

constexpr const char* kCudaModuleFile = "libwush-cuda.so";
constexpr const char* kCudaModuleVariable = "WUSH_CUDA_MODULE";

// The directory holding this library (libwush.so), where the install puts the module beside it.
std::string own_directory() {
    Dl_info info{};
    if (dladdr(reinterpret_cast<const void*>(&own_directory), &info) == 0 || info.dli_fname == nullptr) return {};
    const std::string path = info.dli_fname;
    const auto slash = path.rfind('/');
    return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

std::string loader_error() {
    const char* e = dlerror();
    return e != nullptr ? e : "unknown loader error";
}

// Checks that the module comes from this very build; the reason when it does not.
std::string incompatibility(const ModuleApi* api) {
    if (api == nullptr) return "its entry point returned no interface";
    if (api->interface_version != kModuleInterfaceVersion)
        return "module interface " + std::to_string(api->interface_version) + ", this library expects " +
               std::to_string(kModuleInterfaceVersion);
    if (api->build_key == nullptr || std::strcmp(api->build_key, WUSH_BUILD_KEY) != 0)
        return std::string("it was built for libwush '") + (api->build_key ? api->build_key : "?") +
               "', this library is '" + WUSH_BUILD_KEY + "'";
    const ModuleLayout mine = host_object_layout();
    const ModuleLayout theirs = api->layout;
    if (std::memcmp(&mine, &theirs, sizeof mine) != 0) return "its host object layout differs from this library's";
    if (api->kind != WUSH_BACKEND_CUDA || api->device_count == nullptr || api->make_backend == nullptr)
        return "it does not serve the CUDA backend";
    return {};
}

// Opens `path` and returns its interface, or appends why not to `why`. A path is checked before
// the loader sees it (backend/module_file.h); a bare name is the loader's to find, by its own
// search rules, and cannot be checked before it is opened.
const ModuleApi* open_module(const std::string& path, std::string& why) {
    if (path.find('/') != std::string::npos) {
        if (const std::string bad = module_file_problem(path); !bad.empty()) {
            why += "\n  " + path + ": not loaded: " + bad;
            return nullptr;
        }
    }
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
        why += "\n  " + path + ": " + loader_error();
        return nullptr;
    }
    const auto entry = reinterpret_cast<ModuleEntry>(dlsym(handle, kModuleEntrySymbol));
    if (entry == nullptr) {
        why += "\n  " + path + ": no symbol " + kModuleEntrySymbol;
        dlclose(handle);
        return nullptr;
    }
    const ModuleApi* api = entry();
    if (const std::string bad = incompatibility(api); !bad.empty()) {
        why += "\n  " + path + ": not usable: " + bad;
        dlclose(handle);
        return nullptr;
    }
    // Kept open for the life of the process: backends made by it may outlive any one context, and
    // unloading the CUDA runtime while the process runs is not safe.
    return api;
}

const ModuleApi* find_cuda_module(std::string& why) {
    // secure_getenv: a set-user-ID host must not load a library named by whoever started it.
    if (const char* forced = ::secure_getenv(kCudaModuleVariable); forced != nullptr && *forced != '\0')
        return open_module(forced, why);
    if (const std::string dir = own_directory(); !dir.empty())
        if (const ModuleApi* api = open_module(dir + "/" + kCudaModuleFile, why)) return api;
    return open_module(kCudaModuleFile, why);  // the loader's search path
}

// The process-wide module slot: loading is idempotent and the result never changes once found,
// so one cached pointer behind a mutex is the whole state. A failed search is not cached (the
// module may be installed, or WUSH_CUDA_MODULE set, before the next try).
const ModuleApi& cuda_module() {
    static std::mutex mutex;
    static const ModuleApi* found = nullptr;
    const std::lock_guard lock(mutex);
    if (found != nullptr) return *found;
    std::string why;
    found = find_cuda_module(why);
    if (found == nullptr)
        fail(WUSH_ERR_UNSUPPORTED, std::string("the CUDA backend module could not be loaded (install ") +
                                       kCudaModuleFile + " beside libwush, or set " + kCudaModuleVariable +
                                       " to its path):" + why);
    return *found;
}

std::unique_ptr<Backend> make_cuda(int device) {
    if (device < 0) fail(WUSH_ERR_INVALID_ARGUMENT, "CUDA device index " + std::to_string(device) + " is negative");
    const ModuleApi& module = cuda_module();
    ModuleError error;
    const int count = module.device_count(&error);
    if (count <= 0) fail(WUSH_ERR_UNSUPPORTED, std::string("no usable CUDA device: ") + error.message);
    if (device >= count)
        fail(WUSH_ERR_INVALID_ARGUMENT,
             "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) + " present)");
    std::unique_ptr<Backend> made(module.make_backend(device, &error));
    if (made == nullptr) fail(error.status != WUSH_OK ? error.status : WUSH_ERR_CUDA, error.message);
    return made;
}

}  // namespace

std::unique_ptr<Backend> make_backend(wush_backend kind, int device) {
    switch (kind) {
        case WUSH_BACKEND_CPU:
            if (device != 0)
                fail(WUSH_ERR_INVALID_ARGUMENT, "a CPU context takes device 0, got " + std::to_string(device));
            return cpu::make_cpu_backend();
        case WUSH_BACKEND_CUDA: return make_cuda(device);
        default: break;  // out-of-range values are handled after the switch
    }
    fail(WUSH_ERR_INVALID_ARGUMENT, "unknown wush_backend " + std::to_string(int(kind)));
}

}  // namespace wush::backend
