"""Regression sets: an artifact's small fixed inputs with their outputs and loss, checked again after any change.

:func:`record` stores, beside the artifact (``ARTIFACT/regression/``), a
standard batch, a single example, all zeros, the normaliser's zero, boundary
rows on the first quantiser's ties and clip edges, and an invalid-shape input
with the error it must raise. :func:`check` recomputes them and compares with
``numpy.allclose`` at the explicit per-dtype :data:`TOLERANCES`, saying when the
backend or the jax/jaxlib version differs from the recorded one (never assuming
the same bits).
"""

from stejax.artifacts._regression import TOLERANCES as TOLERANCES
from stejax.artifacts._regression import CaseResult as CaseResult
from stejax.artifacts._regression import RegressionReport as RegressionReport
from stejax.artifacts._regression import check as check
from stejax.artifacts._regression import record as record
