#!/usr/bin/env bash
# Builds here, on a machine without a GPU, the folder that scripts/device-check.sh --prebuilt DIR
# runs on a lent GPU machine without configuring or building (issue #58, item 6):
#   DIR/bin/   wush, wush-bench-cuda and the GPU test programs the check runs
#   DIR/lib/   libwush.so, the CUDA module libwush-cuda.so (+ its .sha256 digest), and the runtime
#              libraries the bare GPU machine lacks (OpenBLAS, LAPACKE, gfortran, ...: found with ldd)
#   DIR/MANIFEST  sha256sum lines of every file above, checked first by --prebuilt
# A Release build for sm_90 and sm_90a (WUSH_DEVICE_ARCHS overrides), cuBLAS linked shared (the
# GPU machine's CUDA toolkit has it; a static cuBLAS would put hundreds of MiB into every binary),
# RPATHs relative to the binaries ($ORIGIN) with /usr/local/cuda/lib64 after them, stripped; and
# DIR.tar.gz of it, which is what travels (carry it; --prebuilt takes the folder or the archive).
# The build folder (default build/prebuild, or BUILD) is reused when rerun: only what changed is
# rebuilt. Fails when DIR.tar.gz is 60 MiB or more (the working tree that travels to the GPU machine
# is 64 MiB at most, carried paths included). Needs patchelf.
# Usage: bash scripts/device-prebuild.sh DIR [BUILD]
set -euo pipefail
[ $# -ge 1 ] || {
  echo "usage: $0 DIR [BUILD]" >&2
  exit 2
}
top=$(cd "$(dirname "$0")/.." && pwd)
dir=$1
build=${2:-$top/build/prebuild}
command -v patchelf >/dev/null || {
  echo "device-prebuild: patchelf is needed (apt-get install patchelf)" >&2
  exit 1
}
# The binaries the check runs (scripts/device-check.sh reads the same list from MANIFEST).
bins=(wush wush-bench-cuda wush_backend_ops_test wush_gpu_context_test wush_gpu_gemm_tests wush_gpu_kernel_tests
  wush_gpu_stream_decode_tests wush_gpu_quantize_tc_tests)
targets=(wush_cli wush_bench_cuda wush_cuda_module wush_backend_ops_test wush_gpu_context_test wush_gpu_gemm_tests
  wush_gpu_kernel_tests wush_gpu_stream_decode_tests wush_gpu_quantize_tc_tests)
t0=$(date +%s)
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$top" -B "$build" -DCMAKE_BUILD_TYPE=Release -DWUSH_CUDA=ON -DWUSH_BUILD_TESTS=ON -DWUSH_BUILD_BENCH=OFF \
    -DCMAKE_CUDA_ARCHITECTURES="${WUSH_DEVICE_ARCHS:-90;90a}" -DWUSH_CUDA_SHARED_CUBLAS=ON >"$build.configure.log" 2>&1 ||
    {
      cat "$build.configure.log"
      exit 1
    }
fi
cmake --build "$build" -j"${JOBS:-$(nproc)}" --target "${targets[@]}"
echo "device-prebuild: built in $(($(date +%s) - t0)) s"

rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/lib"
for b in "${bins[@]}"; do
  f=$(find "$build/tools" "$build/tests" -maxdepth 1 -type f -name "$b" | head -1)
  [ -n "$f" ] || {
    echo "device-prebuild: $b was not built" >&2
    exit 1
  }
  cp "$f" "$dir/bin/"
done
# libwush: the real file, and a link of its SONAME (what the binaries ask for) to it.
so=$(basename "$(readlink -f "$build/capi/libwush.so")")
cp "$build/capi/$so" "$dir/lib/$so"
soname=$(patchelf --print-soname "$dir/lib/$so")
[ "$soname" = "$so" ] || ln -sf "$so" "$dir/lib/$soname"
cp "$build/capi/libwush-cuda.so" "$dir/lib/"

# The libraries the binaries load that a bare GPU machine lacks. Its image has the CUDA toolkit (its
# libcudart, libcublas*) and a newer glibc and libstdc++ than this Debian 12: those stay behind.
keep='^(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux-x86-64|linux-vdso|libcuda|libcudart|libcublas|libcublasLt)\.so'
for f in "$dir"/bin/* "$dir"/lib/*.so*; do
  LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $keep ]] && continue
  [[ $path == "$dir"/* ]] && continue
  [ -f "$dir/lib/$name" ] || cp -L "$path" "$dir/lib/$name"
done
# Again for what the copied libraries need themselves (libopenblas -> libgfortran -> libquadmath).
for _ in 1 2; do
  for f in "$dir"/lib/*.so*; do ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'; done |
    sort -u | while read -r name path; do
    [[ $name =~ $keep ]] && continue
    [[ $path == "$dir"/* ]] && continue
    [ -f "$dir/lib/$name" ] || cp -L "$path" "$dir/lib/$name"
  done
done

for f in "$dir"/bin/*; do
  strip --strip-unneeded "$f"
  # shellcheck disable=SC2016  # $ORIGIN is the loader's, not the shell's
  patchelf --set-rpath '$ORIGIN/../lib:/usr/local/cuda/lib64' "$f"
done
for f in "$dir"/lib/*.so*; do
  [ -L "$f" ] && continue
  chmod u+w "$f"
  strip --strip-unneeded "$f"
  # shellcheck disable=SC2016
  patchelf --set-rpath '$ORIGIN:/usr/local/cuda/lib64' "$f"
done
# The module's digest, of its final bytes (the core refuses a module whose digest differs).
(cd "$dir/lib" && sha256sum libwush-cuda.so >libwush-cuda.so.sha256)
git -C "$top" describe --always --dirty --abbrev=40 >"$dir/COMMIT" 2>/dev/null || echo unknown >"$dir/COMMIT"
(cd "$dir" && find bin lib COMMIT -type f | LC_ALL=C sort | xargs sha256sum >MANIFEST)
echo "device-prebuild: $(wc -l <"$dir/MANIFEST") files in $dir"
du -sh "$dir"
# What travels: the folder itself is larger than the 64 MiB a working tree may carry (OpenBLAS
# alone is 37 MB), so it goes as DIR.tar.gz, which --prebuilt unpacks in a second or two.
tar -C "$dir" -czf "$dir.tar.gz" .
bytes=$(wc -c <"$dir.tar.gz")
echo "device-prebuild: $dir.tar.gz is $((bytes / 1048576)) MiB ($bytes bytes; limit 60 MiB)"
[ "$bytes" -lt $((60 * 1048576)) ] || {
  echo "device-prebuild: over 60 MiB compressed" >&2
  exit 1
}
