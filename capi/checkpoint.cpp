// wush_checkpoint: writing and reading libwush checkpoints (src/storage/checkpoint).
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "guard.h"
#include "handles.h"
#include "objects.h"
#include "options.h"
#include "storage/atomic_file.h"
#include "storage/checkpoint.h"
#include "storage/safetensors.h"

struct wush_checkpoint {
    struct Pending {
        std::string name;
        const wush_transform* transform;
        const wush_qweight* qweight;
        // Handles are addresses, which a later allocation may reuse: the generations tell
        // whether these are still the objects add_layer saw.
        std::uint64_t transform_generation;
        std::uint64_t qweight_generation;
        std::vector<wush::storage::LayerPart> parts;  // a grouped layer's; empty for a plain one
    };
    std::vector<Pending> pending;                             // a checkpoint being written
    std::unique_ptr<wush::storage::CheckpointReader> reader;  // an opened checkpoint
};

using namespace wush::capi;

namespace {

const wush::storage::CheckpointReader& opened(const wush_checkpoint* c) {
    c = require_handle(c, HandleType::Checkpoint, "checkpoint");
    if (!c->reader) wush::fail(WUSH_ERR_INVALID_ARGUMENT, "the checkpoint was not opened from a file");
    return *c->reader;
}

// Adds a layer (plain when `parts` is empty) after checking it against the layers and parts
// already added.
void add_layer(wush_checkpoint* checkpoint, const char* name, const wush_transform* transform,
               const wush_qweight* qweight, std::vector<wush::storage::LayerPart> parts) {
    checkpoint = require_handle(checkpoint, HandleType::Checkpoint, "checkpoint");
    require_pointer(name, "name");
    transform = require_handle(transform, HandleType::Transform, "transform");
    qweight = require_handle(qweight, HandleType::QWeight, "qweight");
    if (checkpoint->reader)
        wush::fail(WUSH_ERR_INVALID_ARGUMENT, "cannot add layers to a checkpoint opened for reading");
    // Validate now (names, geometry, parts), so errors surface where the layer is added.
    std::set<std::string> names;
    for (const auto& p : checkpoint->pending) {
        names.insert(p.name);
        for (const auto& part : p.parts) names.insert(part.name);
    }
    const wush::storage::LayerRef ref{name, &transform->core, &qweight->core, method_name(qweight->method), parts};
    wush::storage::check_layer_ref(ref, names);
    checkpoint->pending.push_back({name, transform, qweight, generation(transform, HandleType::Transform),
                                   generation(qweight, HandleType::QWeight), std::move(parts)});
}

// The parts of layer `name` of an opened checkpoint or one being written.
const std::vector<wush::storage::LayerPart>& layer_parts(const wush_checkpoint* checkpoint, const char* name) {
    checkpoint = require_handle(checkpoint, HandleType::Checkpoint, "checkpoint");
    require_pointer(name, "name");
    if (checkpoint->reader) return checkpoint->reader->parts(name);
    for (const auto& p : checkpoint->pending)
        if (p.name == name) return p.parts;
    wush::fail(WUSH_ERR_NOT_FOUND, "the checkpoint has no layer \"" + std::string(name) + "\"");
}

}  // namespace

extern "C" {

WUSH_API wush_status wush_checkpoint_create(wush_checkpoint** checkpoint) {
    return guarded(__func__, [&] {
        require_pointer(checkpoint, "checkpoint");
        auto c = std::make_unique<wush_checkpoint>();
        *checkpoint = hand_out(c.get(), HandleType::Checkpoint);
        c.release();
    });
}

WUSH_API wush_status wush_checkpoint_add_layer(wush_checkpoint* checkpoint, const char* name,
                                               const wush_transform* transform, const wush_qweight* qweight) {
    return guarded(__func__, [&] { add_layer(checkpoint, name, transform, qweight, {}); });
}

WUSH_API wush_status wush_checkpoint_add_grouped_layer(wush_checkpoint* checkpoint, const char* name,
                                                       const wush_transform* transform, const wush_qweight* qweight,
                                                       size_t part_count, const char* const* part_names,
                                                       const size_t* part_rows) {
    return guarded(__func__, [&] {
        if (part_count < 2)
            wush::fail(WUSH_ERR_INVALID_ARGUMENT, "a grouped layer has two or more parts, not " +
                                                      std::to_string(part_count) + " (use wush_checkpoint_add_layer)");
        require_pointer(part_names, "part_names");
        require_pointer(part_rows, "part_rows");
        std::vector<wush::storage::LayerPart> parts;
        for (std::size_t i = 0; i < part_count; ++i) {
            require_pointer(part_names[i], "part_names[i]");
            parts.push_back({part_names[i], part_rows[i]});
        }
        add_layer(checkpoint, name, transform, qweight, std::move(parts));
    });
}

WUSH_API wush_status wush_checkpoint_write(wush_checkpoint* checkpoint, const char* path, const wush_options* options) {
    return guarded(__func__, [&] {
        checkpoint = require_handle(checkpoint, HandleType::Checkpoint, "checkpoint");
        require_pointer(path, "path");
        if (checkpoint->reader) wush::fail(WUSH_ERR_INVALID_ARGUMENT, "the checkpoint was opened for reading");
        std::vector<wush::storage::LayerRef> refs;
        for (const auto& p : checkpoint->pending) {
            if (generation(p.transform, HandleType::Transform) != p.transform_generation ||
                generation(p.qweight, HandleType::QWeight) != p.qweight_generation)
                wush::fail(WUSH_ERR_INVALID_ARGUMENT,
                           "the transform or qweight of layer \"" + p.name + "\" was destroyed");
            refs.push_back({p.name, &p.transform->core, &p.qweight->core, method_name(p.qweight->method), p.parts});
        }
        wush::Progress progress = make_progress(options_or_defaults(options));
        wush::storage::write_checkpoint(path, refs, &progress);
    });
}

}  // extern "C"

namespace {

wush_status open_checkpoint(const char* function, const char* path, wush_checkpoint_mode mode,
                            wush_checkpoint** checkpoint) {
    return guarded(function, [&] {
        require_pointer(path, "path");
        require_pointer(checkpoint, "checkpoint");
        if (mode != WUSH_CHECKPOINT_MAP && mode != WUSH_CHECKPOINT_COPY)
            wush::fail(WUSH_ERR_INVALID_ARGUMENT, "unknown wush_checkpoint_mode " + std::to_string(int(mode)));
        using Load = wush::storage::Reader::Load;
        auto c = std::make_unique<wush_checkpoint>();
        c->reader = std::make_unique<wush::storage::CheckpointReader>(
            path, mode == WUSH_CHECKPOINT_COPY ? Load::Copy : Load::Map);
        *checkpoint = hand_out(c.get(), HandleType::Checkpoint);
        c.release();
    });
}

}  // namespace

extern "C" {

WUSH_API wush_status wush_checkpoint_open(const char* path, wush_checkpoint** checkpoint) {
    return open_checkpoint(__func__, path, WUSH_CHECKPOINT_MAP, checkpoint);
}

WUSH_API wush_status wush_checkpoint_open_mode(const char* path, wush_checkpoint_mode mode,
                                               wush_checkpoint** checkpoint) {
    return open_checkpoint(__func__, path, mode, checkpoint);
}

WUSH_API void wush_checkpoint_destroy(wush_checkpoint* checkpoint) {
    delete take_back(checkpoint, HandleType::Checkpoint);
}

WUSH_API wush_status wush_checkpoint_layer_count(const wush_checkpoint* checkpoint, size_t* count) {
    return guarded(__func__, [&] {
        checkpoint = require_handle(checkpoint, HandleType::Checkpoint, "checkpoint");
        require_pointer(count, "count");
        *count = checkpoint->reader ? checkpoint->reader->layer_names().size() : checkpoint->pending.size();
    });
}

WUSH_API wush_status wush_checkpoint_layer_name(const wush_checkpoint* checkpoint, size_t index, const char** name) {
    return guarded(__func__, [&] {
        checkpoint = require_handle(checkpoint, HandleType::Checkpoint, "checkpoint");
        require_pointer(name, "name");
        const std::size_t n =
            checkpoint->reader ? checkpoint->reader->layer_names().size() : checkpoint->pending.size();
        if (index >= n)
            wush::fail(WUSH_ERR_INVALID_ARGUMENT,
                       "layer index " + std::to_string(index) + " is out of range (" + std::to_string(n) + " layers)");
        *name = checkpoint->reader ? checkpoint->reader->layer_names()[index].c_str()
                                   : checkpoint->pending[index].name.c_str();
    });
}

WUSH_API wush_status wush_checkpoint_layer_part_count(const wush_checkpoint* checkpoint, const char* name,
                                                      size_t* count) {
    return guarded(__func__, [&] {
        require_pointer(count, "count");
        *count = layer_parts(checkpoint, name).size();
    });
}

WUSH_API wush_status wush_checkpoint_layer_part(const wush_checkpoint* checkpoint, const char* name, size_t index,
                                                const char** part_name, size_t* row_begin, size_t* rows) {
    return guarded(__func__, [&] {
        const auto& parts = layer_parts(checkpoint, name);
        if (index >= parts.size())
            wush::fail(WUSH_ERR_INVALID_ARGUMENT, "part index " + std::to_string(index) + " is out of range (layer \"" +
                                                      std::string(name) + "\" has " + std::to_string(parts.size()) +
                                                      " parts)");
        std::size_t begin = 0;
        for (std::size_t i = 0; i < index; ++i) begin += parts[i].rows;
        if (part_name) *part_name = parts[index].name.c_str();
        if (row_begin) *row_begin = begin;
        if (rows) *rows = parts[index].rows;
    });
}

WUSH_API wush_status wush_checkpoint_load_layer(const wush_checkpoint* checkpoint, const char* name,
                                                wush_transform** transform, wush_qweight** qweight) {
    return guarded(__func__, [&] {
        const wush::storage::CheckpointReader& r = opened(checkpoint);
        require_pointer(name, "name");
        wush::storage::CheckpointLayer layer = r.load(name);
        auto t = std::make_unique<wush_transform>(std::move(layer.transform));
        auto q = std::make_unique<wush_qweight>();
        q->core = layer.weights;
        q->method = method_from_name(layer.method);
        if (transform) {
            *transform = hand_out(t.get(), HandleType::Transform);
            t.release();
        }
        if (qweight) {
            *qweight = hand_out(q.get(), HandleType::QWeight);
            q.release();
        }
    });
}

WUSH_API wush_status wush_checkpoint_export_fp_quant(const wush_checkpoint* checkpoint, const char* path,
                                                     const char* config_path, const wush_options* options) {
    return guarded(__func__, [&] {
        const wush::storage::CheckpointReader& r = opened(checkpoint);
        require_pointer(path, "path");
        if (*path == '\0' || (config_path != nullptr && *config_path == '\0'))
            wush::fail(WUSH_ERR_INVALID_ARGUMENT, "the output path is empty");
        wush::Progress progress = make_progress(options_or_defaults(options));
        // The model and the config are committed together: a failed export leaves neither.
        wush::storage::export_fp_quant(r, path, &progress, config_path != nullptr ? config_path : "");
    });
}

}  // extern "C"
