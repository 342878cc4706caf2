"""The model config as JSON data, in the run directory's form (``{"kind": "mlp" | "cnn", ...fields}``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from stejax.model import ConvConfig, MLPConfig, ModelConfig

__all__ = ["model_config_from_dict", "model_config_to_dict"]


def model_config_to_dict(model_config: ModelConfig) -> dict[str, Any]:
    """``{"kind": "mlp" | "cnn", field: value, ...}`` with tuples as lists."""
    kind = "mlp" if isinstance(model_config, MLPConfig) else "cnn"
    fields = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(model_config).items()}
    return {"kind": kind, **fields}


def model_config_from_dict(data: dict[str, Any]) -> ModelConfig:
    """The inverse of :func:`model_config_to_dict`.

    Raises:
      ValueError: an unknown kind or field, or an invalid value.
      TypeError: a value of the wrong type.
    """
    data = dict(data)
    kind = data.pop("kind", None)
    cls = {"mlp": MLPConfig, "cnn": ConvConfig}.get(kind)
    if cls is None:
        raise ValueError(f"model config: kind must be 'mlp' or 'cnn'; got {kind!r}.")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(
            f"model config: {unknown[0]!r} is not a field of {cls.__name__}; the fields are {sorted(known)}."
        )
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})
