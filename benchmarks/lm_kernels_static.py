"""The TPU compiler's static cycle estimates of the low-bit layers of a decoding step, no TPU needed.

Deviceless ahead-of-time compilation (``jax.experimental.topologies``, a v5e 1x1 from ``libtpu`` alone): one
:class:`stejax.lm.LowBitLinear` call of each of the 1B model's layer shapes (``2048 x 2048``, ``2048 x 5632``,
``5632 x 2048``; one input row, as in decoding at batch 1) is compiled for the chip, and the compiler's static LLO
profiles give the estimated cycles of the product kernel and of the whole layer (every operation of the compiled
call: the input's quantisation, padding and arrangement, the kernel, the rescale). The sum over one decoding
step's layers (20 blocks of four ``2048 x 2048``, two ``2048 x 5632`` and one ``5632 x 2048`` products) is printed
in microseconds at the chip's clock. The variants of a form:

- ``separate``: the product kernel (``method="mxu"``) with the input's int8 quantisation and the rescale as XLA
  operations around it;
- ``fused``: the layer's kernel path, one Pallas call that quantises the float input, multiplies and rescales
  (:mod:`stejax.lowbit.kernels._fused`; for int4 weights it also arranges the input codes by group in VMEM);
- ``fused, q/k/v and gate/up concatenated``: the fused kernel over the products that share an input taken as one
  (``2048 x 6144`` and ``2048 x 11264``), four calls a block instead of seven (an estimate of that layout; the
  model keeps its seven products);
- ``vpu``: the vector-unit kernels (:func:`stejax.lowbit.nnx.with_kernel_method`), with the XLA operations around
  them.

Nothing runs and nothing is timed: these are the compiler's schedule, which models issue slots and DMA but not
every stall (a v5e's measured 1B decoding steps, ``docs/results/lm_decode_device.json``, came near the estimate
plus attention for ternary bytes, and about 40% over it for int8, whose bytes the estimate reads faster than
819 GB/s allow), so only a TPU run (``benchmarks/lm_decode_device.sh``) decides.

Needs ``libtpu`` of the version jax pins (jax 0.10.2: libtpu 0.0.42), outside the environment's import path
(``make setup`` installs it in ``.venv/tpu-compiler``)::

    PYTHONPATH=.venv/tpu-compiler .venv/bin/python benchmarks/lm_kernels_static.py

``--out docs/results/lm_kernels_static.json`` writes the rows as a results file whose machine field says that
they are the compiler's estimates.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
from pathlib import Path

_PROFILES = Path(tempfile.mkdtemp(prefix="stejax-llo-"))
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
os.environ["LIBTPU_INIT_ARGS"] = (
    os.environ.get("LIBTPU_INIT_ARGS", "") + f" --xla_jf_dump_static_llo_profile_to={_PROFILES}"
).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

jax.config.update("jax_platforms", "cpu")  # only the compiler is the TPU's

SHAPES = ((2048, 2048, 4), (2048, 5632, 2), (5632, 2048, 1))  # (k, n, products of that shape in a block)
# q/k/v (three 2048 x 2048) and gate/up (two 2048 x 5632) as one product each: four calls a block.
CONCATENATED = ((2048, 6144, 1), (2048, 2048, 1), (2048, 11264, 1), (5632, 2048, 1))
BLOCKS = 20
CLOCK_HZ = 1.5e9  # TPU v5e
_KERNELS = ("_int8", "_ternary", "_grouped", "_fused", "_field", "_vpu")


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
    parser.add_argument("--out", type=Path, default=None, help="write the rows as a results file here")
    args = parser.parse_args()

    import numpy as np
    from flax import nnx
    from jax.experimental import topologies
    from jax.sharding import SingleDeviceSharding

    from stejax.lm import LowBitLinear
    from stejax.lowbit.kernels._fused import quantise_rows, rescale
    from stejax.lowbit.kernels._grouped import grouped_sum
    from stejax.lowbit.kernels._int8 import int8_accumulate
    from stejax.lowbit.kernels._ternary import ternary_accumulate
    from stejax.lowbit.nnx import with_kernel_method

    topology = topologies.get_topology_desc(
        topology_name=args.topology, platform="tpu", chip_config_name="default", chips_per_host_bounds=(1, 1, 1)
    )
    place = SingleDeviceSharding(topology.devices[0])
    kind = topology.devices[0].device_kind

    def layer(form: str, k: int, n: int) -> LowBitLinear:
        if form == "int8":
            codes, scale = np.zeros((k, n), np.int8), np.ones((n,), np.float32)
        elif form == "ternary-2bit":
            codes, scale = np.zeros((1, k // 4, n), np.int8), np.float32(50.0)
        else:
            codes, scale = np.zeros((k // 32, 16, n), np.int8), np.ones((k // 32, n), np.float32)
        return LowBitLinear(form, codes, scale, in_features=k, out_features=n, input_bits=8, implementation="pallas")

    def separate(model: LowBitLinear) -> LowBitLinear:
        """The layer as a product kernel with XLA operations around it (its call before the fused kernel)."""

        class Separate(LowBitLinear):
            def __call__(self, x: jax.Array) -> jax.Array:
                qf, m = quantise_rows(x.astype(jnp.float32), self.input_bits)
                q, codes = qf.astype(jnp.int8), self.codes[...]
                if self.form == "int4":
                    return grouped_sum(q, codes, self.scale[...], bits=4, method="mxu") * m
                if self.form == "int8":
                    acc = int8_accumulate(q, codes, method="mxu")
                    return rescale(acc, m, self.scale[...].reshape(1, 1, -1), "int8")
                return rescale(ternary_accumulate(q, codes, method="mxu"), m, self.scale[...], "ternary")

        model.__class__ = Separate
        return model

    def estimate(model: LowBitLinear, k: int) -> tuple[int, int]:
        graphdef, state = nnx.split(model)
        step = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x))
        specs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=place), state)
        _profiles()
        step.lower(specs, jax.ShapeDtypeStruct((1, 1, k), jnp.float32, sharding=place)).compile()
        found = _profiles()
        kernel = sum(c for name, c in found.items() if name.startswith(_KERNELS))
        return kernel, sum(found.values())

    variants = {
        "separate": lambda form, k, n: separate(with_kernel_method(layer(form, k, n), "mxu")),
        "fused": lambda form, k, n: with_kernel_method(layer(form, k, n), "mxu"),
        "vpu": lambda form, k, n: with_kernel_method(layer(form, k, n), "vpu"),
    }
    print(f"static estimates on {kind}: one row, the 1B model's layer shapes (cycles: kernel / layer)")
    rows = []
    for form in ("ternary-2bit", "int8", "int4"):
        names = ("separate", "fused", "concatenated", "vpu")
        for name in names:
            shapes = CONCATENATED if name == "concatenated" else SHAPES
            make = variants["fused" if name == "concatenated" else name]
            found = [estimate(make(form, k, n), k) for k, n, _ in shapes]
            kernels, layers = (
                BLOCKS * sum(f[i] * count for f, (_, _, count) in zip(found, shapes, strict=True)) / CLOCK_HZ
                for i in (0, 1)
            )
            calls = BLOCKS * sum(count for _, _, count in shapes)
            cells = "  ".join(f"{k}x{n}: {a:,} / {b:,}" for (k, n, _), (a, b) in zip(shapes, found, strict=True))
            print(
                f"{form:13} {name:13} {1e6 * kernels:6,.0f} / {1e6 * layers:6,.0f} µs a step, {calls} calls   {cells}"
            )
            rows.append(
                {
                    "form": form,
                    "variant": name,
                    "calls": calls,
                    "kernel_us": round(1e6 * kernels, 1),
                    "layers_us": round(1e6 * layers, 1),
                    "cycles": {
                        f"{k}x{n}": {"kernel": a, "layer": b} for (k, n, _), (a, b) in zip(shapes, found, strict=True)
                    },
                }
            )
    if args.out is not None:
        from stejax.bench.results import Recorder, _machine

        command = "PYTHONPATH=.venv/tpu-compiler .venv/bin/python benchmarks/lm_kernels_static.py"
        recorder = Recorder(args.out.stem, command=command + f" --out {args.out}")
        machine = {
            **_machine(),
            "estimates": f"the TPU compiler's static estimates for a {kind} ({args.topology}, {CLOCK_HZ / 1e9} GHz), "
            "compiled deviceless on this machine: not timings",
        }
        recorder.write(
            args.out,
            rows=rows,
            columns=[
                ("form", "form"),
                ("variant", "variant"),
                ("calls", "calls a step"),
                ("kernel_us", "kernels µs a step", "{:,.0f}"),
                ("layers_us", "layers µs a step", "{:,.0f}"),
            ],
            machine=machine,
        )
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
