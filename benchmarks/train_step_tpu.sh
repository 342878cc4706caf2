#!/usr/bin/env bash
# The train-step suite on a TPU: LM widths 512, 1024 and 2048, one process per width (each frees the chip for the
# next), every variant timed side by side within a width. Run from the repository root with stejax importable
# (PYTHONPATH=$PWD/src or an install) and flax, optax, qwix and click installed; set OUT to a folder to collect
# docs/results/train_step.json and each width's bench.json there.
#
#     OUT=tpu-out bash benchmarks/train_step_tpu.sh
#
# The results file merges the widths measured on the same device; a width cut short by its timeout leaves the
# others' rows. Budget: up to 9 minutes on a TPU v5e, mostly compilation (a width took about 160 s there, seven
# variants compiled and timed).
set -u
OUT=${OUT:-tpu-out}
mkdir -p "$OUT"
rm -f docs/results/train_step.json
for spec in 512:150 1024:180 2048:200; do
  w=${spec%%:*}; t=${spec##*:}
  echo "=== width $w (timeout ${t}s) $(date -u +%T)"
  timeout "$t" python3 -m stejax bench --suite train-step --width "$w" --repeats 8 --warmup 1 --out "/tmp/bench-$w" --results docs/results 2>&1 | tail -22
  echo "exit ${PIPESTATUS[0]}"
  [ -f docs/results/train_step.json ] && cp docs/results/train_step.json "$OUT/train_step.json"
  [ -f "/tmp/bench-$w/bench.json" ] && cp "/tmp/bench-$w/bench.json" "$OUT/bench-$w.json"
done
python3 - "$OUT" <<'PY'
import json, os, sys
path = os.path.join(sys.argv[1], "train_step.json")
if os.path.exists(path):
    doc = json.load(open(path))
    print(doc["machine"]["device"])
    for r in doc["rows"]:
        print(r["width"], f'{r["variant"]:22s}', r["step_ms"], r["vs_float32"], r["vs_bfloat16"], r.get("vs_qwix_qt"),
              r["compile_s"], r["int8_dots"])
    for key, figure in doc["figures"].items():
        print(key, figure["text"], figure.get("target"), figure.get("met"))
PY
