"""What a training run returns: the result record that the loop makes and the run directory stores."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from stejax.data import Normalizer
from stejax.model import ModelConfig, QATConfig
from stejax.train._config import TrainConfig

__all__ = ["KeyCheck", "TrainResult"]


@dataclasses.dataclass(frozen=True)
class KeyCheck:
    """What ``train(..., debug_keys=n)`` proved about the key stream.

    Attributes:
      steps: how many steps ran eagerly under :func:`stejax.keys.checked`.
      keys_recorded: how many distinct keys the ledger saw (made or consumed).
      unused: where each key that was made but never consumed in the checked part
        was made. The loop carries exactly one key forward, so this has one entry
        when every other subkey was consumed.
    """

    steps: int
    keys_recorded: int
    unused: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"steps": self.steps, "keys_recorded": self.keys_recorded, "unused": list(self.unused)}


@dataclasses.dataclass(frozen=True, eq=False)
class TrainResult:
    """The outcome of :func:`train`.

    Attributes:
      config: the recipe.
      model_config: the model it built.
      qat_config: the QAT configuration.
      params: the best parameters (highest validation accuracy; on ties the lower
        validation loss), float32 leaves.
      normalizer: the feature standardisation fitted on the training split.
      history: one record per epoch, as written to ``metrics.jsonl``.
      best_epoch: the 1-based epoch of ``params``.
      best_val_accuracy: the validation accuracy of ``params``.
      test_loss: the test cross-entropy of ``params`` (computed once, at the end).
      test_accuracy: the test accuracy of ``params``, a fraction.
      n_test: the number of test examples.
      stopped_early: whether patience ended the run before ``config.epochs``.
      seconds: the wall time of the whole run.
      key_check: the key ledger's findings with ``debug_keys``, else None.
      devices: the number of devices the batch was split over (1 without a mesh).
      param_sharding: ``"replicated"`` or ``"sharded"`` with a mesh, else None.
    """

    config: TrainConfig
    model_config: ModelConfig
    qat_config: QATConfig
    params: Any
    normalizer: Normalizer
    history: tuple[dict[str, Any], ...]
    best_epoch: int
    best_val_accuracy: float
    test_loss: float
    test_accuracy: float
    n_test: int
    stopped_early: bool
    seconds: float
    key_check: KeyCheck | None = None
    devices: int = 1
    param_sharding: str | None = None

    def report(self) -> dict[str, Any]:
        """The run's ``report.json`` content."""
        return {
            "preset": self.config.preset,
            "product": self.config.product,
            "seed": self.config.seed,
            "test_accuracy": self.test_accuracy,
            "test_loss": self.test_loss,
            "n_test": self.n_test,
            "best_epoch": self.best_epoch,
            "best_val_accuracy": self.best_val_accuracy,
            "epochs_run": len(self.history),
            "stopped_early": self.stopped_early,
            "seconds": self.seconds,
            "key_check": None if self.key_check is None else self.key_check.to_dict(),
            "devices": self.devices,
            "processes": jax.process_count(),
            "param_sharding": self.param_sharding,
        }
