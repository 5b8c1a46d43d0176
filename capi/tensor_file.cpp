// wush_tensor_file: the read-only safetensors reader behind the C API.
#include <memory>
#include <string>

#include "guard.h"
#include "handles.h"
#include "storage/safetensors.h"

struct wush_tensor_file {
    explicit wush_tensor_file(const std::string& path) : reader(path) {}
    wush::storage::Reader reader;
};

using namespace wush::capi;

namespace {

const wush::storage::TensorInfo& tensor_at(const wush_tensor_file* f, std::size_t index) {
    const auto& tensors = f->reader.header().tensors;
    if (index >= tensors.size())
        wush::fail(WUSH_ERR_INVALID_ARGUMENT, "tensor index " + std::to_string(index) + " is out of range (" +
                                                  std::to_string(tensors.size()) + " tensors)");
    return tensors[index];
}

}  // namespace

extern "C" {

WUSH_API wush_status wush_tensor_file_open(const char* path, wush_tensor_file** file) {
    return guarded(__func__, [&] {
        require_pointer(path, "path");
        require_pointer(file, "file");
        auto f = std::make_unique<wush_tensor_file>(path);
        *file = hand_out(f.get(), HandleType::TensorFile);
        f.release();
    });
}

WUSH_API void wush_tensor_file_destroy(wush_tensor_file* file) {
    delete take_back(file, HandleType::TensorFile);
}

WUSH_API wush_status wush_tensor_file_count(const wush_tensor_file* file, size_t* count) {
    return guarded(__func__, [&] {
        file = require_handle(file, HandleType::TensorFile, "file");
        require_pointer(count, "count");
        *count = file->reader.header().tensors.size();
    });
}

WUSH_API wush_status wush_tensor_file_tensor(const wush_tensor_file* file, size_t index, const char** name,
                                             const char** dtype, size_t* ndim, const uint64_t** shape,
                                             const void** data, size_t* bytes) {
    return guarded(__func__, [&] {
        file = require_handle(file, HandleType::TensorFile, "file");
        const wush::storage::TensorInfo& t = tensor_at(file, index);
        const auto span = file->reader.bytes(t);
        if (name) *name = t.name.c_str();
        if (dtype) *dtype = t.dtype.c_str();
        if (ndim) *ndim = t.shape.size();
        if (shape) *shape = t.shape.data();
        if (data) *data = span.data();
        if (bytes) *bytes = span.size();
    });
}

WUSH_API wush_status wush_tensor_file_find(const wush_tensor_file* file, const char* name, size_t* index) {
    return guarded(__func__, [&] {
        file = require_handle(file, HandleType::TensorFile, "file");
        require_pointer(name, "name");
        require_pointer(index, "index");
        const wush::storage::TensorInfo* t = file->reader.find(name);
        if (t != nullptr) {
            *index = std::size_t(t - file->reader.header().tensors.data());
            return;
        }
        wush::fail(WUSH_ERR_NOT_FOUND, std::string("no tensor named \"") + name + "\"");
    });
}

WUSH_API wush_status wush_tensor_file_metadata(const wush_tensor_file* file, const char* key, const char** value) {
    return guarded(__func__, [&] {
        file = require_handle(file, HandleType::TensorFile, "file");
        require_pointer(key, "key");
        require_pointer(value, "value");
        const auto& meta = file->reader.header().metadata;
        const auto it = meta.find(key);
        if (it == meta.end()) wush::fail(WUSH_ERR_NOT_FOUND, std::string("no metadata key \"") + key + "\"");
        *value = it->second.c_str();
    });
}

}  // extern "C"
