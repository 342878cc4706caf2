"""The run directory: what one training run leaves on disk, and reading it back (no pickle)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from stejax._files import InputFileError, read_json, read_json_lines, read_safetensors
from stejax.data import Normalizer, Splits
from stejax.model import ConvConfig, MLPConfig, ModelConfig, QATConfig, check_params, param_spec
from stejax.train._config import TrainConfig
from stejax.train._result import TrainResult
from stejax.train._step import leaf_name

__all__ = ["FORMAT", "Run", "load_params", "load_run", "save_params", "save_run"]

FORMAT = "stejax-run/1"

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
PARAMS_FILE = "params.safetensors"
NORMALIZER_FILE = "normalizer.json"
REPORT_FILE = "report.json"


@dataclasses.dataclass(frozen=True, eq=False)
class Run:
    """A run directory read back by :func:`load_run`.

    Attributes:
      config: the recipe.
      model_config: the model.
      qat_config: the QAT configuration.
      params: the best parameters (jax float32 arrays, checked against the spec).
      normalizer: the training split's standardisation.
      metrics: the per-epoch records of ``metrics.jsonl``.
      report: ``report.json`` (the test accuracy and how the run went).
      data: what ``config.json`` says about the data (name, sizes, split seed).
    """

    config: TrainConfig
    model_config: ModelConfig
    qat_config: QATConfig
    params: Any
    normalizer: Normalizer
    metrics: tuple[dict[str, Any], ...]
    report: dict[str, Any]
    data: dict[str, Any]


def _model_to_dict(model_config: ModelConfig) -> dict[str, Any]:
    kind = "mlp" if isinstance(model_config, MLPConfig) else "cnn"
    fields = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(model_config).items()}
    return {"kind": kind, **fields}


def _model_from_dict(data: dict[str, Any]) -> ModelConfig:
    data = dict(data)
    kind = data.pop("kind", None)
    cls = {"mlp": MLPConfig, "cnn": ConvConfig}.get(kind)
    if cls is None:
        raise ValueError(f"load_run: model kind must be 'mlp' or 'cnn'; got {kind!r}.")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def save_params(params: Any, path: str | os.PathLike, *, metadata: dict[str, str] | None = None) -> Path:
    """Write a parameter PyTree to a safetensors file, each leaf named by its PyTree path.

    Names join the keys with ``/`` as :func:`stejax.model.param_spec` does
    (``"layers/0/w"``). safetensors stores raw little-endian arrays and a JSON
    header, nothing executable.

    Args:
      params: the PyTree of arrays.
      path: the file to write (parents created).
      metadata: optional string pairs for the header.

    Returns:
      The path written.
    """
    from safetensors.numpy import save_file

    tensors = {
        # np.array, not np.ascontiguousarray, which turns a 0-d step into shape (1,).
        leaf_name(p): np.array(jax.device_get(leaf), order="C")
        for p, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=metadata)
    return path


def load_params(path: str | os.PathLike, model_config: ModelConfig, qat_config: QATConfig) -> Any:
    """Read :func:`save_params`'s file back into the model's parameter PyTree.

    Raises:
      FileNotFoundError: no such file.
      InputFileError: not a safetensors file (truncated, a pickle), named.
      ValueError: a leaf is missing, extra or of the wrong shape for this model
        (the message names the path).
      TypeError: a leaf of the wrong dtype.
    """
    tensors = read_safetensors(path, what="a run's parameters (params.safetensors)")
    spec = param_spec(model_config, qat_config)
    extra = sorted(set(tensors) - set(spec))
    if extra:
        raise ValueError(
            f"load_params: {path} holds {extra[0]!r}, not a parameter of this model; expected {list(spec)}."
        )
    n_layers = len({name.split("/")[1] for name in spec})
    layers: list[dict[str, jax.Array]] = [{} for _ in range(n_layers)]
    for name in spec:
        if name not in tensors:
            raise ValueError(f"load_params: {path} lacks {name!r}; expected {list(spec)}.")
        _, i, leaf = name.split("/")
        layers[int(i)][leaf] = jnp.asarray(tensors[name])
    params = {"layers": tuple(layers)}
    check_params(params, spec)
    return params


def save_run(result: TrainResult, out_dir: str | os.PathLike, *, splits: Splits | None = None) -> Path:
    """Write a :class:`TrainResult`'s run directory (``metrics.jsonl`` is rewritten from the history).

    Files: ``config.json`` (the recipe, the model, the QAT policy, the data),
    ``metrics.jsonl`` (one record per epoch), ``params.safetensors`` (the best
    parameters), ``normalizer.json`` (the training split's mean and std) and
    ``report.json`` (the test accuracy of the best parameters and how the run went).

    Returns:
      The directory.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {}
    if splits is not None:
        data = {
            "name": splits.train.name.removesuffix("[train]"),
            "split_seed": splits.seed,
            "n_train": len(splits.train),
            "n_val": len(splits.val),
            "n_test": len(splits.test),
            "feature_order": splits.train.feature_order,
        }
    config = {
        "format": FORMAT,
        "train_config": result.config.to_dict(),
        "model_config": _model_to_dict(result.model_config),
        "qat_config": {"name": result.qat_config.name, "describe": result.qat_config.describe()},
        "data": data,
        "params_file": PARAMS_FILE,
        "dtypes": {"params": "float32", "features": "float32", "labels": "int32"},
    }
    _write_json(out / CONFIG_FILE, config)
    (out / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in result.history), encoding="utf-8")
    save_params(
        result.params,
        out / PARAMS_FILE,
        metadata={"format": FORMAT, "preset": result.config.preset, "best_epoch": str(result.best_epoch)},
    )
    _write_json(out / NORMALIZER_FILE, result.normalizer.to_dict())
    _write_json(out / REPORT_FILE, result.report())
    return out


def load_run(run_dir: str | os.PathLike) -> Run:
    """Read a run directory written by :func:`save_run` (or ``stejax train``).

    Raises:
      FileNotFoundError: a file is missing (the message names it).
      InputFileError: a file that is not what it should be (broken JSON, a
        truncated or pickled params.safetensors), or an artifact directory
        given for a run directory; the message names the file.
      ValueError: an unknown format or an invalid file.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise InputFileError(f"{root}: not a directory; expected a run directory (stejax train --out DIR).")
    if not (root / CONFIG_FILE).exists() and (root / "manifest.json").exists():
        raise InputFileError(
            f"{root}: an artifact directory (it holds manifest.json), not a run directory; expected the directory "
            "`stejax train --out` writes (config.json, params.safetensors, normalizer.json). Artifacts are read by "
            "`stejax artifact verify`, `stejax regress` and `stejax serve --artifact`."
        )
    config = read_json(root / CONFIG_FILE, what="a run's config.json (stejax train --out DIR writes it)")
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        got = config.get("format") if isinstance(config, dict) else type(config).__name__
        raise InputFileError(f"{root / CONFIG_FILE}: format {got!r}; expected {FORMAT!r}.")
    try:
        train_config = TrainConfig.from_dict(config["train_config"])
        model_config = _model_from_dict(config["model_config"])
    except (KeyError, TypeError, ValueError) as e:
        why = f"{type(e).__name__}: {e}"
        raise InputFileError(f"{root / CONFIG_FILE}: not a valid run configuration ({why}).") from None
    qat_config = train_config.qat_config()
    normalizer_file = root / NORMALIZER_FILE
    normalizer_data = read_json(normalizer_file, what="the run's normalizer (the training split's mean and std)")
    try:
        normalizer = Normalizer.from_dict(normalizer_data)
    except (KeyError, TypeError, ValueError) as e:
        raise InputFileError(f"{normalizer_file}: not a normalizer ({type(e).__name__}: {e}).") from None
    return Run(
        config=train_config,
        model_config=model_config,
        qat_config=qat_config,
        params=load_params(root / PARAMS_FILE, model_config, qat_config),
        normalizer=normalizer,
        metrics=tuple(read_json_lines(root / METRICS_FILE, what="the run's per-epoch metrics")),
        report=read_json(root / REPORT_FILE, what="the run's report.json"),
        data=config.get("data", {}),
    )


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
