#!/usr/bin/env bash
# Checks that a built libwush runs on any x86-64 CPU: AVX2 instructions (ymm registers) may appear
# only in the AVX2 and AVX-512 kernel functions (namespaces wush::cpu::avx2 / ::avx512 of
# src/cpu/kernels/, the search's wush::avx2 round trip, the layer loss's wush::eval::avx2/avx512 products,
# quantize_rows' wush::formats::avx2 kernel,
# and the per-file static helpers of
# src/cpu/kernels/transpose_avx*.h), and AVX-512 ones (zmm or mask
# registers, ymm16-31) only in the AVX-512 kernels. A violation means code compiled with a kernel
# file's target flags leaked into code that runs before the ISA check (kernels.h explains how).
#
#   tests/runtime/check_isa_isolation.sh LIBRARY
set -euo pipefail
lib=${1:?usage: $0 LIBRARY}
command -v objdump >/dev/null || { echo "check_isa_isolation: FAIL: objdump not found"; exit 1; }
objdump -d --no-show-raw-insn -C "$lib" | awk '
    /^[0-9a-f]+ <.*>:$/ { fn = substr($0, index($0, "<") + 1); sub(/>:$/, "", fn); next }
    /%zmm|%k[0-7]|%ymm(1[6-9]|2[0-9]|3[01])|%xmm(1[6-9]|2[0-9]|3[01])/ {
        if (fn !~ /wush::(cpu::|eval::)?(avx512|simd512)::/ && fn !~ /wush::(cpu::)?simd256::/ && !(fn in bad512)) { bad512[fn] = 1; print "AVX-512 outside the AVX-512 kernels: " fn }
        next
    }
    /%ymm/ {
        if (fn !~ /wush::(cpu::|eval::|formats::)?(avx2|avx512|simd256|simd512)::/ && !(fn in bad2)) { bad2[fn] = 1; print "AVX2 outside the kernels: " fn }
    }
    END { }' > /tmp/check_isa_isolation.$$ || true
if [[ -s /tmp/check_isa_isolation.$$ ]]; then
    cat /tmp/check_isa_isolation.$$
    rm -f /tmp/check_isa_isolation.$$
    echo "check_isa_isolation: FAIL"
    exit 1
fi
rm -f /tmp/check_isa_isolation.$$
echo "check_isa_isolation: PASS: SIMD instructions only in the per-ISA kernels of $lib"
