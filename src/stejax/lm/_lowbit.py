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

By default the projections that read one input are loaded side by side as one layer
(:class:`stejax.lowbit.nnx.SplitLinear`): a block's queries, keys and values in
one product, its SwiGLU gate and up in another, so that a block issues four
products where it would issue seven. Each column keeps its own scale (a ternary
tensor's one scale is repeated over its columns), so the outputs equal the
separate layers' bit for bit.

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
from stejax.lowbit._layer import LowBitLinear, Resident, SplitLinear, on_device
from stejax.lowbit._packing import pack_groups, unpack

__all__ = [
    "FUSED_PROJECTIONS",
    "TERNARY_FORMS",
    "LowBitLM",
    "load_lowbit",
    "lowbit_linear",
    "side_by_side",
    "weight_bytes",
]

# Ternary codes in memory: int8 (one byte each) or 2 bits each, unpacked in the step.
# The default is the faster on the measured CPU (docs/lm.md, "Fast decoding").
TERNARY_FORMS = ("int8", "2bit")
DEFAULT_TERNARY = "int8"


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


# The projections loaded as one product: (the module, the fused layer's name, its parts in output order).
FUSED_PROJECTIONS = (("attn", "qkv", ("q", "k", "v")), ("mlp", "gate_up", ("gate", "up")))


def side_by_side(parts: list[tuple[np.ndarray, Any]], config: LMQuant) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes ``(in, out_i)`` and compact scales of linears of one input as one layer's codes and scale.

    Codes are concatenated along the output axis, and so are per-channel (int8) and per-group (int4, int2)
    scales. A ternary kernel's one scale becomes a scale per column, its value repeated over the kernel's
    columns: each column's rescale is then the one-scale layer's float operations on the same values.

    Raises:
      ValueError: codes with different contraction lengths.
    """
    if len({codes.shape[0] for codes, _ in parts}) != 1:
        raise ValueError(
            f"side_by_side: the parts must share the contraction axis; got codes of shapes "
            f"{[codes.shape for codes, _ in parts]}."
        )
    codes = np.concatenate([c for c, _ in parts], axis=1)
    if config.weight_bits == 1.58:
        columns = [np.full((c.shape[1],), np.asarray(s, np.float32).reshape(()), np.float32) for c, s in parts]
        return codes, np.concatenate(columns)
    if config.weight_bits == 8:
        return codes, np.concatenate([np.asarray(s, np.float32).reshape(c.shape[1]) for c, s in parts])
    return codes, np.concatenate([np.asarray(s, np.float32) for _, s in parts], axis=1)


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


def module_at(root: Any, path: str) -> Any:
    """The submodule of ``root`` at a ``/``-joined path (``"blocks/0/attn/q"``; digits index lists)."""
    node = root
    for part in path.split("/") if path else ():
        node = node[int(part)] if part.isdigit() else getattr(node, part)
    return node


def _set_module(root: nnx.Module, path: str, module: nnx.Module) -> None:
    parent, _, last = path.rpartition("/")
    setattr(module_at(root, parent), last, module)


def _fused_site(site: str) -> tuple[str, str, tuple[str, ...]] | None:
    """``("blocks/0/attn", "qkv", ("q", "k", "v"))`` for a site that is a part of a fused projection, else None."""
    parent, _, name = site.rpartition("/")
    for module, fused, names in FUSED_PROJECTIONS:
        if parent.endswith("/" + module) and name in names:
            return parent, fused, names
    return None


def _delete_module(root: nnx.Module, path: str) -> None:
    parent, _, last = path.rpartition("/")
    delattr(module_at(root, parent), last)


def load_lowbit(
    path: str | os.PathLike,
    *,
    ternary: str = DEFAULT_TERNARY,
    implementation: str | None = None,
    fuse_projections: bool = True,
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
      fuse_projections: load each block's query, key and value kernels side by side as one layer
        (``attn.qkv``), and SwiGLU's gate and up kernels as another (``mlp.gate_up``), each a
        :class:`stejax.lowbit.nnx.SplitLinear`: one product each, with the same outputs bit for bit (True, the
        default); False keeps one layer per kernel. Parts that are not all quantised stay apart.

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
    layers: dict[str, LowBitLinear | SplitLinear] = {}
    # Parts of a fused projection, kept on the host (codes and scale) until the last of them is read.
    waiting: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    fused_parts: dict[str, str] = {}  # a part's site -> its fused layer's site

    def fusing(site: str) -> tuple[str, str, tuple[str, ...]] | None:
        found = _fused_site(site) if fuse_projections else None
        if found is None or not all(f"{found[0]}/{name}" in quantised for name in found[2]):
            return None
        return found

    def make_layer(site: str) -> None:
        entry = quantised[site]
        shape = tuple(entry["shape"])
        context = f"load_lowbit: {where}: tensor {site + '/codes'!r}"
        try:  # byte arithmetic, no wider temporaries: a few bytes a code
            codes = unpack(stored.pop(site), entry["container"], math.prod(shape), context=context).reshape(shape)
        except ValueError as e:
            raise ArtifactError(str(e)) from None
        found = fusing(site)
        if found is None:
            layers[site] = lowbit_linear(
                codes, scales.pop(site), config, ternary=ternary, implementation=implementation
            )
            return
        parent, fused, names = found
        parts = waiting.setdefault(f"{parent}/{fused}", {})
        parts[site.rpartition("/")[2]] = (codes, np.asarray(scales.pop(site), np.float32))
        if len(parts) < len(names):
            return
        del waiting[f"{parent}/{fused}"]
        ordered = [parts.pop(name) for name in names]
        try:
            joined, scale = side_by_side(ordered, config)
        except ValueError as e:
            raise ArtifactError(f"load_lowbit: {where}: {parent}/{fused}: {e}") from None
        widths = [codes.shape[1] for codes, _ in ordered]
        del ordered, parts
        layer = lowbit_linear(joined, scale, config, ternary=ternary, implementation=implementation)
        layers[f"{parent}/{fused}"] = SplitLinear(layer, widths)
        fused_parts.update({f"{parent}/{name}": f"{parent}/{fused}" for name in names})

    for name, value in iter_lm_tensors(root, manifest):
        site, _, leaf = name.rpartition("/")
        if site in quantised and leaf in ("codes", "scale"):
            if leaf == "codes":
                stored[site] = value
            else:  # on the device at once: the file holds every scale before the first codes
                scales[site] = on_device(value)
            if site in stored and site in scales:
                make_layer(site)
        elif name in wanted:
            if value.shape != wanted[name].shape:
                raise ArtifactError(f"{where}: {name!r} has shape {value.shape}; expected {wanted[name].shape}.")
            values[name] = on_device(value)
        del value
    leaves = []
    for key, leaf in flat:
        name = "/".join(str(p) for p in key)
        site = name.rsplit("/", 1)[0]
        if site in quantised and name.endswith("/kernel"):
            found = _fused_site(site)
            held = found is not None and site.rpartition("/")[2] in waiting.get(f"{found[0]}/{found[1]}", {})
            if site not in layers and site not in fused_parts and not held:  # (a held part: its sibling is missing)
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
    for site in sorted(fused_parts):  # the parts' placeholders: their columns are in the fused layer
        _delete_module(model, site)
    form = ternary if config.weight_bits == 1.58 else None
    return LowBitLM(model, config, form, weight_bytes(model), root)
