// Checkpoint commands: `wush quantize` (write), `wush inspect` (validate and list),
// `wush export --fp-quant`, and `wush eval --checkpoint` (measure a stored checkpoint).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cli.h"
#include "commands.h"
#include "layers.h"

namespace {

int progress_to_stderr(void* user, double fraction) {
    const char* what = static_cast<const char*>(user);
    std::fprintf(stderr, "\r%s %3d%%", what, int(fraction * 100.0 + 0.5));
    if (fraction >= 1.0) std::fprintf(stderr, "\n");
    return 0;
}

bool dtype_from_name(const std::string& s, wush_dtype* d) {
    if (s == "f32") *d = WUSH_DTYPE_F32;
    else if (s == "bf16") *d = WUSH_DTYPE_BF16;
    else if (s == "f16") *d = WUSH_DTYPE_F16;
    else return false;
    return true;
}

// What the search's per-layer guard decided for one layer (wush_transform_guard).
struct GuardLine {
    std::string layer;
    wush_guard_source source = WUSH_GUARD_NONE;
    std::size_t n_tokens = 0;
    wush_guard_candidate kept = WUSH_GUARD_SEARCHED;
    double loss[cli::kGuardCandidates] = {}, difference[cli::kGuardCandidates] = {},
           std_error[cli::kGuardCandidates] = {};
    int replaces[cli::kGuardCandidates] = {};
    int undecided = 0;  // wush_transform_guard_undecided
    wush_guard_candidate undecided_candidate = WUSH_GUARD_SEARCHED;
    std::size_t n_sequences = 0;
};

const char* source_name(wush_guard_source s, bool json) {
    switch (s) {
        case WUSH_GUARD_VALIDATION: return "validation";
        case WUSH_GUARD_HOLD_OUT: return json ? "hold_out" : "hold-out";
        case WUSH_GUARD_HOLD_OUT_SEQUENCES: return json ? "hold_out_sequences" : "sequences";
        case WUSH_GUARD_HOLD_OUT_DOCUMENTS: return json ? "hold_out_documents" : "documents";
        default: return "none";
    }
}

using cli::kGuardCandidateNames;
using cli::kGuardCandidates;

wush_status read_guard(const std::string& name, const wush_transform* t, GuardLine* g) {
    g->layer = name;
    wush_status st = wush_transform_guard(t, &g->source, &g->n_tokens, &g->kept);
    if (st == WUSH_OK) st = wush_transform_guard_undecided(t, &g->undecided, &g->undecided_candidate, &g->n_sequences);
    for (int c = 0; st == WUSH_OK && g->source != WUSH_GUARD_NONE && c < kGuardCandidates; ++c)
        st = wush_transform_guard_candidate(t, wush_guard_candidate(c), &g->loss[c], &g->difference[c],
                                            &g->std_error[c], &g->replaces[c]);
    return st;
}

// The per-layer table on stdout: held-out tokens and their source, each candidate's held-out
// loss, the one kept, and for it the paired difference in standard errors (the margin that
// decided; for the searched layer, the best alternative's, which did not suffice).
void print_guard_table(const std::vector<GuardLine>& lines) {
    std::printf("%-40s %-10s %6s %-8s", "layer", "guard", "tokens", "kept");
    for (const char* n : kGuardCandidateNames) std::printf(" %11s", n);
    std::printf(" %9s\n", "diff/se");
    for (const GuardLine& g : lines) {
        std::printf("%-40s %-10s %6zu %-8s", cli::printable(g.layer).c_str(), source_name(g.source, false), g.n_tokens,
                    g.source == WUSH_GUARD_NONE ? "-" : kGuardCandidateNames[int(g.kept)]);
        if (g.source == WUSH_GUARD_NONE) {
            std::printf("\n");
            continue;
        }
        for (int c = 0; c < kGuardCandidates; ++c) std::printf(" %11.4e", g.loss[c]);
        int d = int(g.kept);
        if (d == 0)  // the alternative that came closest: the largest difference in standard errors
            for (int c = 1; c < kGuardCandidates; ++c)
                if (d == 0 || g.difference[c] / g.std_error[c] > g.difference[d] / g.std_error[d]) d = c;
        std::printf(" %9.2f\n", g.std_error[d] > 0.0 ? g.difference[d] / g.std_error[d] : 0.0);
    }
}

// One line naming the layers the guard could not decide on (where validation documents would
// help), or saying there are none.
void print_undecided(const std::vector<GuardLine>& lines) {
    std::string names;
    std::size_t n = 0;
    for (const GuardLine& g : lines) {
        if (!g.undecided) continue;
        names += (n++ ? ", " : " ") + cli::printable(g.layer) + " (" +
                 kGuardCandidateNames[int(g.undecided_candidate)] + ")";
    }
    if (n == 0) std::printf("undecided: none\n");
    else
        std::printf(
            "undecided: %zu layer%s (a candidate lower by more than 1%% but within the noise; add "
            "--validation-tokens):%s\n",
            n, n == 1 ? "" : "s", names.c_str());
}

bool write_guard_json(const std::string& path, const std::vector<GuardLine>& lines) {
    FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) {
        std::fprintf(stderr, "wush quantize: cannot write %s: %s\n", cli::printable(path).c_str(),
                     std::strerror(errno));
        return false;
    }
    std::fprintf(f, "{\"layers\": [");
    for (std::size_t i = 0; i < lines.size(); ++i) {
        const GuardLine& g = lines[i];
        std::fprintf(f, "%s\n  {\"layer\": %s, \"guard\": \"%s\", \"tokens\": %zu", i ? "," : "",
                     cli::json_string(g.layer).c_str(), source_name(g.source, true), g.n_tokens);
        std::fprintf(f, ", \"sequences\": %zu, \"undecided\": %s", g.n_sequences, g.undecided ? "true" : "false");
        if (g.undecided)
            std::fprintf(f, ", \"undecided_candidate\": \"%s\"", kGuardCandidateNames[int(g.undecided_candidate)]);
        if (g.source != WUSH_GUARD_NONE) {
            std::fprintf(f, ", \"kept\": \"%s\", \"candidates\": {", kGuardCandidateNames[int(g.kept)]);
            for (int c = 0; c < kGuardCandidates; ++c)
                std::fprintf(f, "%s\"%s\": {\"loss\": %s, \"difference\": %s, \"std_error\": %s, \"replaces\": %s}",
                             c ? ", " : "", kGuardCandidateNames[c], cli::json_number(g.loss[c]).c_str(),
                             cli::json_number(g.difference[c]).c_str(), cli::json_number(g.std_error[c]).c_str(),
                             g.replaces[c] ? "true" : "false");
            std::fprintf(f, "}");
        }
        std::fprintf(f, "}");
    }
    std::fprintf(f, "\n]}\n");
    const bool ok = std::fclose(f) == 0;
    if (!ok) std::fprintf(stderr, "wush quantize: writing %s failed\n", cli::printable(path).c_str());
    return ok;
}

// Opens a checkpoint for inspect, eval and export: in copy mode, which checks every layer digest
// the writer recorded (a changed byte is WUSH_ERR_CORRUPT_FILE naming its layer) and leaves the
// file unmapped (a file truncated meanwhile cannot raise SIGBUS here). A mapped open checks the
// structure only. The copy costs as much memory as the file; the command holds it anyway.
wush_status open_checked(const std::string& path, wush_checkpoint** ck) {
    return wush_checkpoint_open_mode(path.c_str(), WUSH_CHECKPOINT_COPY, ck);
}

}  // namespace

int cmd_quantize(int argc, char** argv) {
    cli::Args a(argc, argv, {"--no-search-guard"},
                {"--weights", "--activations", "--format", "--transform", "--method", "--out", "--damping",
                 "--hessian-damping", "--seed", "--transform-dtype", "--threads", "--search-tokens",
                 "--validation-tokens", "--guard-json", "--sequence-length", "--documents"});
    const std::size_t seed = a.get_size("--seed", 1, 0, cli::kMaxSeed);
    const std::size_t threads = a.get_size("--threads", 0, 1, cli::kMaxThreads);
    const std::size_t n_search =
        a.get_size("--search-tokens", cli::kSearchTokens, cli::kMinSearchTokens, cli::kMaxSearchTokens);
    const std::size_t n_val = a.get_size("--validation-tokens", 0, 1, cli::kMaxTokens);
    const cli::CalibrationMarks marks = cli::calibration_marks(a);
    const double damping = a.get_double("--damping", 0.0, 0.0, cli::kMaxDamping);
    const double hessian_damping = a.get_double("--hessian-damping", 0.0, 0.0, cli::kMaxDamping);
    const std::string method_name = a.get("--method", "rtn");  // checked below
    const std::string dtype_name = a.get_choice("--transform-dtype", "f32", {"f32", "bf16", "f16"});
    for (const char* required : {"--weights", "--activations", "--format", "--transform", "--out"})
        if (!a.has(required)) a.set_error(std::string(required) + " is required");
    if (!a.ok()) return cli::usage_error("quantize", a);
    wush_format format;
    wush_transform_kind kind;
    wush_dtype tdtype = WUSH_DTYPE_F32;
    if (wush_format_from_name(a.get("--format").c_str(), &format) != WUSH_OK)
        return cli::usage_error(
            "quantize", "unknown format '" + cli::printable(a.get("--format")) + "' (mxfp4, nvfp4, int4, mxfp4_ocp)");
    bool search = false;
    if (!cli::transform_from_name("quantize", a.get("--transform"), &kind, &search)) return cli::kUsageError;
    if (!search && (a.has("--search-tokens") || a.has("--validation-tokens") || a.has("--no-search-guard") ||
                    a.has("--guard-json")))
        return cli::usage_error("quantize",
                                "--search-tokens, --validation-tokens, --no-search-guard and --guard-json "
                                "need a searched transform (wush+s, wus+s)");
    wush_method method = WUSH_METHOD_RTN;
    if (!cli::method_from_name("quantize", "--method", method_name, &method)) return cli::kUsageError;
    dtype_from_name(dtype_name, &tdtype);
    // Writing the checkpoint over an input would destroy it (after it was read, so unnoticed).
    if (!cli::output_is_not_an_input("quantize", "--out", a.get("--out"),
                                     {{"--weights", a.get("--weights")}, {"--activations", a.get("--activations")}}))
        return cli::kUsageError;
    if (a.has("--guard-json") &&
        !cli::output_is_not_an_input(
            "quantize", "--guard-json", a.get("--guard-json"),
            {{"--weights", a.get("--weights")}, {"--activations", a.get("--activations")}, {"--out", a.get("--out")}}))
        return cli::kUsageError;
    // The output's directory is checked before the work, not after it.
    if (!cli::writable_destination("quantize", "--out", a.get("--out"))) return cli::kUsageError;
    std::vector<Layer> layers;
    if (load_layer_files(a.get("--weights"), a.get("--activations"), 0, &layers, /*all_heldout=*/true) != 0) return 1;
    for (Layer& l : layers) {
        // Every token calibrates, except the last --validation-tokens ones (the search's guard).
        std::swap(l.n_calibration, l.n_heldout);
        if (n_val > 0 && split_validation(n_val, &l) != 0) return 1;
    }

    Handle<wush_context, wush_context_destroy> ctx;
    Handle<wush_options, wush_options_destroy> opts;
    Handle<wush_checkpoint, wush_checkpoint_destroy> ck;
    wush_status st = wush_context_create(WUSH_BACKEND_CPU, 0, &ctx.p);
    if (st == WUSH_OK && threads) st = wush_context_set_parameter(ctx.p, WUSH_CONTEXT_NUM_THREADS, int64_t(threads));
    if (st == WUSH_OK) st = wush_options_create(&opts.p);
    if (st == WUSH_OK) st = wush_options_set_int(opts.p, WUSH_OPTION_SEED, int64_t(seed));
    if (st == WUSH_OK) st = wush_options_set_int(opts.p, WUSH_OPTION_TRANSFORM_DTYPE, tdtype);
    if (st == WUSH_OK && a.has("--damping")) st = wush_options_set_double(opts.p, WUSH_OPTION_DAMPING, damping);
    if (st == WUSH_OK && a.has("--hessian-damping"))
        st = wush_options_set_double(opts.p, WUSH_OPTION_HESSIAN_DAMPING, hessian_damping);
    if (st == WUSH_OK && search) st = wush_options_set_int(opts.p, WUSH_OPTION_SEARCH, 1);
    if (st == WUSH_OK && a.has("--no-search-guard")) st = wush_options_set_int(opts.p, WUSH_OPTION_SEARCH_GUARD, 0);
    if (st == WUSH_OK && search) st = wush_options_set_int(opts.p, WUSH_OPTION_SEARCH_TOKENS, int64_t(n_search));
    // The library says how many tokens the calibrators keep for the search and its guard.
    std::size_t sample_tokens = 0;
    if (st == WUSH_OK) st = wush_options_sample_size(opts.p, &sample_tokens);
    if (st == WUSH_OK) st = wush_checkpoint_create(&ck.p);
    if (st != WUSH_OK) return cli::report("setting up", st);
    std::size_t g = 0;
    wush_format_group_size(format, &g);

    // Every layer's objects stay alive until the checkpoint is written (it references them).
    std::vector<std::unique_ptr<Handle<wush_transform, wush_transform_destroy>>> transforms;
    std::vector<std::unique_ptr<Handle<wush_qweight, wush_qweight_destroy>>> qweights;
    std::vector<GuardLine> guard_lines;
    cli::ProgressBar bar(layers.size());
    for (Layer& l : layers) {
        Handle<wush_calibrator, wush_calibrator_destroy> cal;
        transforms.push_back(std::make_unique<Handle<wush_transform, wush_transform_destroy>>());
        qweights.push_back(std::make_unique<Handle<wush_qweight, wush_qweight_destroy>>());
        // GPTQ needs the whole Hessian; RTN only its diagonal blocks.
        st = wush_calibrator_create(
            l.d_in, g, method == WUSH_METHOD_GPTQ ? WUSH_MOMENTS_FULL : WUSH_MOMENTS_BLOCK_DIAGONAL, &cal.p);
        // The search scores its candidates on a sample of the real tokens, and its per-layer
        // guard on the validation tokens.
        if (st == WUSH_OK && search) st = wush_calibrator_set_sample_size(cal.p, sample_tokens);
        std::vector<std::size_t> lengths;
        std::string why;
        if (!cli::document_lengths(marks, l.n_calibration, &lengths, &why))
            return cli::usage_error("quantize", "layer '" + l.name + "': " + why);
        if (st == WUSH_OK)
            st = cli::add_calibration(ctx.p, cal.p, l.x_dtype, l.x.data(), l.n_calibration, l.d_in, marks, lengths);
        if (st == WUSH_OK && l.n_validation > 0) st = wush_calibrator_set_validation_size(cal.p, l.n_validation);
        if (st == WUSH_OK && l.n_validation > 0)
            st = wush_calibrator_add_validation(ctx.p, cal.p, l.x_dtype, l.validation(), l.n_validation);
        if (st == WUSH_OK)
            st = wush_layer_quantize(ctx.p, cal.p, kind, format, method, l.w_dtype, l.weight.data(), l.d_out, l.d_in,
                                     opts.p, &transforms.back()->p, &qweights.back()->p);
        if (st == WUSH_OK)
            st = wush_checkpoint_add_layer(ck.p, l.name.c_str(), transforms.back()->p, qweights.back()->p);
        if (st == WUSH_OK && search) {
            guard_lines.emplace_back();
            st = read_guard(l.name, transforms.back()->p, &guard_lines.back());
        }
        if (st != WUSH_OK) {
            bar.finish();
            std::fprintf(stderr, "wush quantize: layer '%s':\n", cli::printable(l.name).c_str());
            return cli::report("quantizing", st);
        }
        std::vector<unsigned char>().swap(l.x);  // the activations are no longer needed
        bar.step(l.name);
    }
    bar.finish();
    char label[] = "writing";
    wush_options_set_progress(opts.p, progress_to_stderr, label);
    st = wush_checkpoint_write(ck.p, a.get("--out").c_str(), opts.p);
    if (st != WUSH_OK) return cli::report("wush_checkpoint_write", st);
    std::fprintf(stderr, "wrote %zu layers to %s\n", layers.size(), cli::printable(a.get("--out")).c_str());
    if (search) print_guard_table(guard_lines);
    if (search) print_undecided(guard_lines);
    if (a.has("--guard-json") && !write_guard_json(a.get("--guard-json"), guard_lines)) return 1;
    return 0;
}

// `wush verify CK`: opens the checkpoint in copy mode, which recomputes every recorded layer digest.
// It succeeds only when every layer carries a digest and all match: a file whose digests were
// stripped (or written before format version 2, which has none) cannot be verified, and says so.
int cmd_verify(int argc, char** argv) {
    if (argc != 1) {
        std::fprintf(stderr, "usage: wush verify CHECKPOINT.safetensors\n");
        return 2;
    }
    const std::string path = cli::printable(argv[0]);
    Handle<wush_checkpoint, wush_checkpoint_destroy> ck;
    wush_status st = wush_checkpoint_open_mode(argv[0], WUSH_CHECKPOINT_COPY, &ck.p);
    if (st != WUSH_OK) {
        std::fprintf(stderr, "wush verify: %s: %s: %s\n", path.c_str(), wush_status_string(st),
                     cli::printable_message(wush_last_error()).c_str());
        return 1;
    }
    Handle<wush_tensor_file, wush_tensor_file_destroy> file;
    if ((st = wush_tensor_file_open(argv[0], &file.p)) != WUSH_OK) return cli::report("wush_tensor_file_open", st);
    std::size_t n = 0, with_digest = 0;
    wush_checkpoint_layer_count(ck.p, &n);
    for (std::size_t i = 0; i < n; ++i) {
        const char *name = nullptr, *digest = nullptr;
        wush_checkpoint_layer_name(ck.p, i, &name);
        with_digest += wush_tensor_file_metadata(file.p, (std::string(name) + ".sha256").c_str(), &digest) == WUSH_OK;
    }
    if (with_digest == n && n > 0) {
        std::printf("%s: %zu layers, every layer's bytes match the digest its writer recorded\n", path.c_str(), n);
        return 0;
    }
    std::fprintf(stderr,
                 "wush verify: %s: no digests for %zu of its %zu layers (stripped, or written before format "
                 "version 2): their bytes cannot be verified\n",
                 path.c_str(), n - with_digest, n);
    return 1;
}

int cmd_inspect(int argc, char** argv) {
    if (argc != 1) {
        std::fprintf(stderr, "usage: wush inspect CHECKPOINT.safetensors\n");
        return 2;
    }
    Handle<wush_checkpoint, wush_checkpoint_destroy> ck;
    wush_status st = open_checked(argv[0], &ck.p);
    if (st != WUSH_OK) {
        std::fprintf(stderr, "wush inspect: %s: %s: %s\n", cli::printable(argv[0]).c_str(), wush_status_string(st),
                     cli::printable_message(wush_last_error()).c_str());
        return 1;
    }
    std::size_t n = 0;
    wush_checkpoint_layer_count(ck.p, &n);
    std::printf("%s: %zu layers\n", cli::printable(argv[0]).c_str(), n);
    std::printf("%-40s %8s %8s %-7s %-9s %-6s %12s\n", "layer", "d_out", "d_in", "format", "transform", "method",
                "bytes");
    for (std::size_t i = 0; i < n; ++i) {
        const char* name = nullptr;
        Handle<wush_transform, wush_transform_destroy> t;
        Handle<wush_qweight, wush_qweight_destroy> q;
        wush_checkpoint_layer_name(ck.p, i, &name);
        st = wush_checkpoint_load_layer(ck.p, name, &t.p, &q.p);
        if (st != WUSH_OK) {
            std::fprintf(stderr, "wush inspect: %s: %s: %s\n", cli::printable(argv[0]).c_str(), wush_status_string(st),
                         cli::printable_message(wush_last_error()).c_str());
            return 1;
        }
        wush_format f;
        wush_method m;
        wush_transform_kind k;
        std::size_t d_out = 0, d_in = 0, g = 0, codes = 0, scales = 0;
        wush_qweight_info(q.p, &f, &m, &d_out, &d_in);
        wush_qweight_data(q.p, nullptr, &codes, nullptr, &scales);
        wush_transform_info(t.p, &k, nullptr, &g);
        // Names come from the file: control characters would act on the terminal.
        std::printf("%-40s %8zu %8zu %-7s %-9s %-6s %12zu\n", cli::printable(name).c_str(), d_out, d_in,
                    wush_format_name(f), wush_transform_kind_name(k), wush_method_name(m),
                    codes + scales + d_in * g * 4 + 4);
        std::size_t parts = 0;
        wush_checkpoint_layer_part_count(ck.p, name, &parts);
        for (std::size_t p = 0; p < parts; ++p) {
            const char* part = nullptr;
            std::size_t begin = 0, rows = 0;
            wush_checkpoint_layer_part(ck.p, name, p, &part, &begin, &rows);
            std::printf("  part %-33s %8zu rows %zu..%zu\n", cli::printable(part).c_str(), rows, begin, begin + rows);
        }
    }
    return 0;
}

int cmd_export(int argc, char** argv) {
    cli::Args a(argc, argv, {"--fp-quant"}, {"--checkpoint", "--out", "--config"});
    for (const char* required : {"--fp-quant", "--checkpoint", "--out"})
        if (!a.has(required)) a.set_error(std::string(required) + " is required");
    if (!a.ok()) {
        std::fprintf(stderr,
                     "usage: wush export --fp-quant --checkpoint CK.safetensors --out MODEL.safetensors "
                     "[--config QUANT_CONFIG.json]\n");
        return cli::usage_error("export", a);
    }
    const std::string out = a.get("--out"), config = a.get("--config");
    // The export replaces its outputs: neither may be the checkpoint or the other output.
    if (!cli::output_is_not_an_input("export", "--out", out, {{"--checkpoint", a.get("--checkpoint")}}) ||
        (a.has("--config") && !cli::output_is_not_an_input("export", "--config", config,
                                                           {{"--checkpoint", a.get("--checkpoint")}, {"--out", out}})))
        return cli::kUsageError;
    if (!cli::writable_destination("export", "--out", out) ||
        (a.has("--config") && !cli::writable_destination("export", "--config", config)))
        return cli::kUsageError;
    Handle<wush_checkpoint, wush_checkpoint_destroy> ck;
    wush_status st = open_checked(a.get("--checkpoint"), &ck.p);
    if (st != WUSH_OK) return cli::report("opening the checkpoint", st);
    st = wush_checkpoint_export_fp_quant(ck.p, out.c_str(), config.empty() ? nullptr : config.c_str(), nullptr);
    if (st != WUSH_OK) return cli::report("wush_checkpoint_export_fp_quant", st);
    std::fprintf(stderr, "wrote %s%s%s\n", cli::printable(out).c_str(), config.empty() ? "" : " and ",
                 cli::printable(config).c_str());
    return 0;
}

int cmd_ungroup(int argc, char** argv) {
    cli::Args a(argc, argv, {}, {"--checkpoint", "--out"});
    for (const char* required : {"--checkpoint", "--out"})
        if (!a.has(required)) a.set_error(std::string(required) + " is required");
    if (!a.ok()) {
        std::fprintf(stderr, "usage: wush ungroup --checkpoint CK.safetensors --out OUT.safetensors\n");
        return cli::usage_error("ungroup", a);
    }
    const std::string out = a.get("--out");
    if (!cli::output_is_not_an_input("ungroup", "--out", out, {{"--checkpoint", a.get("--checkpoint")}}) ||
        !cli::writable_destination("ungroup", "--out", out))
        return cli::kUsageError;
    Handle<wush_checkpoint, wush_checkpoint_destroy> ck, w;
    wush_status st = open_checked(a.get("--checkpoint"), &ck.p);
    if (st != WUSH_OK) return cli::report("opening the checkpoint", st);
    if ((st = wush_checkpoint_create(&w.p)) != WUSH_OK) return cli::report("wush_checkpoint_create", st);
    // Each part of a grouped layer loads as a layer of its own (the group's transform, the part's
    // rows); the new checkpoint references them until it is written.
    std::vector<std::unique_ptr<Handle<wush_transform, wush_transform_destroy>>> transforms;
    std::vector<std::unique_ptr<Handle<wush_qweight, wush_qweight_destroy>>> qweights;
    std::size_t n = 0, groups = 0;
    wush_checkpoint_layer_count(ck.p, &n);
    for (std::size_t i = 0; i < n; ++i) {
        const char* layer = nullptr;
        std::size_t parts = 0;
        wush_checkpoint_layer_name(ck.p, i, &layer);
        wush_checkpoint_layer_part_count(ck.p, layer, &parts);
        groups += parts > 0;
        for (std::size_t k = 0; k < std::max<std::size_t>(parts, 1); ++k) {
            const char* name = layer;
            if (parts > 0) wush_checkpoint_layer_part(ck.p, layer, k, &name, nullptr, nullptr);
            transforms.push_back(std::make_unique<Handle<wush_transform, wush_transform_destroy>>());
            qweights.push_back(std::make_unique<Handle<wush_qweight, wush_qweight_destroy>>());
            if ((st = wush_checkpoint_load_layer(ck.p, name, &transforms.back()->p, &qweights.back()->p)) != WUSH_OK)
                return cli::report("wush_checkpoint_load_layer", st);
            if ((st = wush_checkpoint_add_layer(w.p, name, transforms.back()->p, qweights.back()->p)) != WUSH_OK)
                return cli::report("wush_checkpoint_add_layer", st);
        }
    }
    if ((st = wush_checkpoint_write(w.p, out.c_str(), nullptr)) != WUSH_OK)
        return cli::report("wush_checkpoint_write", st);
    std::fprintf(stderr, "wrote %s: %zu layers, %zu grouped layers split into their parts\n",
                 cli::printable(out).c_str(), qweights.size(), groups);
    return 0;
}

int eval_checkpoint(const std::string& ck_path, const std::string& weights, const std::string& activations,
                    std::size_t n_held, bool json, bool runtime) {
    Handle<wush_checkpoint, wush_checkpoint_destroy> ck;
    Handle<wush_context, wush_context_destroy> ctx;
    wush_status st = open_checked(ck_path, &ck.p);
    if (st != WUSH_OK) return cli::report("opening the checkpoint", st);
    if ((st = wush_context_create(WUSH_BACKEND_CPU, 0, &ctx.p)) != WUSH_OK)
        return cli::report("wush_context_create", st);
    std::vector<Layer> layers;
    if (load_layer_files(weights, activations, n_held, &layers, /*all_heldout=*/n_held == 0) != 0) return 1;
    if (json) std::printf("{\"results\": [");
    else std::printf("%-40s %-7s %-9s %-6s %12s\n", "layer", "format", "transform", "method", "loss");
    std::size_t printed = 0;
    for (const Layer& l : layers) {
        Handle<wush_transform, wush_transform_destroy> t;
        Handle<wush_qweight, wush_qweight_destroy> q;
        st = wush_checkpoint_load_layer(ck.p, l.name.c_str(), &t.p, &q.p);
        if (st == WUSH_ERR_NOT_FOUND) continue;  // a weight the checkpoint does not quantize
        if (st != WUSH_OK) return cli::report("wush_checkpoint_load_layer", st);
        // The loss reads the weights as d_out x d_in of the stored layer: a file of another shape
        // would be read out of bounds.
        std::size_t d_out = 0, d_in = 0;
        wush_qweight_info(q.p, nullptr, nullptr, &d_out, &d_in);
        if (d_out != l.d_out || d_in != l.d_in) {
            std::fprintf(
                stderr,
                "wush eval: layer '%s': the checkpoint stores a %zu x %zu weight, the weights file %zu x %zu%s\n",
                cli::printable(l.name).c_str(), d_out, d_in, l.d_out, l.d_in,
                d_in == l.d_in ? "" : " (and the activations must have d_in columns)");
            return 1;
        }
        double loss = 0.0;
        const auto loss_fn = runtime ? wush_layer_loss_runtime : wush_layer_loss;
        st = loss_fn(ctx.p, t.p, q.p, l.w_dtype, l.weight.data(), l.x_dtype, l.heldout(), l.n_heldout, &loss);
        if (st != WUSH_OK) {
            std::fprintf(stderr, "wush eval: layer '%s':\n", cli::printable(l.name).c_str());
            return cli::report(runtime ? "wush_layer_loss_runtime" : "wush_layer_loss", st);
        }
        wush_format f;
        wush_transform_kind k;
        wush_method m;
        wush_qweight_info(q.p, &f, &m, nullptr, nullptr);
        wush_transform_info(t.p, &k, nullptr, nullptr);
        if (json)
            std::printf(
                "%s\n  {\"layer\": %s, \"format\": \"%s\", \"transform\": \"%s\", \"method\": \"%s\", \"loss\": %s}",
                printed ? "," : "", cli::json_string(l.name).c_str(), wush_format_name(f), wush_transform_kind_name(k),
                wush_method_name(m), cli::json_number(loss).c_str());
        else
            std::printf("%-40s %-7s %-9s %-6s %12.4e\n", cli::printable(l.name).c_str(), wush_format_name(f),
                        wush_transform_kind_name(k), wush_method_name(m), loss);
        ++printed;
    }
    if (json) std::printf("\n]}\n");
    if (printed == 0) {
        std::fprintf(stderr, "wush eval: no weight tensor matches a layer of the checkpoint\n");
        return 1;
    }
    return 0;
}
