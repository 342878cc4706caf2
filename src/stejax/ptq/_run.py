"""PTQ of a float run directory: calibration rows from its training split, a quantised run directory out.

The run directory written is the one ``stejax train`` writes (``config.json``,
``params.safetensors``, ...), for the form's :class:`stejax.model.QATConfig`,
plus ``ptq.json``, the record of how it was quantised; ``stejax export``
(:func:`stejax.export.export_run`) takes it as it takes a QAT run and copies
that record into the artifact's manifest. Needs the optional extra
``stejax[train]``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from stejax._files import InputFileError, read_json
from stejax.model import LayerQuant
from stejax.ptq._reference import PTQ_METHODS, quantize_params

__all__ = ["PTQ_FILE", "PTQ_FORMAT", "PTQRun", "quantize_run", "read_ptq_record"]

PTQ_FILE = "ptq.json"
PTQ_FORMAT = "stejax-ptq/1"


class PTQRun(NamedTuple):
    """What :func:`quantize_run` wrote and measured."""

    out_dir: Path  # the quantised run directory
    record: dict[str, Any]  # the content of its ptq.json
    float_test_accuracy: float  # the float run's test accuracy, as its report.json gives it
    val_accuracy: float  # the quantised model's, on the validation split
    test_accuracy: float  # the quantised model's, on the test split


def quantize_run(
    run_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    form: str,
    method: str,
    seed: int,
    calibration_rows: int = 512,
    damp: float = 0.01,
    act_order: bool = False,
) -> PTQRun:
    """Quantise a trained float run with no training, and write the quantised run directory.

    ``calibration_rows`` rows of the run's training split (standardised by the
    run's normaliser) are drawn without replacement by ``jax.random.key(seed)``
    and given to :func:`stejax.ptq.quantize_params` with ``form`` and
    ``method``. The quantised model is evaluated on the validation and test
    splits; its run directory keeps the float run's recipe with the form's
    QAT configuration (``preset`` its name, fake-quant products), no epochs,
    and ``ptq.json``: the method, the form, the calibration (split, rows, seed,
    sha256 of the row indices), the options, the seconds taken and what was
    done to each layer.

    Args:
      run_dir: a float run (``stejax train --preset float --out DIR``).
      out_dir: the run directory to write; it must not exist.
      form: ``"w<b>a<c>"`` (:func:`stejax.ptq.form_config`).
      method: ``"rtn"``, ``"gptq"``, ``"awq"`` or ``"smoothquant"``.
      seed: the seed of the calibration rows' draw, >= 0.
      calibration_rows: how many training rows calibrate (default 512).
      damp: GPTQ's dampening.
      act_order: GPTQ in decreasing Hessian diagonal.

    Returns:
      A :class:`PTQRun`.

    Raises:
      FileExistsError: ``out_dir`` exists.
      FileNotFoundError, InputFileError: ``run_dir`` is not a readable run directory.
      ValueError: a run that is not float (the message names its configuration),
        data that is not the run's, more calibration rows than the training split
        holds, or as :func:`stejax.ptq.quantize_params` raises.
    """
    from stejax.train import TrainConfig, TrainResult, evaluate, load_run, load_splits, save_run

    out = Path(out_dir)
    if out.exists() or out.is_symlink():
        raise FileExistsError(f"quantize_run: {out} exists; a run directory is never overwritten.")
    if method not in PTQ_METHODS:
        raise ValueError(f"quantize_run: method must be one of {list(PTQ_METHODS)}; got {method!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"quantize_run: seed must be an int >= 0; got {seed!r}.")
    run = load_run(run_dir)
    n = run.model_config.n_layers
    quantised = [i for i in range(n) if run.qat_config.layer(i, n) != LayerQuant()]
    if quantised:
        raise ValueError(
            f"quantize_run: PTQ starts from a float run (stejax train --preset float); {run_dir} is a "
            f"{run.qat_config.name} run, whose layer {quantised[0]} is quantised "
            f"({run.qat_config.layer(quantised[0], n).describe()})."
        )
    splits = load_splits(run.config)
    recorded = {k: run.data[k] for k in ("n_train", "n_test", "split_seed") if k in run.data}
    got = {"n_train": len(splits.train), "n_test": len(splits.test), "split_seed": splits.seed}
    differs = [k for k in recorded if recorded[k] != got[k]]
    if differs:
        raise ValueError(
            f"quantize_run: {run_dir} was trained on data with {differs[0]}={recorded[differs[0]]!r}; the digits "
            f"split of its recipe has {differs[0]}={got[differs[0]]!r}."
        )
    n_train = len(splits.train)
    if isinstance(calibration_rows, bool) or not isinstance(calibration_rows, int) or not 1 <= calibration_rows:
        raise ValueError(f"quantize_run: calibration_rows must be a positive int; got {calibration_rows!r}.")
    if calibration_rows > n_train:
        raise ValueError(
            f"quantize_run: calibration_rows={calibration_rows} is more than the {n_train} rows of the training split."
        )
    rows = np.sort(np.asarray(jax.random.permutation(jax.random.key(seed), n_train)[:calibration_rows]))
    features = np.asarray(run.normalizer.apply(splits.train.x[rows]), np.float32)
    start = time.perf_counter()
    result = quantize_params(
        run.params, features, model_config=run.model_config, form=form, method=method, damp=damp, act_order=act_order
    )
    jax.block_until_ready(result.params)
    seconds = time.perf_counter() - start
    qat = result.qat_config

    def scored(split: Any) -> tuple[float, float]:
        x = np.asarray(run.normalizer.apply(split.x), np.float32)
        return evaluate(result.params, x, split.y, model_config=run.model_config, qat_config=qat)

    _, val_accuracy = scored(splits.val)
    test_loss, test_accuracy = scored(splits.test)
    config = dataclasses.replace(run.config, preset=qat.name, qat=qat, product="fake-quant")
    assert isinstance(config, TrainConfig)
    save_run(
        TrainResult(
            config=config,
            model_config=run.model_config,
            qat_config=qat,
            params=result.params,
            normalizer=run.normalizer,
            history=(),
            best_epoch=0,
            best_val_accuracy=val_accuracy,
            test_loss=test_loss,
            test_accuracy=test_accuracy,
            n_test=len(splits.test),
            stopped_early=False,
            seconds=seconds,
        ),
        out,
        splits=splits,
    )
    record = {
        "format": PTQ_FORMAT,
        "method": method,
        "form": form,
        "qat_config": qat.name,
        "calibration": {
            "split": "train",
            "rows": calibration_rows,
            "seed": seed,
            "draw": "jax.random.permutation(jax.random.key(seed), n_train)[:rows], sorted",
            "indices_sha256": hashlib.sha256(rows.astype("<i8").tobytes()).hexdigest(),
        },
        "options": {"damp": damp, "act_order": act_order} if method == "gptq" else {},
        "seconds": seconds,
        "source": {"run": str(run_dir), "test_accuracy": run.report.get("test_accuracy")},
        "layers": [_json_ready(r) for r in result.layers],
    }
    (out / PTQ_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    float_accuracy = run.report.get("test_accuracy")
    float_accuracy = float("nan") if float_accuracy is None else float(float_accuracy)
    return PTQRun(out, record, float_accuracy, val_accuracy, test_accuracy)


def read_ptq_record(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """A run directory's ``ptq.json`` (:func:`quantize_run`), or None when the run was not quantised by PTQ.

    Raises:
      InputFileError: a ``ptq.json`` that is not JSON, of another format, or
        with a method that is not one of :data:`stejax.ptq.PTQ_METHODS`; the
        message names the file.
    """
    path = Path(run_dir) / PTQ_FILE
    if not path.exists():
        return None
    record = read_json(path, what="a PTQ record (stejax ptq writes it)")
    if not isinstance(record, dict) or record.get("format") != PTQ_FORMAT:
        got = record.get("format") if isinstance(record, dict) else type(record).__name__
        raise InputFileError(f"{path}: format {got!r}; expected {PTQ_FORMAT!r}.")
    if record.get("method") not in PTQ_METHODS:
        raise InputFileError(f"{path}: method {record.get('method')!r}; expected one of {list(PTQ_METHODS)}.")
    return record


def _json_ready(value: Any) -> Any:
    """Python numbers for JAX and NumPy scalars in a layer's record."""
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (np.generic, jax.Array)):
        return np.asarray(value).item()
    return value
