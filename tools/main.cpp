// The `wush` command-line program. A client of the public C API only (include/wush/wush.h).
#include <cstdio>
#include <string>

#include "commands.h"
#include "wush/wush.h"

namespace {

int usage(FILE* out) {
    std::fprintf(out,
                 "usage: wush <command> [options]\n"
                 "\n"
                 "commands:\n"
                 "  eval      layerwise loss of transforms x formats x methods (the paper's table)\n"
                 "            [--layers L1,L2] built-in layers (default 4096x4096,4096x14336,14336x4096;\n"
                 "                             also small_256x512, small_512x256)\n"
                 "            [--weights W.safetensors --activations X.safetensors]  layers from files: each\n"
                 "                             2-D weight (d_out x d_in) with the activation tensor of\n"
                 "                             the same name (n_tokens x d_in), F32/F16/BF16\n"
                 "            [--format mxfp4,nvfp4,int4] [--transform i,r,h,wus,wush] [--method rtn|gptq|all]\n"
                 "            [--calib-tokens N] [--heldout-tokens N] [--seed S] [--damping L]\n"
                 "            [--threads N] [--json]\n"
                 "            [--runtime]  compute Y_q with the CPU runtime (fused quantization + W4A4\n"
                 "                         GEMM) instead of the float64 reference product\n"
                 "            [--checkpoint CK --weights W --activations X]  loss of a stored checkpoint\n"
                 "  quantize  --weights W.safetensors --activations X.safetensors --format F --transform T\n"
                 "            --out CK.safetensors [--method rtn|gptq] [--damping L] [--seed S]\n"
                 "            [--transform-dtype f32|bf16|f16] [--threads N]\n"
                 "            calibrate on all tokens, build transforms, pre-quantize, write a checkpoint\n"
                 "  inspect   CK.safetensors   validate a checkpoint and list its layers\n"
                 "  export    --fp-quant --checkpoint CK --out MODEL.safetensors [--config CONFIG.json]\n"
                 "            write the FP-Quant / HF-transformers fp_quant layout (mxfp4, nvfp4)\n"
                 "  bench     the CPU runtime against its baselines (OpenBLAS SGEMM, shared-Hadamard\n"
                 "            quantization, memcpy), measured in the same run\n"
                 "            [--quick] [--json] [--layers L1,L2] [--format mxfp4,nvfp4,int4] [--m 1,16,...]\n"
                 "            [--kind gemm,quantize,forward] [--threads N] [--isa auto|scalar|avx2|avx512_vnni]\n"
                 "            [--repeats R] [--min-time SECONDS]\n"
                 "  formats   round-trip error of each block format on built-in tensors\n"
                 "            [--rows N] [--cols N] [--seed S]\n"
                 "  version   print the library version\n"
                 "  help      print this text\n");
    return out == stdout ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) return usage(stderr);
    const std::string cmd = argv[1];
    if (cmd == "eval") return cmd_eval(argc - 2, argv + 2);
    if (cmd == "formats") return cmd_formats(argc - 2, argv + 2);
    if (cmd == "quantize") return cmd_quantize(argc - 2, argv + 2);
    if (cmd == "inspect") return cmd_inspect(argc - 2, argv + 2);
    if (cmd == "export") return cmd_export(argc - 2, argv + 2);
    if (cmd == "bench") return cmd_bench(argc - 2, argv + 2);
    if (cmd == "version" || cmd == "--version") {
        std::printf("wush %s\n", wush_version_string());
        return 0;
    }
    if (cmd == "help" || cmd == "--help" || cmd == "-h") return usage(stdout);
    std::fprintf(stderr, "wush: unknown command '%s'\n", cmd.c_str());
    return usage(stderr);
}
