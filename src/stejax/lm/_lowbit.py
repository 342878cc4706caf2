r"""Low-bit weights that stay low-bit: an artifact's linear layers as integer codes inside the compiled step.

:func:`load_lowbit` streams an LM artifact (refusing a changed file, as
``stejax.lm._export.load_lm_artifact`` does) into the model with every quantised
linear a :class:`LowBitLinear` that keeps its weights in their exported integer
form: tensor by tensor onto the device, with no float32 copy of a quantised kernel.
The product of a layer, for per-token int8 inputs
:math:`q = \operatorname{clip}(\operatorname{round}(x s_x), -128, 127)`,
:math:`s_x = 127 / \max(\max|x|, 10^{-5})` (int4 inputs alike with 7), is an
integer dot with int32 accumulation, rescaled once:

* ``int8`` (per output channel :math:`s_o`): :math:`y_o = s_o \sum_i q_i c_{io} / s_x`;
* ``int4`` / ``int2`` (per group :math:`g` of 32 along the contraction axis,
  scale :math:`s_{go}`): :math:`y_o = \sum_g s_{go} \sum_{i \in g} q_i c_{io} / s_x`;
  the codes are packed two (four) to a byte, group by group, and unpacked
  inside the step by shifts and masks;
* ternary (one scale :math:`\gamma^{-1}` per tensor, BitNet's ``codes / scale``):
  :math:`y_o = \sum_i q_i c_{io} / (s_x \gamma^{-1})`, with the codes resident
  either as int8 (one byte a weight, ``ternary="int8"``) or packed four to a
  byte (``ternary="2bit"``) and unpacked in the step.

Integer sums are exact, so the layer differs from the exported model's
fake-quantised float product (:attr:`LMArtifact.model`) only by float32
rounding of the products' sum and of the rescaling. Everything else (embedding,
norms, attention, head) is the artifact's float32, run by the model's own code,
so any :class:`LMConfig` layout works.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from stejax.lm._configs import LMQuant
from stejax.lm._kernel_blocks import IMPLEMENTATIONS, kernel_backend
from stejax.lm._kernel_fused import (
    fused_grouped_fits,
    fused_grouped_linear,
    fused_kernel_fits,
    fused_linear,
    grouped_multiplier,
    multiplier,
    quantise_rows,
    rescale,
)
from stejax.lm._kernel_int4 import grouped_kernel_fits, grouped_sum, grouped_sum_reference
from stejax.lm._kernel_int8 import int8_accumulate, int8_accumulate_reference, int8_kernel_fits
from stejax.lm._kernel_ternary import ternary_accumulate, ternary_accumulate_reference, ternary_kernel_fits
from stejax.lm._kernel_vpu import VPU_MOST_ROWS, kernel_method, resolve_method
from stejax.lm._packing import unpack

__all__ = ["TERNARY_FORMS", "LowBitLM", "LowBitLinear", "Resident", "load_lowbit", "lowbit_linear", "weight_bytes"]

# Ternary codes in memory: int8 (one byte each) or 2 bits each, unpacked in the step.
# The default is the faster on the measured CPU (docs/lm.md, "Fast decoding").
TERNARY_FORMS = ("int8", "2bit")
DEFAULT_TERNARY = "int8"


class Resident(nnx.Variable):
    """A weight buffer kept as exported (integer codes, packed codes or their scales); never trained."""


def pack_groups(codes: np.ndarray, group: int, bits: int) -> np.ndarray:
    """Codes ``(in, out)`` -> ``int8 (in // group, group // per, out)``, ``per = 8 // bits`` codes a byte.

    Byte ``j`` of group ``g`` holds rows ``g * group + k * (group // per) + j`` for
    ``k = 0 .. per-1``, each as ``code + 2**(bits-1)`` in bits ``k*bits .. k*bits+bits-1``:
    unpacking slice ``k`` gives a contiguous block of rows. The bytes are stored as int8 (the same bits): the
    TPU's vector unit and MXU take signed integers.
    """
    n_in, n_out = codes.shape
    per = 8 // bits
    if n_in % group or group % per:
        raise ValueError(f"lowbit: {bits}-bit groups of {group} do not tile a kernel of shape {codes.shape}.")
    offset = 1 << (bits - 1)
    # Byte arithmetic (no wider temporaries): each field is code + offset in [0, 2**bits).
    blocks = (np.asarray(codes, np.int8).view(np.uint8) + np.uint8(offset)).reshape(
        n_in // group, per, group // per, n_out
    )
    packed = blocks[:, 0].copy()
    for k in range(1, per):
        packed |= blocks[:, k] << np.uint8(bits * k)
    return packed.view(np.int8)


def _lead(a: jax.Array, ndim: int) -> jax.Array:
    """``a`` with leading axes of size 1 up to ``ndim`` (broadcasting is explicit in this package)."""
    return a.reshape((1,) * (ndim - a.ndim) + a.shape)


def _on_device(a: Any, dtype: Any = None) -> jax.Array:
    """``jnp.asarray(a, dtype)``, with a host array moved by ``jax.device_put`` (no compilation per shape).

    A copy is asked for (``may_alias=False``) and waited for: a caller that drops its host array frees it at
    once, so a load holds one tensor on the host at a time, not every one still in flight. (A CPU device may
    still keep a suitably aligned host array as its buffer; it is then the device's copy, not a second one.)
    """
    if isinstance(a, jax.Array):
        return a if dtype is None or a.dtype == dtype else a.astype(dtype)
    return jax.device_put(np.asarray(a, dtype), may_alias=False).block_until_ready()


class LowBitLinear(nnx.Module):
    """A bias-free linear layer whose kernel stays in its exported integer form.

    Args:
      form: ``"int8"``, ``"int4"``, ``"int2"``, ``"ternary-int8"`` or ``"ternary-2bit"``.
      codes: the resident codes (:func:`lowbit_linear` makes them from integer codes).
      scale: float32: ``(out,)`` for int8, ``(groups, out)`` for int4 and int2, ``()`` for ternary. For int8 and
        ternary weights the layer keeps the weight side of its rescale instead
        (:func:`stejax.lm._kernel_fused.multiplier`: :math:`s_o / t`, or :math:`1 / (\\gamma^{-1} t)`, made on the
        host): the step multiplies the int32 sums by it and by the input rows' maxima, where the formulas above
        divide by :math:`s_x` (the same value to float32 rounding). For int4 and int2 weights it keeps
        :math:`s_{go} / t` (:func:`stejax.lm._kernel_fused.grouped_multiplier`): the step scales each group's
        int32 sums by it, adds them in the order of the groups and multiplies by the row maxima.
      in_features, out_features: the kernel's shape.
      input_bits: 8 or 4: the per-token input codes.
      implementation: the integer product: ``"xla"`` (``lax.dot_general``), ``"pallas"`` (stejax's Pallas TPU
        kernels for int8, grouped int4 and int2, and 2-bit ternary weights; one kernel does the whole layer, the
        input's quantisation and the rescale included, :mod:`stejax.lm._kernel_fused`, where the shape suits
        it: grouped weights at most 16 rows), or None: the kernel
        where the backend is a TPU generation on which the kernels have matched their references
        (none yet) and the shape suits it (a few rows, as in
        decoding), else XLA. The two give the same int32 sums; int8 and ternary logits are identical, grouped
        int4 and int2 ones equal to float32 rounding (a CPU compiler may fuse a group scale's product and the
        running sum into one multiply-add in one program and not in the other).
      interpret: run the kernels in Pallas interpret mode (any backend; for tests).

    Raises:
      ValueError: an unknown ``implementation``.
    """

    def __init__(
        self,
        form: str,
        codes: Any,
        scale: Any,
        *,
        in_features: int,
        out_features: int,
        input_bits: int,
        implementation: str | None = None,
        interpret: bool = False,
    ) -> None:
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"LowBitLinear: implementation must be one of {IMPLEMENTATIONS}; got {implementation!r}.")
        self.form = form
        self.in_features = in_features
        self.out_features = out_features
        self.input_bits = input_bits
        self.implementation = implementation
        self.interpret = interpret
        self.codes = Resident(_on_device(codes))
        if form in ("int8", "ternary-int8", "ternary-2bit"):
            # The weight side of the rescale, made on the host (stejax.lm._kernel_fused.multiplier): the step
            # multiplies by it and the row maximum, a product every compiler keeps as written.
            scale = multiplier(np.asarray(scale, np.float32), "int8" if form == "int8" else "ternary", input_bits)
            if form == "int8":  # (1, out): the kernel's block layout, which (out,) is not on a TPU
                scale = scale.reshape(1, out_features)
        elif form in ("int4", "int2"):  # s_go / t: the step multiplies the scaled group sums by the row maxima
            scale = grouped_multiplier(np.asarray(scale, np.float32), input_bits)
        self.scale = Resident(_on_device(scale, jnp.float32))

    def _kernel(self, rows: int) -> bool:
        """Whether this call runs the Pallas kernel (chosen in Python, from static facts)."""
        if self.implementation == "xla":
            return False
        if self.implementation == "pallas":
            return True
        if not kernel_backend():
            return False
        k, n = self.in_features, self.out_features
        if self.form in ("int8", "ternary-int8"):
            return int8_kernel_fits(rows, k, n)
        if self.form == "ternary-2bit":
            return ternary_kernel_fits(rows, k, n)
        bits = 4 if self.form == "int4" else 2
        return grouped_kernel_fits(rows, k, n, k // self.codes.shape[0], bits)

    def __call__(self, x: jax.Array) -> jax.Array:
        codes, scale = self.codes[...], self.scale[...]
        rows = math.prod(x.shape[:-1])
        kernel = self._kernel(rows)
        fused = self.form in ("int8", "ternary-int8", "ternary-2bit")
        if kernel and not (resolve_method(None, "LowBitLinear") == "vpu" and rows <= VPU_MOST_ROWS):
            # One kernel: the input's quantisation, the integer product and the rescale.
            k, n = self.in_features, self.out_features
            if fused and fused_kernel_fits(rows, k, n, self.form):
                return fused_linear(x, codes, scale, form=self.form, bits=self.input_bits, interpret=self.interpret)
            if not fused and fused_grouped_fits(rows, k, n, k // codes.shape[0], self.form):
                return fused_grouped_linear(
                    x, codes, scale, form=self.form, bits=self.input_bits, interpret=self.interpret
                )
        qf, m = quantise_rows(x.astype(jnp.float32), self.input_bits)
        q = qf.astype(jnp.int8)
        if self.form in ("int8", "ternary-int8"):
            acc = int8_accumulate(q, codes, interpret=self.interpret) if kernel else int8_accumulate_reference(q, codes)
            return rescale(acc, m, _lead(scale, acc.ndim), "int8" if self.form == "int8" else "ternary")
        if self.form == "ternary-2bit":
            acc = (
                ternary_accumulate(q, codes, interpret=self.interpret)
                if kernel
                else ternary_accumulate_reference(q, codes)
            )
            return rescale(acc, m, scale, "ternary")
        bits = 4 if self.form == "int4" else 2
        if kernel:
            return grouped_sum(q, codes, scale, bits=bits, interpret=self.interpret) * m
        return grouped_sum_reference(q, codes, scale, bits=bits) * m


def lowbit_linear(
    codes: np.ndarray,
    scale: np.ndarray | jax.Array,
    config: LMQuant,
    *,
    ternary: str = DEFAULT_TERNARY,
    implementation: str | None = None,
    interpret: bool = False,
) -> LowBitLinear:
    """A :class:`LowBitLinear` from integer codes ``(in, out)`` and the artifact's compact scale.

    ``implementation`` and ``interpret``: as :class:`LowBitLinear`'s.

    Raises:
      ValueError: a configuration with no integer path (float inputs), an unknown ``ternary`` form, or codes
        whose shape the groups do not tile.
    """
    if config.input_bits is None or config.weight_bits is None:
        raise ValueError(
            f"lowbit: configuration {config.name!r} has no integer product; expected weight and input bits."
        )
    if ternary not in TERNARY_FORMS:
        raise ValueError(f"lowbit: ternary must be one of {TERNARY_FORMS}; got {ternary!r}.")
    n_in, n_out = codes.shape
    shape = {
        "in_features": n_in,
        "out_features": n_out,
        "input_bits": int(config.input_bits),
        "implementation": implementation,
        "interpret": interpret,
    }
    if config.weight_bits == 1.58:
        if ternary == "int8":
            return LowBitLinear("ternary-int8", codes.astype(np.int8, copy=False), scale, **shape)
        return LowBitLinear("ternary-2bit", pack_groups(codes, n_in, 2), scale, **shape)
    if config.weight_bits == 8:
        return LowBitLinear("int8", codes.astype(np.int8, copy=False), np.reshape(scale, (n_out,)), **shape)
    bits = int(config.weight_bits)
    if config.group is None:
        raise ValueError(f"lowbit: {bits}-bit weights need groups along the contraction axis; got group None.")
    form = "int4" if bits == 4 else "int2"
    return LowBitLinear(form, pack_groups(codes, config.group, bits), scale, **shape)


class VpuLowBitLinear(LowBitLinear):
    """A :class:`LowBitLinear` whose Pallas kernels multiply on the vector unit at a few rows.

    Its own class: a compiled step of a model holding it is cached apart from the MXU kernels' step.
    """

    def __call__(self, x: jax.Array) -> jax.Array:
        with kernel_method("vpu"):
            return super().__call__(x)


def with_kernel_method(model: Any, method: str) -> Any:
    """A copy of ``model`` whose :class:`LowBitLinear` layers run the Pallas kernels by ``method``.

    ``"vpu"``: the vector-unit product wherever a call has at most
    :data:`stejax.lm._kernel_vpu.VPU_MOST_ROWS` rows (decoding), the MXU kernel otherwise; ``"mxu"``: the MXU
    kernels. The layers' ``implementation`` is set to ``"pallas"`` (the kernels, not XLA's product). The weights
    are shared with ``model``, not copied.

    Raises:
      ValueError: a method other than ``"mxu"`` or ``"vpu"``.
    """
    resolve_method(method, "with_kernel_method")
    graphdef, state = nnx.split(model)
    copy = nnx.merge(graphdef, state)
    for _, module in nnx.iter_modules(copy):
        if isinstance(module, LowBitLinear):
            module.implementation = "pallas"
            module.__class__ = VpuLowBitLinear if method == "vpu" else LowBitLinear
    return copy


def is_vpu_layer(module: Any) -> bool:
    """Whether ``module`` is a layer made by :func:`with_kernel_method` with ``"vpu"``."""
    return isinstance(module, VpuLowBitLinear)


def weight_bytes(model: nnx.Module) -> dict[str, int]:
    """Bytes of the weight buffers the model's step reads.

    Returns:
      ``{"resident": every parameter and resident buffer, "linear": the quantised linears' codes and scales,
      "linear_float32": those linears' kernels in float32}`` (``linear`` is 0 for a model without
      :class:`LowBitLinear` layers).
    """
    # .nbytes of the arrays themselves: np.asarray would copy every device buffer to the host.
    resident = sum(int(x.nbytes) for x in jax.tree.leaves(nnx.state(model, nnx.Param, Resident)))
    linear = linear_float32 = 0
    for _, module in nnx.iter_modules(model):
        if isinstance(module, LowBitLinear):
            linear += int(module.codes[...].nbytes) + int(module.scale[...].nbytes)
            linear_float32 += 4 * module.in_features * module.out_features
    return {"resident": resident, "linear": linear, "linear_float32": linear_float32}


@dataclasses.dataclass(frozen=True)
class LowBitLM:
    """What :func:`load_lowbit` returns.

    Attributes:
      model: the :class:`stejax.lm.Transformer` with :class:`LowBitLinear` layers at the quantised sites
        (for ``float``, the float model).
      config: the artifact's configuration.
      ternary: the resident form of ternary codes (``"int8"`` or ``"2bit"``; None for other configurations).
      bytes: :func:`weight_bytes` of ``model``.
      path: the artifact directory.
      reference: the exported integer forward as :func:`stejax.lm.load_lm_artifact` rebuilds it (dequantised
        float32 kernels and fake-quantised inputs): the model the low-bit one is checked against. Built from
        the artifact (verified again) on first use, so that loading holds no float32 copy of the kernels.
    """

    model: nnx.Module
    config: LMQuant
    ternary: str | None
    bytes: dict[str, int]
    path: Path

    @functools.cached_property
    def reference(self) -> nnx.Module:
        from stejax.lm._export import load_lm_artifact

        return load_lm_artifact(self.path).model


def _set_module(root: nnx.Module, path: str, module: nnx.Module) -> None:
    *parents, last = path.split("/")
    node: Any = root
    for part in parents:
        node = node[int(part)] if part.isdigit() else getattr(node, part)
    setattr(node, last, module)


def load_lowbit(
    path: str | os.PathLike, *, ternary: str = DEFAULT_TERNARY, implementation: str | None = None
) -> LowBitLM:
    """Verify an LM artifact and load it with its quantised linears resident in exported integer form.

    The weights file is streamed: tensor by tensor, each put on the default device in its resident form and its
    host copy dropped, with no float32 copy of a quantised kernel at any point. The file's sha256 is computed
    from the bytes as they are read and checked before the model is returned.

    Args:
      path: an artifact directory written by ``stejax lm export``.
      ternary: ternary codes in memory as ``"int8"`` (the default, faster here) or ``"2bit"``
        (four to a byte, unpacked in the step).
      implementation: the quantised layers' integer product (:class:`LowBitLinear`): None chooses the Pallas
        kernel on a TPU for shapes it suits, ``"xla"`` or ``"pallas"`` forces one.

    Raises:
      stejax.artifacts.ArtifactError: a missing, changed or unlisted file, an edited manifest, or a tensor that
        does not fit the model.
      ValueError: an unknown ``ternary`` form, or a configuration with no integer product.
    """
    from stejax.artifacts import ArtifactError
    from stejax.lm._export import WEIGHTS, iter_lm_tensors, read_lm_manifest
    from stejax.lm._model import LMConfig, Transformer

    if ternary not in TERNARY_FORMS:
        raise ValueError(f"load_lowbit: ternary must be one of {TERNARY_FORMS}; got {ternary!r}.")
    root = Path(path)
    manifest = read_lm_manifest(root)
    config = LMQuant(**manifest["config"])
    if config.weight_bits is not None and config.input_bits is None:
        raise ValueError(
            f"lowbit: configuration {config.name!r} has no integer product; expected weight and input bits."
        )
    quantised = manifest["quantised"] if config.weight_bits is not None else {}
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(LMConfig(**manifest["model"]), rngs=nnx.Rngs(0))))
    flat = nnx.to_flat_state(state)
    wanted = {"/".join(str(p) for p in key): leaf.get_value() for key, leaf in flat}
    where = root / WEIGHTS
    values: dict[str, jax.Array] = {}
    scales: dict[str, jax.Array] = {}
    stored: dict[str, np.ndarray] = {}
    layers: dict[str, LowBitLinear] = {}

    def make_layer(site: str) -> None:
        entry = quantised[site]
        shape = tuple(entry["shape"])
        context = f"load_lowbit: {where}: tensor {site + '/codes'!r}"
        try:  # byte arithmetic, no wider temporaries: a few bytes a code
            codes = unpack(stored.pop(site), entry["container"], math.prod(shape), context=context).reshape(shape)
        except ValueError as e:
            raise ArtifactError(str(e)) from None
        layers[site] = lowbit_linear(codes, scales.pop(site), config, ternary=ternary, implementation=implementation)

    for name, value in iter_lm_tensors(root, manifest):
        site, _, leaf = name.rpartition("/")
        if site in quantised and leaf in ("codes", "scale"):
            if leaf == "codes":
                stored[site] = value
            else:  # on the device at once: the file holds every scale before the first codes
                scales[site] = _on_device(value)
            if site in stored and site in scales:
                make_layer(site)
        elif name in wanted:
            if value.shape != wanted[name].shape:
                raise ArtifactError(f"{where}: {name!r} has shape {value.shape}; expected {wanted[name].shape}.")
            values[name] = _on_device(value)
        del value
    leaves = []
    for key, leaf in flat:
        name = "/".join(str(p) for p in key)
        site = name.rsplit("/", 1)[0]
        if site in quantised and name.endswith("/kernel"):
            if site not in layers:
                part = "codes" if site not in stored else "scale"
                raise ArtifactError(f"{where}: lacks {site + '/' + part!r}, a quantised linear of the model.")
            leaves.append((key, leaf.replace(jnp.zeros((), jnp.float32))))  # replaced by its LowBitLinear below
        elif name in values:
            leaves.append((key, leaf.replace(values.pop(name))))
        else:
            raise ArtifactError(f"{where}: lacks {name!r}, a parameter of the model.")
    model = nnx.merge(graphdef, nnx.from_flat_state(leaves))
    for site, layer in sorted(layers.items()):
        _set_module(model, site, layer)
    form = ternary if config.weight_bits == 1.58 else None
    return LowBitLM(model, config, form, weight_bytes(model), root)
