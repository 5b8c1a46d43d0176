// libwush checkpoints (docs/CHECKPOINT.md): per quantized layer the activation transform and the
// pre-quantized weights, in a safetensors file with libwush metadata. Also the export to the
// FP-Quant / HF-transformers "fp_quant" layout.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/progress.h"
#include "formats/packed_matrix.h"
#include "storage/safetensors.h"
#include "transforms/block_transform.h"

namespace wush::storage {

// The versions written. Version "2" added the optional per-layer digest `<layer>.sha256`; files
// of version "1" (no digests) are still read. Version "3" added grouped layers (`<layer>.parts`);
// a file is written as "3" only when it holds one, so files without groups stay readable by
// libraries that read "2".
inline constexpr const char* kCheckpointFormatVersion = "2";
inline constexpr const char* kGroupedFormatVersion = "3";

// A part of a grouped layer: a run of consecutive output rows that a host uses as the layer it
// replaces (q_proj, k_proj and v_proj of one grouped layer, in row order).
struct LayerPart {
    std::string name;
    std::size_t rows = 0;
};

// One layer to write; the referenced objects must outlive write_checkpoint().
struct LayerRef {
    std::string name;
    const BlockTransform* transform;
    const formats::PackedMatrix* weights;
    std::string method;              // "rtn" or "gptq"
    std::vector<LayerPart> parts{};  // empty: a plain layer; else two or more, rows summing to d_out
};

// Checks one layer (and its parts) against the rules of a checkpoint and against the names
// already taken by layers and parts (which it extends); throws INVALID_ARGUMENT.
void check_layer_ref(const LayerRef& layer, std::set<std::string>& names);

// Checks names, geometry and format/transform consistency, then writes atomically, streaming the
// tensors from the objects (no second copy). Throws INVALID_ARGUMENT, IO or CANCELLED.
void write_checkpoint(const std::string& path, const std::vector<LayerRef>& layers, Progress* progress);

struct CheckpointLayer {
    std::string name;
    BlockTransform transform;
    formats::PackedMatrix weights;  // borrows the mapped file
    std::string method;
};

// A checkpoint opened read-only (memory-mapped, or copied into memory: Reader::Load). The
// constructor validates the safetensors structure and every libwush rule (docs/CHECKPOINT.md) before
// returning, and in copy mode every recorded digest (verify()): CORRUPT_FILE names the first
// violation.
class CheckpointReader {
public:
    explicit CheckpointReader(const std::string& path, Reader::Load load = Reader::Load::Map);
    const std::vector<std::string>& layer_names() const noexcept { return names_; }
    // The parts of a grouped layer in row order (empty for a plain layer); NOT_FOUND for an
    // unknown name.
    const std::vector<LayerPart>& parts(std::string_view name) const;
    // Builds the layer's transform (deriving the weight side) and borrows its weights. `name` may
    // also be a part of a grouped layer: the group's transform with the part's rows. Throws
    // NOT_FOUND for an unknown name, CORRUPT_FILE for a singular or non-finite transform or a NaN
    // scale.
    CheckpointLayer load(std::string_view name) const;
    const Header& header() const noexcept { return file_->header(); }
    // Recomputes the digest of every layer that has one and compares it with the recorded one;
    // throws CORRUPT_FILE naming the first layer whose bytes differ. Returns the number of
    // layers verified (0 for a version "1" file). Reads the whole file. A checkpoint opened in
    // copy mode was verified by its constructor.
    std::size_t verify() const;
    // Whether `path` names this checkpoint's file (Reader::is_file).
    bool is_file(const std::string& path) const noexcept { return file_->is_file(path); }

private:
    CheckpointLayer load_part(const std::string& name) const;

    std::shared_ptr<const Reader> file_;
    std::vector<std::string> names_;
    std::map<std::string, std::vector<LayerPart>, std::less<>> parts_;  // every layer, plain ones empty
};

// Writes the fp_quant layout of every layer (MXFP4 and NVFP4 only; the transforms must be exactly
// representable in bf16, the dtype that layout stores) to `path` and, unless `config_path` is
// empty, its quantization_config JSON to `config_path`: both files or neither (commit_both), so
// a failed export leaves no file behind. Refuses (INVALID_ARGUMENT) an output that is the
// checkpoint's own file or the other output. Returns the quantization_config JSON.
std::string export_fp_quant(const CheckpointReader& checkpoint, const std::string& path, Progress* progress,
                            const std::string& config_path = {});

}  // namespace wush::storage
