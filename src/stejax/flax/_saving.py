"""A quantised model's state in one safetensors file, with the rules that made it, to quantise again identically."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from stejax._files import read_safetensors
from stejax.flax._quant import Quant
from stejax.flax._rules import Rule, quantize_model, summary

__all__ = ["load_quantized", "rules_from_json", "rules_to_json", "save_quantized"]

RULES_KEY = "stejax_rules"


def rules_to_json(rules: tuple[Rule, ...]) -> str:
    """The rules as JSON: each rule's path, kinds and quantisers (catalog name, settings, options, init).

    Raises:
      ValueError: a quantiser that is a plain callable (it has no name to record).
    """
    return json.dumps([_rule_dict(i, r) for i, r in enumerate(rules)], sort_keys=True)


def rules_from_json(text: str) -> tuple[Rule, ...]:
    """The rules :func:`rules_to_json` wrote."""
    return tuple(
        Rule(d["path"], kinds=d["kinds"], weights=_quant(d["weights"]), inputs=_quant(d["inputs"]))
        for d in json.loads(text)
    )


def _rule_dict(i: int, rule: Rule) -> dict[str, Any]:
    return {
        "path": rule.path,
        "kinds": None if rule.kinds is None else list(rule.kinds),
        "weights": _quant_dict(i, rule.weights),
        "inputs": _quant_dict(i, rule.inputs),
    }


def _quant_dict(i: int, quant: Quant | None) -> dict[str, Any] | None:
    if quant is None:
        return None
    if quant.entry is None:
        raise ValueError(
            f"save_quantized: rule {i} uses the callable {quant.name}, which cannot be recorded; use a catalog "
            "estimator."
        )
    return {"estimator": quant.name, "params": quant.params, "options": dict(quant._options), "init": quant.init}


def _quant(d: dict[str, Any] | None) -> Quant | None:
    if d is None:
        return None
    return Quant(d["estimator"], init=d["init"] or None, **d["options"], **d["params"])


def save_quantized(model: nnx.Module, path: str | os.PathLike) -> Path:
    """Write a quantised model's variables (parameters, learned and calibrated quantiser arguments) and its rules.

    One safetensors file: each variable named by its path (``"conv1/kernel"``,
    ``"conv1/stejax_quant/p0/weight_step"``), the rules as JSON in the header's
    metadata. :func:`load_quantized` quantises a float model of the same class
    with the recorded rules and loads the values.

    Raises:
      TypeError: ``model`` did not come from :func:`stejax.flax.quantize_model`.
      ValueError: a rule uses a plain callable.
    """
    from safetensors.numpy import save_file

    summary(model)
    metadata = {RULES_KEY: rules_to_json(getattr(model, "stejax_rules"))}  # noqa: B009 - set by quantize_model
    tensors = {name: np.array(jax.device_get(value), order="C") for name, value in _variables(model).items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=metadata)
    return path


def load_quantized(
    model: nnx.Module, path: str | os.PathLike, *example_inputs: Any, rngs: nnx.Rngs | None = None
) -> nnx.Module:
    """Quantise ``model`` with the rules recorded in ``path`` and load the saved values into it.

    Args:
      model: a float model of the class that was quantised (its values are replaced).
      path: a file written by :func:`save_quantized`.
      *example_inputs: one call's inputs, as for :func:`stejax.flax.quantize_model`.
      rngs: as for :func:`stejax.flax.quantize_model`.

    Raises:
      FileNotFoundError: no such file.
      stejax.InputFileError: not a safetensors file, or no rules recorded in it.
      ValueError: a variable missing, extra or of another shape (named). The
        float model's own variables are checked before it runs.
    """
    from safetensors import safe_open

    from stejax._files import InputFileError

    tensors = read_safetensors(path, what="a quantised NNX model (stejax.flax.save_quantized)")
    with safe_open(str(path), framework="numpy") as f:
        metadata = f.metadata() or {}
    if RULES_KEY not in metadata:
        raise InputFileError(f"{path}: no {RULES_KEY} in the header; not written by stejax.flax.save_quantized.")
    # The float model's own variables first: a model of other shapes is refused before it runs.
    for name, var in _variables(model, as_variables=True).items():
        if name in tensors:
            _check_fits(path, name, tensors[name], var)
    qmodel = quantize_model(model, rules_from_json(metadata[RULES_KEY]), *example_inputs, strict=False, rngs=rngs)
    variables = _variables(qmodel, as_variables=True)
    missing, extra = sorted(set(variables) - set(tensors)), sorted(set(tensors) - set(variables))
    if missing or extra:
        raise ValueError(f"load_quantized: {path} does not fit the model: missing {missing[:5]}, extra {extra[:5]}.")
    for name, var in variables.items():
        value = tensors[name]
        _check_fits(path, name, value, var)
        # A transfer to where the variable lives (a NumPy value set in place would compile a program per shape).
        var[...] = jax.device_put(value, var[...].sharding)
    return qmodel


def _check_fits(path: Any, name: str, value: np.ndarray, var: nnx.Variable) -> None:
    if value.shape != tuple(var[...].shape) or value.dtype != var[...].dtype:
        raise ValueError(
            f"load_quantized: {path}: {name} is {value.dtype}{list(value.shape)}; the model has "
            f"{var[...].dtype}{list(var[...].shape)}."
        )


def _variables(model: nnx.Module, *, as_variables: bool = False) -> dict[str, Any]:
    out = {}
    for parts, var in nnx.iter_graph(model):
        if isinstance(var, nnx.Variable) and not isinstance(var, nnx.RngState) and hasattr(var[...], "shape"):
            name = "/".join(str(p) for p in parts)
            out[name] = var if as_variables else var[...]
    return out
