#!/usr/bin/env bash
# The KL / perplexity table of a causal LM (docs/EVAL.md, "A real decoder"): quantizes MODEL once
# per row and format with `python -m wush quantize-model`, then scores every folder of a format
# against MODEL with `python -m wush eval-model --table` on held-out TEXT.
#
#   scripts/eval-table.sh MODEL CALIB TEXT OUT [FORMATS] [ROWS]
#
# MODEL: a Hugging Face folder or a GGUF file. CALIB: calibration text (never TEXT).
# OUT: a folder for the quantized models (OUT/<format>-<row>), their logs, and OUT/table.md.
# FORMATS: comma-separated (default mxfp4,nvfp4,int4).
# ROWS: comma-separated from rtn-i, rtn-h, rtn-wush, wush+s, gptq-h, gptq-wush (default all).
# A folder already complete (its wush_quantization.json written) is reused, so a run that was cut
# off continues where it stopped. PYTHON picks the interpreter (default python3); the library is
# found as `python -m wush` finds it (WUSH_LIBRARY, the wheel, pkg-config).
set -euo pipefail
if [ $# -lt 4 ]; then
  sed -n '2,14p' "$0" >&2
  exit 2
fi
model=$1 calib=$2 text=$3 out=$4
formats=${5:-mxfp4,nvfp4,int4}
rows=${6:-rtn-i,rtn-h,rtn-wush,wush+s,gptq-h,gptq-wush}
py=${PYTHON:-python3}
mkdir -p "$out"

row_args() {
  case $1 in
    rtn-i) echo "--transform identity --method rtn" ;;
    rtn-h) echo "--transform hadamard --method rtn" ;;
    rtn-wush) echo "--transform wush --method rtn" ;;
    wush+s) echo "--transform wush+s --method rtn" ;;
    gptq-h) echo "--transform hadamard --method gptq" ;;
    gptq-wush) echo "--transform wush --method gptq" ;;
    *)
      echo "eval-table.sh: unknown row '$1' (rows: rtn-i, rtn-h, rtn-wush, wush+s, gptq-h, gptq-wush)" >&2
      return 2
      ;;
  esac
}

for fmt in ${formats//,/ }; do
  folders=()
  for row in ${rows//,/ }; do
    args=$(row_args "$row")
    dir=$out/$fmt-$row
    folders+=(--quantized "$dir")
    [ -f "$dir/wush_quantization.json" ] && continue
    echo "eval-table.sh: quantizing $fmt $row -> $dir" >&2
    # shellcheck disable=SC2086  # $args: several words on purpose
    /usr/bin/time -f '%e s wall, %M KiB peak' "$py" -m wush quantize-model "$model" --calib "$calib" \
      --format "$fmt" $args --out "$dir" >"$out/$fmt-$row.log" 2>&1 || {
      tail -5 "$out/$fmt-$row.log" >&2
      exit 1
    }
  done
  echo "eval-table.sh: evaluating $fmt" >&2
  "$py" -m wush eval-model "$model" --text "$text" "${folders[@]}" --table \
    >"$out/eval-$fmt.json" 2>"$out/eval-$fmt.log" || {
    tail -5 "$out/eval-$fmt.log" >&2
    exit 1
  }
  { echo "$fmt:"; echo; grep '^|' "$out/eval-$fmt.log"; echo; } >"$out/eval-$fmt.md"
done
cat "$out"/eval-*.md >"$out/table.md"
cat "$out/table.md"
