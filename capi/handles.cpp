#include "handles.h"

#include <pthread.h>

#include <mutex>
#include <new>
#include <unordered_map>

#include "context.h"

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

Registry& registry();

// fork(): the table's lock is taken around the fork, so the child's copy of the table is whole
// (a lock held by another thread at the fork would never be released in the child: every call
// hangs there). In the child the lock, held by the thread that forked, is made anew rather than
// unlocked (as in threads/work_pool.cpp), and each live context is checked for a call that was
// in flight on another thread (mark_context_after_fork).
void lock_for_fork() {
    registry().mutex.lock();
}

void unlock_after_fork() {
    registry().mutex.unlock();
}

void reset_in_child() {
    Registry& r = registry();
    new (&r.mutex) std::mutex;
    for (const auto& [object, entry] : r.live)
        if (entry.type == HandleType::Context)
            mark_context_after_fork(*static_cast<wush_context*>(const_cast<void*>(object)));
}

Registry& registry() {
    static Registry* r = [] {
        auto* made = new Registry();  // never destroyed: handles may be released during exit
        pthread_atfork(lock_for_fork, unlock_after_fork, reset_in_child);
        return made;
    }();
    return *r;
}

// Made when libwush is loaded, so that its fork handlers are in place before the first handle.
[[maybe_unused]] Registry& g_made_at_load = registry();

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

namespace {

constexpr int kTagShift = 48;
constexpr std::uintptr_t kAddressMask = (std::uintptr_t(1) << kTagShift) - 1;

std::uintptr_t address(const void* p) {
    return reinterpret_cast<std::uintptr_t>(p);
}

// The handle of an object registered with `generation`: its address, tagged when the top bits are free.
std::uintptr_t handle_value(const void* object, std::uint64_t generation) {
    const std::uintptr_t a = address(object);
    if ((a & ~kAddressMask) != 0) return a;
    return a | (std::uintptr_t(generation & 0xFFFF) << kTagShift);
}

// The table entry of `handle` if it is live with `type` and carries the entry's generation.
std::unordered_map<const void*, Entry>::iterator find_live(Registry& r, const void* handle, HandleType type) {
    const std::uintptr_t h = address(handle);
    // Try the address without the tag, then (for an address above 2^48, handed out untagged) as it is.
    for (const std::uintptr_t a : {h & kAddressMask, h}) {
        auto it = r.live.find(reinterpret_cast<const void*>(a));
        if (it != r.live.end() && it->second.type == type && handle_value(it->first, it->second.generation) == h)
            return it;
    }
    return r.live.end();
}

}  // namespace

void* hand_out_object(void* object, HandleType type) {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    const std::uint64_t g = r.next_generation++;
    r.live[object] = {type, g};
    return reinterpret_cast<void*>(handle_value(object, g));
}

void* live_object(const void* handle, HandleType type) {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = find_live(r, handle, type);
    return it == r.live.end() ? nullptr : const_cast<void*>(it->first);
}

void* take_back_object(const void* handle, HandleType type) {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = find_live(r, handle, type);
    if (it == r.live.end()) return nullptr;
    void* object = const_cast<void*>(it->first);
    r.live.erase(it);
    return object;
}

void forget_object(const void* object, HandleType type) {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = r.live.find(object);
    if (it != r.live.end() && it->second.type == type) r.live.erase(it);
}

std::uint64_t generation(const void* object, HandleType type) {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = r.live.find(object);
    return it != r.live.end() && it->second.type == type ? it->second.generation : 0;
}

}  // namespace wush::capi
