#include "handles.h"

#include <mutex>
#include <unordered_map>

namespace wush::capi {

namespace {

// The one piece of process-wide mutable state: the table of live handles, guarded by a mutex.
struct Entry {
    HandleType type;
    std::uint64_t generation;
};

struct Registry {
    std::mutex mutex;
    std::unordered_map<const void*, Entry> live;
    std::uint64_t next_generation = 1;
};

Registry& registry() {
    static Registry* r = new Registry();  // never destroyed: handles may be released during exit
    return *r;
}

}  // namespace

const char* handle_type_name(HandleType type) {
    switch (type) {
        case HandleType::Context: return "wush_context";
        case HandleType::Calibrator: return "wush_calibrator";
        case HandleType::Transform: return "wush_transform";
        case HandleType::QWeight: return "wush_qweight";
        case HandleType::Checkpoint: return "wush_checkpoint";
        case HandleType::TensorFile: return "wush_tensor_file";
        case HandleType::Options: return "wush_options";
        case HandleType::Linear: return "wush_linear";
    }
    return "handle";
}

void register_handle(const void* handle, HandleType type) {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    r.live[handle] = {type, r.next_generation++};
}

bool unregister_handle(const void* handle, HandleType type) {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = r.live.find(handle);
    if (it == r.live.end() || it->second.type != type) return false;
    r.live.erase(it);
    return true;
}

bool is_live(const void* handle, HandleType type) {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = r.live.find(handle);
    return it != r.live.end() && it->second.type == type;
}

std::uint64_t generation(const void* handle, HandleType type) {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = r.live.find(handle);
    return it != r.live.end() && it->second.type == type ? it->second.generation : 0;
}

}  // namespace wush::capi
