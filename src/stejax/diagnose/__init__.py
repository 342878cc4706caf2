"""Fault localisation for a training pipeline: the first stage that goes wrong, and why.

:func:`diagnose` takes a :class:`Pipeline` (parameters, one batch, a key, and pure
``forward``, ``loss`` and ``update`` functions) and runs it on a minimal slice of
the batch, stage by stage: the data, the key stream, shapes and dtypes, then the
eager forward, loss, gradients and update (jit disabled), then with ``jit``,
``vmap`` and ``grad`` added back one at a time, each compared leaf by leaf with
the eager result at stated tolerances (:data:`TOLERANCES`). The :class:`Report`
names the first failing stage and the reason; a failure with a NaN or infinity
is re-run under ``jax.debug_nans`` to name the operation that made it.
:func:`pipeline_from_run` builds the reference pipeline of a run directory.
"""

from stejax.diagnose._compare import TOLERANCES as TOLERANCES
from stejax.diagnose._diagnose import MAX_GRAD_NORM as MAX_GRAD_NORM
from stejax.diagnose._diagnose import diagnose as diagnose
from stejax.diagnose._pipeline import Pipeline as Pipeline
from stejax.diagnose._pipeline import load_pipeline as load_pipeline
from stejax.diagnose._pipeline import pipeline_from_run as pipeline_from_run
from stejax.diagnose._report import STAGES as STAGES
from stejax.diagnose._report import Report as Report
from stejax.diagnose._report import StageResult as StageResult
