"""Export a trained run: integer weights, parity on the test split, the size report."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import numpy as np

from stejax.data import Splits
from stejax.export import _safetensors
from stejax.export._configs import model_config_to_dict
from stejax.export._convert import export_model
from stejax.export._model import ExportedModel, flatten_weights
from stejax.export._parity import ParityReport, ParitySet, parity
from stejax.export._size import SizeReport, size_report
from stejax.model import LayerQuant, input_contract, output_contract

__all__ = [
    "QUANTISATION_METHODS",
    "WEIGHTS_FORMAT",
    "ExportResult",
    "ParityError",
    "encode_evidence",
    "encode_weights",
    "export_run",
    "quantisation_method",
]

WEIGHTS_FORMAT = "stejax-exported-weights/1"
# How a run's quantised weights came to be: no quantisation, training through the quantisers, or a PTQ method.
QUANTISATION_METHODS = ("float", "qat", "rtn", "gptq", "awq", "smoothquant")


class ParityError(ValueError):
    """The exported model does not match the fake-quantised one; ``report`` says where."""

    def __init__(self, message: str, report: ParityReport):
        super().__init__(message)
        self.report = report


@dataclasses.dataclass(frozen=True, eq=False)
class ExportResult:
    """An exported run, ready to be written as an artifact (:func:`stejax.artifacts.save_artifact`).

    Attributes:
      model: the :class:`ExportedModel` (its ``weights`` the integer weights and scales).
      parity: the :class:`ParityReport` on the test split.
      evidence: the :class:`ParitySet` (test inputs, fake-quant logits, bounds) kept with the artifact.
      size: the :class:`SizeReport` of the weight file.
      weights_file: the weight file's bytes (safetensors).
      contract: the model contract: input and output contracts, the model config,
        the layers and every stored tensor.
      quantization: the QAT preset, its description, each layer's formats, and
        ``method``, how the quantised weights came to be (one of
        :data:`QUANTISATION_METHODS`); for a PTQ run also ``calibration`` (the
        split, rows, seed and sha256 of the row indices) and ``options``.
      training: the run's test metrics, its best epoch's record, recipe and data.
    """

    model: ExportedModel
    parity: ParityReport
    evidence: ParitySet
    size: SizeReport
    weights_file: bytes
    contract: dict[str, Any]
    quantization: dict[str, Any]
    training: dict[str, Any]


def encode_evidence(evidence: ParitySet) -> bytes:
    """``parity.safetensors``: the parity set's tensors."""
    return _safetensors.encode(evidence.tensors(), {"format": "stejax-parity/1"})


def encode_weights(model: ExportedModel) -> tuple[bytes, dict[str, str]]:
    """The weight file of ``model``: safetensors bytes, tensors in the model's table order, and its metadata."""
    metadata = {"format": WEIGHTS_FORMAT}
    leaves = flatten_weights(model.weights)
    tensors = {name: np.asarray(jax.device_get(leaves[name])) for name in model.tensors()}
    return _safetensors.encode(tensors, metadata), metadata


def model_contract(model: ExportedModel, model_config_dict: dict[str, Any], input_c, output_c) -> dict[str, Any]:
    return {
        "input": {
            "shape": list(model.input_shape),
            "dtype": "float32",
            "raw": True,
            "normalised_inside": "the training split's per-feature mean and std are applied inside the model",
            "feature_order": input_c.feature_order,
            "n_classes": model.n_classes,
        },
        "output": {
            "shape": list(output_c.shape),
            "dtype": output_c.dtype,
            "kind": output_c.kind,
            "meaning": output_c.meaning,
            "n_classes": output_c.n_classes,
        },
        "model_config": model_config_dict,
        "layers": [layer.to_dict() for layer in model.layers],
        "tensors": {
            name: {"shape": list(shape), "dtype": dtype.name, "role": role}
            for name, (shape, dtype, role) in model.tensors().items()
        },
    }


def quantisation_method(quantization: dict[str, Any]) -> str:
    """The ``method`` of a manifest's ``quantization``; an older manifest without one: ``"qat"``, or ``"float"``.

    An artifact written before the method was recorded came from a run of
    ``stejax train``: a QAT run, or a float run when its preset is ``"float"``.

    Raises:
      ValueError: a recorded method that is not one of :data:`QUANTISATION_METHODS`.

    Example:
      >>> quantisation_method({"preset": "w4a4", "method": "gptq"}), quantisation_method({"preset": "w4a4"})
      ('gptq', 'qat')
    """
    if "method" in quantization:
        method = quantization["method"]
        if method not in QUANTISATION_METHODS:
            raise ValueError(f"quantization.method is {method!r}; expected one of {list(QUANTISATION_METHODS)}")
        return method
    return "float" if quantization.get("preset") == "float" else "qat"


def export_run(
    run_dir: str | os.PathLike, *, splits: Splits | None = None, require_parity: bool = True
) -> ExportResult:
    """Export a trained QAT run (a :func:`stejax.train.save_run` directory) to integer weights.

    Weights become integer codes and float32 scales (int8; int4 and int2 packed two
    and four to a byte; binary eight to a byte; float layers stay float32 and the
    size report says so). The exported model is compared with the fake-quantised
    one on the test split (:func:`parity`), and the weight file is encoded to
    measure it against the size predicted from the formats.

    Args:
      run_dir: the run directory.
      splits: the data the run was trained on (default: the digits split by the
        run's config, checked against the sizes the run recorded).
      require_parity: raise :class:`ParityError` when parity fails (default True).

    Returns:
      An :class:`ExportResult`.

    Raises:
      ParityError: parity failed (``require_parity``); the error carries the report.
      ExportError: dequantised weights differ from the fake-quantised ones.
      ValueError: the default data does not match the run's (pass ``splits``), or
        the run was trained with integer products (``TrainConfig.product``).
    """
    from stejax.ptq import read_ptq_record
    from stejax.train import load_run, load_splits

    run = load_run(run_dir)
    if run.config.product != "fake-quant":
        raise ValueError(
            f"export_run: {run_dir} was trained with {run.config.product} products, whose dynamic absmax scales "
            "come from each input; the export takes runs with fake-quant products (stejax train --product "
            "fake-quant), whose learned LSQ steps fix the integer grids."
        )
    if splits is None:
        splits = load_splits(run.config)
        recorded = run.data
        got = {
            "name": splits.train.name.removesuffix("[train]"),
            "n_test": len(splits.test),
            "split_seed": splits.seed,
        }
        differs = [k for k in got if k in recorded and recorded[k] != got[k]]
        if differs:
            raise ValueError(
                f"export_run: {run_dir} was trained on data with {differs[0]}={recorded[differs[0]]!r}; the default "
                f"digits split has {differs[0]}={got[differs[0]]!r}. Pass that run's splits."
            )
    model = export_model(run.params, run.model_config, run.qat_config, run.normalizer)
    report, evidence = parity(
        model, run.params, run.model_config, run.qat_config, run.normalizer, splits.test.x, splits.test.y
    )
    if require_parity and not report.passed:
        raise ParityError(f"export_run: {run_dir}: {report.summary()}", report)
    weights_file, metadata = encode_weights(model)
    evidence_file = encode_evidence(evidence)
    sizes = size_report(model, weights_file, metadata, evidence_file)
    contract = model_contract(
        model,
        model_config_to_dict(run.model_config),
        input_contract(run.model_config, feature_order=run.data.get("feature_order")),
        output_contract(run.model_config),
    )
    n = len(model.layers)
    quantization = {
        "preset": run.qat_config.name,
        "qat": run.qat_config.to_dict(),
        "describe": run.qat_config.describe(),
        "layers": [
            {
                "index": i,
                "describe": run.qat_config.layer(i, n).describe(),
                "integer": layer.integer,
                "path": layer.path,
            }
            for i, layer in enumerate(model.layers)
        ],
    }
    ptq = read_ptq_record(run_dir)
    if ptq is not None:
        quantization.update(method=ptq["method"], calibration=ptq["calibration"], options=ptq["options"])
    else:
        quantised = any(run.qat_config.layer(i, n) != LayerQuant() for i in range(n))
        quantization["method"] = "qat" if quantised else "float"
    best = next((r for r in run.metrics if r.get("epoch") == run.report.get("best_epoch")), None)
    training = {
        "report": run.report,
        "best_epoch_record": best,
        "train_config": run.config.to_dict(),
        "data": run.data,
        "test_split": {"n": len(splits.test), "name": splits.test.name},
    }
    return ExportResult(
        model=model,
        parity=report,
        evidence=evidence,
        size=sizes,
        weights_file=weights_file,
        contract=contract,
        quantization=quantization,
        training=training,
    )
