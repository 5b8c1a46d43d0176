// The `wush` command-line program. A client of the public C API only (include/wush/wush.h).
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "cli.h"
#include "commands.h"
#include "wush/wush.h"

namespace {

struct Command {
    const char* name;
    int (*run)(int argc, char** argv);
    const char* usage;  // options, one per line after the first
};

int cmd_version(int argc, char** argv) {
    if (argc > 0) {
        std::fprintf(stderr, "wush version: unexpected argument '%s'\n", cli::printable(argv[0]).c_str());
        return 2;
    }
    std::printf("wush %s\n", wush_version_string());
    return 0;
}

const Command kCommands[] = {
    {"eval", cmd_eval,
     "layerwise loss of transforms x formats x methods (the paper's table)\n"
     "  [--layers L1,L2] built-in layers (default 4096x4096,4096x14336,14336x4096;\n"
     "                   also small_256x512, small_512x256, and a small\n"
     "                   encoder's 384x384, 384x1536, 1536x384, a small\n"
     "                   decoder's 576x576, 576x192, 576x1536, 1536x576)\n"
     "  [--weights W.safetensors --activations X.safetensors]  layers from files: each\n"
     "                   2-D weight (d_out x d_in) with the activation tensor of\n"
     "                   the same name, or of its name without '.weight' (a\n"
     "                   model's own file: the other tensors are left out and\n"
     "                   named), (n_tokens x d_in), F32/F16/BF16\n"
     "  [--format mxfp4,nvfp4,int4] [--transform i,r,h,wus,wush] [--method rtn|gptq|all]\n"
     "               (a +s suffix, e.g. wush+s: with the per-block search)\n"
     "  [--search-tokens N]  the +s columns' search scores on a sample of N\n"
     "               calibration tokens (default 1024)\n"
     "  [--calib-tokens N] [--heldout-tokens N] [--seed S] [--damping L]\n"
     "  [--hessian-damping L]  GPTQ's Hessian damping alone (default: --damping's)\n"
     "  [--validation-tokens N]  the N tokens before the held-out ones (files), or N\n"
     "               more tokens (built-in layers), are the calibrator's validation\n"
     "               tokens: the `+s` columns' per-layer guard scores on them\n"
     "               (without them it holds out half of the token sample;\n"
     "               [--no-search-guard] turns that off)\n"
     "  [--sequence-length N]  the calibration tokens are whole sequences of N\n"
     "               tokens each: the guard then holds out whole sequences\n"
     "  [--documents N[,N...]]  the calibration tokens are documents of these\n"
     "               lengths, back to back (one N: every document that long; not\n"
     "               with --sequence-length): the guard then holds out whole\n"
     "               documents and scores the WUSH layers fit without them\n"
     "  [--threads N] [--json]\n"
     "  [--runtime]  compute Y_q with the CPU runtime (fused quantization + W4A4\n"
     "               GEMM) instead of the float64 reference product\n"
     "  [--checkpoint CK --weights W --activations X]  loss of a stored checkpoint\n"
     "  numbers: token counts and lengths 1 to 2^32, --validation-tokens to 65536,\n"
     "  --search-tokens 16 to 65536, --threads 1 to 4096, --damping and\n"
     "  --hessian-damping 0 to 1e6, --seed 0 to 2^62; others are usage errors\n"},
    {"quantize", cmd_quantize,
     "calibrate on all tokens, build transforms, pre-quantize, write a checkpoint\n"
     "  --weights W.safetensors --activations X.safetensors --format F --transform T\n"
     "  --out CK.safetensors [--method rtn|gptq] [--damping L] [--seed S]\n"
     "  [--hessian-damping L]  GPTQ's Hessian damping alone (default: --damping's)\n"
     "  [--transform-dtype f32|bf16|f16] [--threads N]\n"
     "  --transform wush+s (or wus+s): the per-block search, scored on a sample of\n"
     "               [--search-tokens N] (default 1024) calibration tokens\n"
     "  [--validation-tokens N]  the last N tokens of each layer only validate: the\n"
     "               search's per-layer guard chooses among the searched, plain\n"
     "               and shrunk WUSH, I, H and R layers on them (without them it\n"
     "               holds out half of the token sample; [--no-search-guard] turns\n"
     "               that off)\n"
     "               and prints per layer what it compared and kept (held-out losses\n"
     "               of each candidate, the paired difference in standard errors);\n"
     "               [--guard-json FILE] records the same as JSON; the layers it\n"
     "               could not decide on are named in one line at the end\n"
     "  [--sequence-length N]  the calibration tokens are whole sequences of N\n"
     "               tokens each: the guard then holds out whole sequences\n"
     "  [--documents N[,N...]]  the calibration tokens are documents of these\n"
     "               lengths, back to back (one N: every document that long; not\n"
     "               with --sequence-length): the guard then holds out whole\n"
     "               documents and scores the WUSH layers fit without them\n"
     "  numbers: token counts and lengths 1 to 2^32, --search-tokens 16 to 65536,\n"
     "  --threads 1 to 4096, --damping and --hessian-damping 0 to 1e6, --seed 0\n"
     "  to 2^62; others are usage errors\n"},
    {"inspect", cmd_inspect, "validate a checkpoint, check its layer digests, and list its layers\n  CK.safetensors\n"},
    {"verify", cmd_verify,
     "check every byte of a checkpoint against the digests its writer recorded\n"
     "(fails on a checkpoint without digests)\n  CK.safetensors\n"},
    {"export", cmd_export,
     "write the FP-Quant / HF-transformers fp_quant layout (mxfp4, nvfp4), after\n"
     "checking the checkpoint's layer digests\n"
     "  --fp-quant --checkpoint CK --out MODEL.safetensors [--config CONFIG.json]\n"},
    {"ungroup", cmd_ungroup,
     "write a checkpoint's grouped layers (format version 3) as one layer per part\n"
     "(format version 2, which older libwush reads; the same outputs)\n"
     "  --checkpoint CK --out OUT.safetensors\n"},
    {"bench", cmd_bench,
     "the CPU runtime against its baselines (OpenBLAS SGEMM, shared-Hadamard\n"
     "quantization, memcpy; one token against a streaming read of the weights'\n"
     "bytes), measured in the same run\n"
     "  [--quick] [--json] [--layers L1,L2] [--format mxfp4,nvfp4,int4] [--m 1,16,...]\n"
     "  [--kind gemm,quantize,forward,decode,l2] [--threads N] [--isa auto|scalar|avx2|avx512_vnni]\n"
     "  [--repeats R] [--min-time SECONDS] [--transform-dtype f32|bf16]: bf16 rounds the WUSH\n"
     "  transforms' matrices to bf16, as quantize-model stores them\n"
     "  [--device cpu|cuda]  cuda: the CUDA backend against cuBLAS BF16 (a build\n"
     "               with nvcc and a GPU; --m, --kind quantize,forward, --layers, --format,\n"
     "               --timing both|eager|graph: graph replays each batch from a CUDA graph,\n"
     "               both (default) measures each way; --l2 cold|warm: cold (default) rotates\n"
     "               through copies of the weights that overflow L2, warm reuses one;\n"
     "               --cuda-option NAME=V,...: the CUDA context's experimental kernel switches,\n"
     "               prefill_min_m, blockscaled, stream_decode, bf16_prefill, tc_quantize:\n"
     "               WUSH_CONTEXT_CUDA_<NAME> in wush.h, e.g. stream_decode=1;\n"
     "               --variants V1,V2,...: each shape measured for every variant in turn,\n"
     "               each layer prepared under its variant's switches: default, all, or\n"
     "               NAME=V[+NAME=V...]; --repeats R: rounds over shapes and variants;\n"
     "               rows name their variant and round, with each timing's min and max)\n"
     "  [--contend [--contend-cpu C] [--contend-process] | --paired]: N threads vs 1,\n"
     "  paired samples, next to a busy loop or on the machine as it is\n"
     "  numbers: --m 1 to 2^32, --threads 1 to 4096, --repeats 1 to 10000,\n"
     "  --min-time 0 to 60; others are usage errors\n"},
    {"formats", cmd_formats,
     "round-trip error of each block format on built-in tensors\n  [--rows N] [--cols N] [--seed S]\n"
     "  numbers: --rows and --cols 1 to 2^24, --seed 0 to 2^32 - 1\n"},
    {"version", cmd_version, "print the library version\n"},
};

// Continuation lines of a usage text, indented by `indent`.
void print_indented(FILE* out, const char* text, int indent) {
    for (const char* line = text; *line;) {
        const char* end = std::strchr(line, '\n');
        const int len = end ? int(end - line) : int(std::strlen(line));
        std::fprintf(out, "%.*s\n", len, line);
        line += len + (end ? 1 : 0);
        if (*line) std::fprintf(out, "%*s", indent, "");
    }
}

int usage(FILE* out) {
    std::fprintf(out,
                 "usage: wush <command> [options]   (wush <command> --help: that command's options)\n\ncommands:\n");
    for (const Command& c : kCommands) {
        std::fprintf(out, "  %-9s ", c.name);
        print_indented(out, c.usage, 12);
    }
    std::fprintf(out, "  %-9s print this text\n", "help");
    return out == stdout ? 0 : 2;
}

int command_usage(const Command& c) {
    std::printf("usage: wush %s [options]\n\n", c.name);
    print_indented(stdout, c.usage, 0);
    return 0;
}

int dispatch(int argc, char** argv) {
    if (argc < 2) return usage(stderr);
    const std::string cmd = argv[1];
    if (cmd == "--version") return cmd_version(argc - 2, argv + 2);
    if (cmd == "help" || cmd == "--help" || cmd == "-h") return usage(stdout);
    for (const Command& c : kCommands) {
        if (cmd != c.name) continue;
        for (int i = 2; i < argc; ++i)
            if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) return command_usage(c);
        return c.run(argc - 2, argv + 2);
    }
    std::fprintf(stderr, "wush: unknown command '%s'\n", cli::printable(cmd).c_str());
    return usage(stderr);
}

}  // namespace

int main(int argc, char** argv) {
    // The library never throws; the program's own containers can (a run too large for memory).
    try {
        return dispatch(argc, argv);
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "wush: out of memory\n");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "wush: %s\n", e.what());
    }
    return 1;
}
