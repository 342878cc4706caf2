"""The TPU compiler's static cycle estimates of the low-bit product kernels, MXU against vector unit, no TPU needed.

Deviceless ahead-of-time compilation (``jax.experimental.topologies``, a v5e 1x1 from ``libtpu`` alone): each
kernel of the 1B model's layer shapes (``2048 x 2048``, ``2048 x 5632``, ``5632 x 2048``) is compiled for the
chip by ``method="mxu"`` and ``method="vpu"``, and the compiler's static LLO profile gives its estimated cycles.
The sum over one decoding step's layers (20 blocks of four ``2048 x 2048``, two ``2048 x 5632`` and one
``5632 x 2048`` products) is printed in microseconds at the chip's clock. Nothing runs and nothing is timed:
these are the compiler's schedule, which models issue slots and DMA but not every stall (an MXU kernel measured
on a v5e took about twice its estimate), so only a TPU run (``benchmarks/lm_decode_device.sh``) decides.

Needs ``libtpu`` of the version jax pins (jax 0.10.2: libtpu 0.0.42), outside the project's environment::

    .venv/bin/pip install --target /tmp/tpusite "libtpu==0.0.42.*"
    PYTHONPATH=/tmp/tpusite .venv/bin/python benchmarks/lm_kernels_static.py --rows 1
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
from pathlib import Path

_PROFILES = Path(tempfile.mkdtemp(prefix="stejax-llo-"))
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ["LIBTPU_INIT_ARGS"] = (
    os.environ.get("LIBTPU_INIT_ARGS", "") + f" --xla_jf_dump_static_llo_profile_to={_PROFILES}"
).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

jax.config.update("jax_platforms", "cpu")  # only the compiler is the TPU's

SHAPES = ((2048, 2048, 4), (2048, 5632, 2), (5632, 2048, 1))  # (k, n, products of that shape in a block)
BLOCKS = 20
CLOCK_HZ = 1.5e9  # TPU v5e


def _cycles(kernel: str) -> int:
    """The estimated cycles of the kernel in the profiles written since the last call (then cleared)."""
    found = 0
    for path in _PROFILES.glob("*.textproto"):
        text = path.read_text()
        if path.name.startswith(kernel):
            found = int(re.search(r"estimated_cycles: (\d+)", text).group(1))  # type: ignore[union-attr]
        path.unlink()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(prog="benchmarks/lm_kernels_static.py", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1, help="input rows (the batch of a decoding step)")
    parser.add_argument("--topology", default="v5e:1x1")
    args = parser.parse_args()

    from jax.experimental import topologies
    from jax.sharding import SingleDeviceSharding

    from stejax.lm._kernel_int4 import grouped_sum
    from stejax.lm._kernel_int8 import int8_accumulate
    from stejax.lm._kernel_ternary import ternary_accumulate

    topology = topologies.get_topology_desc(
        topology_name=args.topology, platform="tpu", chip_config_name="default", chips_per_host_bounds=(1, 1, 1)
    )
    place = SingleDeviceSharding(topology.devices[0])

    def spec(shape: tuple[int, ...], dtype: object) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=place)

    def case(form: str, method: str, k: int, n: int) -> tuple[str, object, tuple[jax.ShapeDtypeStruct, ...]]:
        q = spec((args.rows, k), jnp.int8)
        if form == "int8":
            return "_int8_accumulate", lambda q, c: int8_accumulate(q, c, method=method), (q, spec((k, n), jnp.int8))
        if form == "ternary-2bit":
            fn = lambda q, p: ternary_accumulate(q, p, method=method)  # noqa: E731
            return "_ternary_accumulate", fn, (q, spec((1, k // 4, n), jnp.int8))
        fn = lambda q, p, s: grouped_sum(q, p, s, bits=4, method=method)  # noqa: E731
        return "_grouped_sum", fn, (q, spec((k // 32, 16, n), jnp.int8), spec((k // 32, n), jnp.float32))

    print(f"static estimates on {topology.devices[0].device_kind}, {args.rows} row(s), 1B model layer shapes")
    print(f"{'form':14} {'method':6} " + " ".join(f"{f'{k}x{n}':>11}" for k, n, _ in SHAPES) + "  step µs")
    for form in ("ternary-2bit", "int8", "int4"):
        for method in ("mxu", "vpu"):
            cycles = []
            for k, n, _ in SHAPES:
                kernel, fn, specs = case(form, method, k, n)
                _cycles("")  # clear
                jax.jit(fn).lower(*specs).compile()  # type: ignore[arg-type]
                cycles.append(_cycles(kernel))
            step = BLOCKS * sum(c * count for c, (_, _, count) in zip(cycles, SHAPES, strict=True)) / CLOCK_HZ
            print(f"{form:14} {method:6} " + " ".join(f"{c:>11,}" for c in cycles) + f"  {1e6 * step:7,.0f}")


if __name__ == "__main__":
    main()
