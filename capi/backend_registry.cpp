// The one place that knows every backend, above both of them: the CPU backend is part of the
// core; the CUDA backend is a separate shared object (libwush-cuda.so) opened on demand, so that a
// host which never creates a CUDA context never loads the CUDA runtime or cuBLAS — and a machine
// without them can load libwush at all (docs/RUNTIME.md, "Backends as modules").
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <sys/stat.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/module_api.h"
#include "backend/module_file.h"
#include "common/error.h"
#include "common/escape.h"
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

// Opens the module at `path` (a path with a '/', so the loader opens that very file and searches
// nothing) and returns its interface, or appends why not to `why`. The file is checked before the
// loader sees it (backend/module_file.h): the loader trusts its input, and a damaged module kills
// the host inside dlopen.
const ModuleApi* open_module(const std::string& path, std::string& why) {
    if (const std::string bad = module_file_problem(path); !bad.empty()) {
        why += "\n  " + escape_controls(path) + ": not loaded: " + bad;
        return nullptr;
    }
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
        why += "\n  " + escape_controls(path) + ": " + loader_error();
        return nullptr;
    }
    const auto entry = reinterpret_cast<ModuleEntry>(dlsym(handle, kModuleEntrySymbol));
    if (entry == nullptr) {
        why += "\n  " + escape_controls(path) + ": no symbol " + kModuleEntrySymbol;
        dlclose(handle);
        return nullptr;
    }
    const ModuleApi* api = entry();
    if (const std::string bad = incompatibility(api); !bad.empty()) {
        why += "\n  " + escape_controls(path) + ": not usable: " + bad;
        dlclose(handle);
        return nullptr;
    }
    // Kept open for the life of the process: backends made by it may outlive any one context, and
    // unloading the CUDA runtime while the process runs is not safe.
    return api;
}

// The directories the dynamic loader searches for a library that libwush opens by bare name, in
// its order (DT_RPATH, LD_LIBRARY_PATH, DT_RUNPATH, the system directories), as the loader itself
// reports them (dlinfo RTLD_DI_SERINFO on libwush's own handle). Its cache (/etc/ld.so.cache) is
// not among them.
std::vector<std::string> loader_directories() {
    Dl_info info{};
    if (dladdr(reinterpret_cast<const void*>(&loader_directories), &info) == 0 || info.dli_fname == nullptr) return {};
    void* self = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (self == nullptr) return {};
    std::vector<std::string> dirs;
    Dl_serinfo sizes{};
    if (dlinfo(self, RTLD_DI_SERINFOSIZE, &sizes) == 0 && sizes.dls_size >= sizeof(Dl_serinfo)) {
        std::vector<std::max_align_t> storage(sizes.dls_size / sizeof(std::max_align_t) + 1);
        auto* list = reinterpret_cast<Dl_serinfo*>(storage.data());
        list->dls_size = sizes.dls_size;
        list->dls_cnt = sizes.dls_cnt;
        if (dlinfo(self, RTLD_DI_SERINFO, list) == 0)
            for (unsigned i = 0; i < list->dls_cnt; ++i)
                if (list->dls_serpath[i].dls_name != nullptr) dirs.emplace_back(list->dls_serpath[i].dls_name);
    }
    dlclose(self);
    return dirs;
}

bool exists(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
}

// The first copy of `name` in the loader's search path (loader_directories) that passes the
// checks and opens, or nullptr (each copy refused, or the name not found, is told in `why`). The
// loader given the bare name would open the first copy it finds, unchecked; a refused copy is
// passed over here as the loader passes over a library of another architecture.
const ModuleApi* open_from_loader_path(const std::string& name, std::string& why) {
    for (const std::string& dir : loader_directories()) {
        const std::string path = (dir.empty() ? "." : dir) + "/" + name;
        if (exists(path))
            if (const ModuleApi* api = open_module(path, why)) return api;
    }
    why += "\n  " + escape_controls(name) + ": no usable copy in the loader's search path";
    return nullptr;
}

const ModuleApi* find_cuda_module(std::string& why) {
    // secure_getenv: a set-user-ID host must not load a library named by whoever started it.
    if (const char* forced = ::secure_getenv(kCudaModuleVariable); forced != nullptr && *forced != '\0') {
        const std::string path = forced;
        return path.find('/') != std::string::npos ? open_module(path, why) : open_from_loader_path(path, why);
    }
    if (const std::string dir = own_directory(); !dir.empty())
        if (const ModuleApi* api = open_module(dir + "/" + kCudaModuleFile, why)) return api;
    return open_from_loader_path(kCudaModuleFile, why);
}

// The process-wide module slot: loading is idempotent and the result never changes once found,
// so one cached pointer behind a mutex is the whole state. A failed search is not cached (the
// module may be installed, or WUSH_CUDA_MODULE set, before the next try). fork(): the lock is
// taken around it (a search in flight on another thread would leave it held in the child for
// good) and made anew in the child, whose one thread is the one that took it.
struct ModuleSlot {
    std::mutex mutex;
    const ModuleApi* found = nullptr;
};

ModuleSlot& module_slot() {
    static ModuleSlot* slot = [] {
        auto* made = new ModuleSlot();  // never destroyed: backends made from it may outlive exit
        pthread_atfork([] { module_slot().mutex.lock(); }, [] { module_slot().mutex.unlock(); },
                       [] { new (&module_slot().mutex) std::mutex; });
        return made;
    }();
    return *slot;
}

const ModuleApi& cuda_module() {
    ModuleSlot& slot = module_slot();
    const std::lock_guard lock(slot.mutex);
    const ModuleApi*& found = slot.found;
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
