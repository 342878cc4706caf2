"""The TPU compiler's static cycle estimates of the low-bit layers, MXU kernels against vector unit, no TPU needed.

Deviceless ahead-of-time compilation (``jax.experimental.topologies``, a v5e 1x1 from ``libtpu`` alone): one
:class:`stejax.lm.LowBitLinear` call of each of the 1B model's layer shapes (``2048 x 2048``, ``2048 x 5632``,
``5632 x 2048``; one input row, as in decoding at batch 1) is compiled for the chip with its kernels by
``method="mxu"`` and by ``method="vpu"`` (:func:`stejax.lm._lowbit.with_kernel_method`), and the compiler's
static LLO profiles give the estimated cycles of the kernel and of the whole layer (the input quantisation and
the rescaling around it included). The sum over one decoding step's layers (20 blocks of four
``2048 x 2048``, two ``2048 x 5632`` and one ``5632 x 2048`` products) is printed in microseconds at the chip's
clock. Nothing runs and nothing is timed: these are the compiler's schedule, which models issue slots and DMA
but not every stall (a v5e's measured 1B decoding steps, ``docs/results/lm_decode_device.json``, came near the
estimate plus attention for ternary bytes unpacked one by one, and about 40% over it for int8, whose bytes the
estimate reads faster than 819 GB/s allow), so only a TPU run (``benchmarks/lm_decode_device.sh``) decides.

Needs ``libtpu`` of the version jax pins (jax 0.10.2: libtpu 0.0.42), outside the environment's import path
(``make setup`` installs it in ``.venv/tpu-compiler``)::

    PYTHONPATH=.venv/tpu-compiler .venv/bin/python benchmarks/lm_kernels_static.py
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


def _profiles() -> dict[str, int]:
    """Estimated cycles of each HLO operation profiled since the last call (whose files are then removed)."""
    found = {}
    for path in _PROFILES.glob("*.textproto"):
        match = re.search(r"estimated_cycles: (\d+)", path.read_text())
        found[path.name.removesuffix("_static_llo_profile.textproto")] = int(match.group(1)) if match else 0
        path.unlink()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(prog="benchmarks/lm_kernels_static.py", description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="v5e:1x1")
    args = parser.parse_args()

    import numpy as np
    from flax import nnx
    from jax.experimental import topologies
    from jax.sharding import SingleDeviceSharding

    from stejax.lm import LowBitLinear
    from stejax.lm._lowbit import with_kernel_method

    topology = topologies.get_topology_desc(
        topology_name=args.topology, platform="tpu", chip_config_name="default", chips_per_host_bounds=(1, 1, 1)
    )
    place = SingleDeviceSharding(topology.devices[0])

    def layer(form: str, k: int, n: int) -> LowBitLinear:
        if form == "int8":
            codes, scale = np.zeros((k, n), np.int8), np.ones((n,), np.float32)
        elif form == "ternary-2bit":
            codes, scale = np.zeros((1, k // 4, n), np.int8), np.float32(50.0)
        else:
            codes, scale = np.zeros((k // 32, 16, n), np.int8), np.ones((k // 32, n), np.float32)
        return LowBitLinear(form, codes, scale, in_features=k, out_features=n, input_bits=8, implementation="pallas")

    def estimate(model: LowBitLinear, k: int) -> tuple[int, int]:
        graphdef, state = nnx.split(model)
        step = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x))
        specs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=place), state)
        _profiles()
        step.lower(specs, jax.ShapeDtypeStruct((1, 1, k), jnp.float32, sharding=place)).compile()
        found = _profiles()
        kernel = sum(c for name, c in found.items() if name.startswith(("_int8", "_ternary", "_grouped")))
        return kernel, sum(found.values())

    print(f"static estimates on {topology.devices[0].device_kind}: one row, the 1B model's layer shapes")
    head = " ".join(f"{f'{k}x{n}':>17}" for k, n, _ in SHAPES)
    print(f"{'form':13} {'method':6} {head}   step µs (kernels / layers)")
    for form in ("ternary-2bit", "int8", "int4"):
        for method in ("mxu", "vpu"):
            found = [estimate(with_kernel_method(layer(form, k, n), method), k) for k, n, _ in SHAPES]
            steps = [
                BLOCKS * sum(f[i] * count for f, (_, _, count) in zip(found, SHAPES, strict=True)) / CLOCK_HZ
                for i in (0, 1)
            ]
            cells = " ".join(f"{f'{a:,} / {b:,}':>17}" for a, b in found)
            print(f"{form:13} {method:6} {cells}   {1e6 * steps[0]:,.0f} / {1e6 * steps[1]:,.0f}")


if __name__ == "__main__":
    main()
