"""Compile the Pallas decode kernels for a TPU v5e on a machine without one, and print one JSON line per case.

Run by ``tests/test_tpu_compile.py`` in a process of its own, with ``libtpu`` (the version jax pins) importable:
``jax.experimental.topologies`` describes a one-chip v5e from ``libtpu`` alone, and each kernel is lowered with
abstract arguments placed on that chip and compiled by the TPU compiler, Mosaic included. Nothing runs. A kernel
that Mosaic refuses on the chip (an unsupported type, layout or operation) fails here with Mosaic's message.

    PYTHONPATH=.venv/tpu-compiler python tests/tpu_compile.py
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # no metadata server to ask: this is not a TPU VM
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # test workers may compile at the same time

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental import topologies
from jax.sharding import SingleDeviceSharding

from stejax.lowbit.kernels._fused import FUSED_FORMS, GROUPED_FORMS, fused_grouped_linear, fused_linear
from stejax.lowbit.kernels._grouped import grouped_sum
from stejax.lowbit.kernels._int8 import int8_accumulate
from stejax.lowbit.kernels._ternary import ternary_accumulate

# Rows, contraction and columns: a 1B model's widest layer at batch 1, the most rows the vector unit takes, odd axes.
SHAPES = ((1, 2048, 5632), (8, 256, 256), (5, 96, 64))


def _bare_int8_dot(x: jax.Array, w: jax.Array) -> jax.Array:
    """A kernel whose int8 product inherits the default precision: what Mosaic refuses under "highest"."""

    def body(x_ref, w_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.int32)

    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), jnp.int32))(x, w)


def cases(place: SingleDeviceSharding):
    """(name, function, abstract arguments) for every kernel, method and shape, and the fused layers."""

    def arg(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=place)

    for rows, k, n in SHAPES:
        q = arg((rows, k), jnp.int8)
        for method in ("mxu", "vpu"):
            where = f"{method} {rows}x{k}x{n}"
            yield f"int8 {where}", (lambda q, c, m=method: int8_accumulate(q, c, method=m)), (q, arg((k, n), jnp.int8))
            yield (
                f"ternary {where}",
                (lambda q, p, m=method: ternary_accumulate(q, p, method=m)),
                (q, arg((1, k // 4, n), jnp.int8)),
            )
            for bits in (4, 2):
                yield (
                    f"int{bits} {where}",
                    (lambda q, p, s, m=method, b=bits: grouped_sum(q, p, s, bits=b, method=m)),
                    (q, arg((k // 32, 32 * bits // 8, n), jnp.int8), arg((k // 32, n), jnp.float32)),
                )
        # The whole layer in one kernel (float rows in, float rows out), for each form it takes.
        for form in FUSED_FORMS:
            codes = arg((1, k // 4, n) if form == "ternary-2bit" else (k, n), jnp.int8)
            scale = arg((n,) if form == "int8" else (), jnp.float32)
            yield (
                f"fused {form} {rows}x{k}x{n}",
                (lambda x, c, s, f=form: fused_linear(x, c, s, form=f)),
                (arg((1, rows, k), jnp.float32), codes, scale),
            )
        for form in GROUPED_FORMS:  # grouped weights: groups of 32 along the contraction axis
            packed = arg((k // 32, 32 * (4 if form == "int4" else 2) // 8, n), jnp.int8)
            yield (
                f"fused {form} {rows}x{k}x{n}",
                (lambda x, c, s, f=form: fused_grouped_linear(x, c, s, form=f)),
                (arg((1, rows, k), jnp.float32), packed, arg((k // 32, n), jnp.float32)),
            )
    # Layers side by side as one call (stejax.lm.load_lowbit's fused projections): q, k and v of the 1B model
    # (3 x 2048 columns), its gate and up (2 x 5632), and the 25M bench model's gate and up (2 x 1376: no multiple
    # of 128 divides it, one column block). Ternary columns carry their own tensor's scale: a scale per column.
    for k, n in ((2048, 3 * 2048), (2048, 2 * 5632), (512, 2 * 1376)):
        x = arg((1, 1, k), jnp.float32)
        for form in FUSED_FORMS:
            codes = arg((1, k // 4, n) if form == "ternary-2bit" else (k, n), jnp.int8)
            yield (
                f"side by side {form} 1x{k}x{n}",
                (lambda x, c, s, f=form: fused_linear(x, c, s, form=f)),
                (x, codes, arg((1, n), jnp.float32)),
            )
        for form in GROUPED_FORMS:
            packed = arg((k // 32, 32 * (4 if form == "int4" else 2) // 8, n), jnp.int8)
            yield (
                f"side by side {form} 1x{k}x{n}",
                (lambda x, c, s, f=form: fused_grouped_linear(x, c, s, form=f)),
                (x, packed, arg((k // 32, n), jnp.float32)),
            )
    yield "control: bare int8 jnp.dot", _bare_int8_dot, (arg((128, 128), jnp.int8), arg((128, 128), jnp.int8))


def main() -> int:
    topology = topologies.get_topology_desc(
        topology_name="v5e:1x1", platform="tpu", chip_config_name="default", chips_per_host_bounds=(1, 1, 1)
    )
    device = topology.devices[0]
    print(json.dumps({"device_kind": device.device_kind}), flush=True)
    # The device suite multiplies at "highest" on an accelerator; the kernels must compile under it.
    with jax.default_matmul_precision("highest"):
        for name, fn, args in cases(SingleDeviceSharding(device)):
            try:
                jax.jit(fn).lower(*args).compile()
                line = {"case": name, "compiled": True}
            except Exception as error:  # every compiler error is a finding, reported by the test
                line = {"case": name, "compiled": False, "error": f"{type(error).__name__}: {error}"[:2000]}
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
