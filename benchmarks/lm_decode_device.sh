#!/usr/bin/env bash
# Decoding on an accelerator (a TPU v5e): the Pallas low-bit kernels compiled and checked against their references,
# then the lm-decode accelerator rows of the 25M, 350M and 1B models with random weights (bfloat16 and float32,
# int8, int4 and 2-bit ternary resident weights; batches 1 to 256), one process per part. Run from the repository
# root with stejax importable (PYTHONPATH=$PWD/src or an install) and flax installed; OUT collects the files.
#
#     OUT=tpu-out bash benchmarks/lm_decode_device.sh
#
# Writes docs/results/lm_decode_device.json (every part measured, figures judged over all) and
# docs/img/lm_decode_device.png. A part cut short by its timeout leaves the others' rows. Budget: about 8 minutes on
# a TPU v5e, mostly compilation (tens of seconds for each form of the 1B model).
set -u
OUT=${OUT:-tpu-out}
mkdir -p "$OUT"
echo "=== kernels compiled on the chip $(date -u +%T)"
timeout 60 python3 -m pytest -q -o addopts="" -o filterwarnings="ignore::UserWarning" --import-mode=importlib \
  -p no:cacheprovider tests/test_lm_kernels.py -k compiled 2>&1 | tail -15
B="python3 benchmarks/lm_decode_device.py --repeats 3"
parts=(
  "150|--model 1B --forms bfloat16,ternary-2bit@pallas,int8@pallas,int4@pallas --batches 1 --tokens 64"
  "80|--model 1B --forms bfloat16 --batches 16,64 --tokens 64"
  "90|--model 25M --forms float32,bfloat16,ternary-2bit@pallas,ternary-2bit@xla --batches 1 --tokens 128 --loop-bytes 32"
  "40|--model 25M --forms bfloat16 --batches 8,64,256 --tokens 64"
  "60|--model 350M --forms bfloat16,ternary-2bit@pallas --batches 1 --tokens 64"
)
files=()
for i in "${!parts[@]}"; do
  t=${parts[$i]%%|*}; args=${parts[$i]#*|}
  echo "=== $args (timeout ${t}s) $(date -u +%T)"
  timeout "$t" $B $args --out "$OUT/part$i.json" 2>&1 | grep -v hugepages | tail -12
  [ -f "$OUT/part$i.json" ] && files+=("$OUT/part$i.json")
done
python3 - "$OUT" "${files[@]}" <<'PY'
import sys
from pathlib import Path
from stejax.bench._lm_decode import device_plot, merge_device_results
out, parts = Path(sys.argv[1]), sys.argv[2:]
if parts:
    doc = merge_device_results(parts, "docs/results/lm_decode_device.json", command="OUT=tpu-out bash benchmarks/lm_decode_device.sh")
    device_plot(doc["rows"], Path("docs/img/lm_decode_device.png"))
    for key, figure in doc["figures"].items():
        print(key, figure["text"], figure.get("target"), figure.get("met"))
    for p in ("docs/results/lm_decode_device.json", "docs/img/lm_decode_device.png"):
        (out / Path(p).name).write_bytes(Path(p).read_bytes())
PY
