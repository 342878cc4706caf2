"""What each JAX backend computes differently: the platform contract the verifier and the tests follow."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import ml_dtypes
import numpy as np

__all__ = ["PlatformContract", "flush_subnormal_inputs", "measure_platform", "platform_contract"]


@dataclasses.dataclass(frozen=True)
class PlatformContract:
    """How one backend's float arithmetic differs from XLA on CPU, the reference platform.

    stejax's forwards are exact operations: rounding, sign, ternary and the
    Heaviside step return the same bits on every platform for normal numbers,
    signed zeros, infinities and NaN. What a platform may change is written
    here, and the verifier and the test suite take their expectations from it
    instead of from a wider global tolerance.

    Attributes:
      platform: the backend's name (``jax.default_backend()``).
      tested: whether the suite runs on this platform (the CPU in CI, the TPU by
        ``make test-device``); an untested entry states what XLA documents.
      subnormal_inputs_read_as_zero: dtypes whose subnormal inputs the platform
        reads as zero, so a comparison or a sign sees ``0`` (``sign`` of a
        negative subnormal is then ``+1``, and ``ternary`` with threshold 0 gives
        ``0``). On CPU none; on a TPU bfloat16. Subnormal *results* are flushed
        to zero on every XLA backend: the verifier's absolute floor ``tiny``.
      derivative_ulps: per dtype, the ulps by which one evaluation of a
        declared derivative may differ from another of the same formula (the
        rule's own, fused into a program, against the derivative evaluated
        alone, or against its float32 emulation). ``0`` means bit for bit. A TPU
        evaluates float16 and bfloat16 in float32 and rounds once, and fuses
        float32 formulas in its own order. The verifier's allowance.
      function_ulps: per dtype and function (``divide``, ``exp``, ``log``,
        ``tanh``, ``logistic``, ``arctan``), the largest distance in ulps of the
        result from XLA on CPU, over :func:`measure_platform`'s seeded inputs in
        [-8, 8]; an ulp is the result's own, so the largest counts come near a
        function's zero. None where not measured. What a reference computed on
        CPU (NumPy, float64) must allow for a formula built on these functions.
      default_matmul_precision: what a float32 ``dot`` computes at
        ``precision=None``.
      matmul_relative_error: the relative error (to the largest |entry| of the
        exact product) that this default allows for unit-scale float32 operands.
        ``jax.default_matmul_precision("highest")`` gives float32 accuracy on
        every platform; the device suite runs under it, so that references
        computed in float32 apply.
      float64: whether float64 programs (``jax.enable_x64``) compile.
    """

    platform: str
    tested: bool
    subnormal_inputs_read_as_zero: tuple[str, ...]
    derivative_ulps: Mapping[str, int]
    function_ulps: Mapping[str, Mapping[str, int]] | None
    default_matmul_precision: str
    matmul_relative_error: float
    float64: bool

    def ulps(self, dtype: Any) -> int:
        """The ulps allowed between two evaluations of a declared derivative in ``dtype`` (0: bit for bit)."""
        return int(self.derivative_ulps.get(np.dtype(dtype).name, 0))

    def function_error(self, function: str, dtype: Any = np.float32, magnitude: float = 1.0) -> float:
        """The absolute error from XLA:CPU allowed for ``function`` on results of at most ``magnitude``.

        ``function_ulps`` times the dtype's ``eps`` times ``magnitude`` (an ulp of a number below
        ``magnitude`` is at most ``eps * magnitude``); 0 where the platform is XLA:CPU itself.
        """
        if self.function_ulps is None:
            raise ValueError(f"the {self.platform} contract has no measured function ulps")
        ulps = self.function_ulps.get(np.dtype(dtype).name, {}).get(function)
        if ulps is None:
            raise ValueError(f"no {function!r} in {np.dtype(dtype).name} in the {self.platform} contract")
        return float(ulps) * float(ml_dtypes.finfo(np.dtype(dtype)).eps) * magnitude

    @property
    def bitwise(self) -> bool:
        """Whether float functions are bit for bit XLA:CPU's in every dtype, subnormal inputs included."""
        functions = self.function_ulps or {}
        return (
            not any(self.derivative_ulps.values())
            and not any(n for row in functions.values() for n in row.values())
            and not self.subnormal_inputs_read_as_zero
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["subnormal_inputs_read_as_zero"] = list(self.subnormal_inputs_read_as_zero)
        d["derivative_ulps"] = dict(self.derivative_ulps)
        if self.function_ulps is not None:
            d["function_ulps"] = {k: dict(v) for k, v in self.function_ulps.items()}
        return d


_FUNCTION_NAMES = ("divide", "exp", "log", "tanh", "logistic", "arctan")

_CONTRACTS = {
    "cpu": PlatformContract(
        platform="cpu",
        tested=True,
        subnormal_inputs_read_as_zero=(),
        derivative_ulps={"float16": 0, "bfloat16": 0, "float32": 0, "float64": 0},
        function_ulps={d: dict.fromkeys(_FUNCTION_NAMES, 0) for d in ("float32", "bfloat16", "float16")},
        default_matmul_precision="float32 (one pass; the summation order is XLA's)",
        matmul_relative_error=1e-5,
        float64=True,
    ),
    "tpu": PlatformContract(
        platform="tpu",
        tested=True,
        subnormal_inputs_read_as_zero=("bfloat16",),
        derivative_ulps={"float16": 1, "bfloat16": 1, "float32": 4},
        # Measured on a TPU v5e (JAX 0.10.2) by measure_platform(): docs/results/platform_tpu.json.
        function_ulps={
            "float32": {"divide": 2, "exp": 53, "log": 3870, "tanh": 1211, "logistic": 66, "arctan": 2},
            "bfloat16": {"divide": 1, "exp": 0, "log": 63, "tanh": 0, "logistic": 2, "arctan": 0},
            "float16": {"divide": 1, "exp": 1, "log": 63, "tanh": 1, "logistic": 2, "arctan": 0},
        },
        default_matmul_precision="bfloat16 operands (one pass), float32 accumulation",
        matmul_relative_error=5e-3,
        float64=False,
    ),
    # Not run here: what XLA documents for NVIDIA GPUs (TF32 products on Ampere and newer at the default
    # precision; CUDA's float32 functions within a few ulps; subnormals kept).
    "gpu": PlatformContract(
        platform="gpu",
        tested=False,
        subnormal_inputs_read_as_zero=(),
        derivative_ulps={"float16": 1, "bfloat16": 1, "float32": 4, "float64": 4},
        function_ulps=None,
        default_matmul_precision="TensorFloat-32 operands on Ampere and newer, float32 accumulation",
        matmul_relative_error=2e-3,
        float64=True,
    ),
}


def platform_contract(platform: str | None = None) -> PlatformContract:
    """The contract of ``platform`` (``"cpu"``, ``"tpu"``, ``"gpu"``; default: JAX's default backend).

    >>> platform_contract("cpu").ulps("bfloat16")
    0
    >>> platform_contract("tpu").subnormal_inputs_read_as_zero
    ('bfloat16',)
    """
    name = jax.default_backend() if platform is None else platform
    key = "gpu" if name in ("cuda", "rocm") else name
    if key not in _CONTRACTS:
        raise ValueError(f"no platform contract for backend {name!r}: expected one of {sorted(_CONTRACTS)}")
    return _CONTRACTS[key]


def flush_subnormal_inputs(x: Any, contract: PlatformContract) -> np.ndarray:
    """``x`` as the platform reads it: subnormals of the listed dtypes become zeros of their sign.

    A NumPy reference evaluated on the result gives the platform's answer, for
    example the sign of a negative bfloat16 subnormal on a TPU.

    >>> tiny = ml_dtypes.finfo(ml_dtypes.bfloat16).smallest_subnormal
    >>> x = np.array([-tiny, 1.0], ml_dtypes.bfloat16)
    >>> flush_subnormal_inputs(x, platform_contract("tpu")).tolist()
    [-0.0, 1.0]
    """
    a = np.asarray(x)
    if a.dtype.name not in contract.subnormal_inputs_read_as_zero:
        return a
    wide = a.astype(np.float64)
    sub = (wide != 0) & (np.abs(wide) < float(ml_dtypes.finfo(a.dtype).smallest_normal))
    return np.where(sub, np.copysign(0.0, wide), wide).astype(a.dtype)


# The elementwise functions whose results the contract bounds, as the estimators use them.
_FUNCTIONS = {
    "divide": lambda x: x / (1.75 + jax.numpy.abs(x)),
    "exp": lambda x: jax.numpy.exp(x),
    "log": lambda x: jax.numpy.log(jax.numpy.abs(x) + 0.125),
    "tanh": lambda x: jax.numpy.tanh(x),
    "logistic": lambda x: jax.nn.sigmoid(x),
    "arctan": lambda x: jax.numpy.arctan(x),
}


def _ulp_distance(a: np.ndarray, b: np.ndarray) -> int:
    """The largest distance in ulps between finite entries of two arrays of one float dtype."""
    bits = {2: np.int16, 4: np.int32}[a.dtype.itemsize]
    width = 8 * a.dtype.itemsize

    def ordered(v: np.ndarray) -> np.ndarray:
        i = v.view(bits).astype(np.int64)
        return np.where(i < 0, -(i & ((1 << (width - 1)) - 1)), i)

    finite = np.isfinite(a.astype(np.float32)) & np.isfinite(b.astype(np.float32))
    d = np.abs(ordered(a) - ordered(b))[finite]
    return int(d.max()) if d.size else 0


def measure_platform(device: Any = None, *, n: int = 4096, seed: int = 0) -> dict[str, Any]:
    """What ``device`` (default: JAX's first device) computes, against XLA on CPU: the contract's quantities.

    Returns ``function_ulps`` (per dtype and function, the largest distance in ulps over ``n`` seeded inputs
    in [-8, 8]), ``subnormal_inputs_read_as_zero`` (the dtypes in which a negative subnormal loses its bits on its way
    into a program)
    and ``matmul_relative_error`` (a 256x512 by 512x128 float32 product at the default precision and at
    ``"highest"``, against float64, relative to the largest |entry|).
    """
    device = jax.devices()[0] if device is None else device
    cpu = jax.devices("cpu")[0]
    rng = np.random.default_rng(seed)
    x64 = rng.uniform(-8.0, 8.0, n)
    ulps: dict[str, dict[str, int]] = {}
    flushed = []
    for dtype in (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)):
        x = x64.astype(dtype)
        row = {}
        for name, f in _FUNCTIONS.items():
            on_device = np.asarray(jax.jit(f)(jax.device_put(x, device)))
            on_cpu = np.asarray(jax.jit(f)(jax.device_put(x, cpu)))
            row[name] = _ulp_distance(on_device, on_cpu)
        ulps[dtype.name] = row
        # Read through the bits (as stejax's sign and ternary read their inputs), not through a comparison,
        # which XLA may flush on any backend.
        tiny = np.array([-ml_dtypes.finfo(dtype).smallest_subnormal], dtype)
        int_dtype = {2: np.int16, 4: np.int32}[dtype.itemsize]
        bits = np.asarray(
            jax.jit(lambda v, t=int_dtype: jax.lax.bitcast_convert_type(v, t))(jax.device_put(tiny, device))
        )
        if bits[0] != tiny.view(int_dtype)[0]:
            flushed.append(dtype.name)
    a = rng.standard_normal((256, 512)).astype(np.float32)
    b = rng.standard_normal((512, 128)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    errors = {}
    for precision in ("default", "highest"):
        product = jax.jit(lambda a, b, p=precision: jax.numpy.matmul(a, b, precision=p))
        got = np.asarray(product(jax.device_put(a, device), jax.device_put(b, device)))
        errors[precision] = float(np.abs(got - exact).max() / np.abs(exact).max())
    return {
        "platform": device.platform,
        "device_kind": device.device_kind,
        "function_ulps": ulps,
        "subnormal_inputs_read_as_zero": flushed,
        "matmul_relative_error": errors,
    }
