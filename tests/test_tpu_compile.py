"""The Pallas decode kernels compile for a TPU v5e, Mosaic included, on a machine without a TPU.

``make setup`` installs ``libtpu`` (the version jax pins) into ``.venv/tpu-compiler``, outside the environment's
import path: imported there, jax would look for a TPU at start-up. ``tests/tpu_compile.py`` runs in a process of
its own with that folder on its path and compiles every kernel for a one-chip v5e topology (deviceless
ahead-of-time compilation). Interpret mode checks what the kernels compute; this checks that the chip's compiler
takes them, which interpret mode cannot.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPILER = Path(os.environ.get("STEJAX_TPU_COMPILER", ROOT / ".venv" / "tpu-compiler"))


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict]:
    assert (COMPILER / "libtpu").is_dir(), (
        f"no libtpu in {COMPILER}: `make setup` installs it there (or set STEJAX_TPU_COMPILER to a folder that has it)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(COMPILER), str(ROOT / "src")]), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "tpu_compile.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert lines[0] == {"device_kind": "TPU v5 lite"}, lines[0]
    return {line["case"]: line for line in lines[1:]}


def test_every_kernel_compiles_for_a_tpu_v5e_under_the_highest_default_precision(compiled):
    kernels = {name: line for name, line in compiled.items() if not name.startswith(("control", "side by side"))}
    # int8, ternary, int4 and int2; the MXU and the vector-unit methods; three shapes. And the fused layers: int8,
    # ternary-int8, ternary-2bit, grouped int4 and int2 weights; three shapes.
    assert len(kernels) == 4 * 2 * 3 + 5 * 3
    assert sum(name.startswith("fused ") for name in kernels) == 5 * 3
    assert sum(name.startswith(("fused int4 ", "fused int2 ")) for name in kernels) == 2 * 3
    failed = {name: line["error"] for name, line in kernels.items() if not line["compiled"]}
    assert not failed, json.dumps(failed, indent=1)


def test_the_compile_check_catches_what_mosaic_refuses_on_the_chip(compiled):
    # A bare int8 jnp.dot under "highest" asks for a float32 contraction of int8 operands: the chip's compiler
    # refuses it, and so must this check (else a passing kernel above would prove nothing).
    control = compiled["control: bare int8 jnp.dot"]
    assert control["compiled"] is False and "Bad lhs type" in control["error"], control


def test_the_fused_projections_widths_compile_for_a_tpu_v5e(compiled):
    # Every one-call layer form at the widths of layers side by side: the 1B model's q/k/v and gate/up, and an
    # output width that no multiple of 128 divides.
    cases = {name: line for name, line in compiled.items() if name.startswith("side by side")}
    assert len(cases) == 5 * 3
    failed = {name: line["error"] for name, line in cases.items() if not line["compiled"]}
    assert not failed, json.dumps(failed, indent=1)
