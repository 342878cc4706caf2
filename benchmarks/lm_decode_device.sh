#!/usr/bin/env bash
# Decoding on an accelerator (a TPU v5e): the Pallas low-bit kernels compiled and checked against their references,
# then the lm-decode accelerator rows of models with random weights, one process per part. Run from the repository
# root with stejax importable (PYTHONPATH=$PWD/src or an install) and flax installed; OUT collects the files.
#
#     OUT=tpu-out bash benchmarks/lm_decode_device.sh             # SET=kernels
#     OUT=tpu-out SET=rest bash benchmarks/lm_decode_device.sh
#     OUT=tpu-out SET=vpu bash benchmarks/lm_decode_device.sh
#     OUT=tpu-out SET=small bash benchmarks/lm_decode_device.sh
#     OUT=tpu-out SET=targets bash benchmarks/lm_decode_device.sh
#
# SET=kernels (the default; at most 7.6 minutes on a TPU v5e, mostly compilation, 60 to 100 s for each form of the
# 1B model): the compiled kernel tests, then the 1B model at batch 1 in bfloat16 and with 2-bit ternary and int8
# resident weights, each low-bit layer one Pallas call (FORM@pallas). Every low-bit model has each block's q/k/v
# side by side as one layer and its gate/up as another (four Pallas calls a block; rows say "projections": "fused");
# add --separate-projections to a part's arguments for one call per kernel.
# SET=rest (at most 6.2 minutes): the 1B model with int4 weights at batch 1, and the 350M model at batch 1 in
# bfloat16 and every low-bit form.
# SET=vpu (about 6 minutes): the 1B model's low-bit forms by the vector-unit kernels (FORM@pallas-vpu), which
# quantise the input and rescale the output outside the kernel.
# SET=small (about 3.5 minutes): the 25M model (float32, bfloat16, 2-bit ternary by the kernels and by XLA, and
# the per-byte loop) at batch 1, and bfloat16 at batches 8 to 256.
# SET=targets (at most 7.1 minutes): the 1B rows most targets read, side by side from one commit: bfloat16 at
# batches 1, 16 and 64, then 2-bit ternary and int8 by the one-call kernels at batch 1 (int4 is in SET=rest).
#
# Each run merges its parts with docs/results/lm_decode_device.json as it stands (a row measured again replaces
# the earlier one), writes that file and docs/img/lm_decode_device.png, and copies both into OUT. A part cut short
# by its timeout leaves the others' rows.
set -u
OUT=${OUT:-tpu-out}
SET=${SET:-kernels}
mkdir -p "$OUT"
B="python3 benchmarks/lm_decode_device.py --repeats 3"
case "$SET" in
  kernels)
    echo "=== kernels compiled on the chip $(date -u +%T)"
    timeout 120 python3 -m pytest -q -o addopts="" -o filterwarnings="ignore::UserWarning" --import-mode=importlib \
      -p no:cacheprovider tests/test_lowbit_kernels.py -k compiled 2>&1 | tail -15
    parts=(
      "185|--model 1B --forms bfloat16,ternary-2bit@pallas --batches 1 --tokens 64"
      "150|--model 1B --forms int8@pallas --batches 1 --tokens 64"
    )
    ;;
  rest)
    parts=(
      "140|--model 1B --forms int4@pallas --batches 1 --tokens 64"
      "230|--model 350M --forms bfloat16,ternary-2bit@pallas,int8@pallas,int4@pallas --batches 1 --tokens 64"
    )
    ;;
  vpu)
    parts=(
      "185|--model 1B --forms ternary-2bit@pallas-vpu,int8@pallas-vpu,int4@pallas-vpu --batches 1 --tokens 64"
    )
    ;;
  small)
    parts=(
      "130|--model 25M --forms float32,bfloat16,ternary-2bit@pallas,ternary-2bit@xla --batches 1 --tokens 128 --loop-bytes 32"
      "90|--model 25M --forms bfloat16 --batches 8,64,256 --tokens 64"
    )
    ;;
  targets)
    parts=(
      "150|--model 1B --forms bfloat16 --batches 1,16,64 --tokens 64"
      "125|--model 1B --forms ternary-2bit@pallas --batches 1 --tokens 64"
      "150|--model 1B --forms int8@pallas --batches 1 --tokens 64"
    )
    ;;
  *)
    echo "SET must be kernels, rest, vpu, small or targets; got '$SET'" >&2
    exit 2
    ;;
esac
files=()
[ -f docs/results/lm_decode_device.json ] && files+=(docs/results/lm_decode_device.json)
for i in "${!parts[@]}"; do
  t=${parts[$i]%%|*}; args=${parts[$i]#*|}
  echo "=== $args (timeout ${t}s) $(date -u +%T)"
  timeout "$t" $B $args --out "$OUT/$SET-part$i.json" 2>&1 | grep -v hugepages | tail -12
  [ -f "$OUT/$SET-part$i.json" ] && files+=("$OUT/$SET-part$i.json")
done
python3 - "$OUT" "$SET" "${files[@]}" <<'PY'
import sys
from pathlib import Path
from stejax.bench._lm_decode import device_plot, merge_device_results
out, chosen, parts = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
if parts:
    command = f"OUT=tpu-out SET={chosen} bash benchmarks/lm_decode_device.sh"
    doc = merge_device_results(parts, "docs/results/lm_decode_device.json", command=command)
    device_plot(doc["rows"], Path("docs/img/lm_decode_device.png"))
    for key, figure in doc["figures"].items():
        print(key, figure["text"], figure.get("target"), figure.get("met"))
    for p in ("docs/results/lm_decode_device.json", "docs/img/lm_decode_device.png"):
        (out / Path(p).name).write_bytes(Path(p).read_bytes())
PY
