"""Honest measurements: warm-up and compilation excluded, every call waited for, distributions, conditions.

:func:`run_bench` runs the suites (:data:`SUITES`): ``estimators`` (each catalog
estimator against its hand-written stop_gradient form and the fused limit),
``train`` (the jitted training step, float and each QAT preset), ``inference``
(float, fake-quantised and integer-exported forward passes) and ``peers`` (Qwix's
int8 QAT step on Flax NNX beside stejax's, when installed). Every group of
variants is timed by :func:`measure`: warm-up calls first, then interleaved
rounds with ``jax.block_until_ready``, compilations counted from
``jax.monitoring`` events; :func:`summarize` gives min, p50, p90, p99 and max,
and comparisons are ratios of variants timed together (:func:`ratio_stats`; :func:`measure_rounds` and
:func:`round_ratios` give one ratio per round, whose spread a results file's figure shows). The report records
the machine and the versions, and is written as ``bench.json``
(:func:`check_report` states its schema), ``bench.md`` and ``bench.png``.

Needs the extra ``stejax[train]`` (optax, scikit-learn; matplotlib for the plot);
the peers suite also ``stejax[peers]`` (Flax, Qwix), imported only when it runs.
"""

from stejax.bench._estimators import estimators_suite as estimators_suite
from stejax.bench._inference import inference_suite as inference_suite
from stejax.bench._machine import machine_info as machine_info
from stejax.bench._machine import versions as versions
from stejax.bench._measure import CompileCounter as CompileCounter
from stejax.bench._measure import compare as compare
from stejax.bench._measure import measure as measure
from stejax.bench._measure import measure_rounds as measure_rounds
from stejax.bench._measure import ratio_stats as ratio_stats
from stejax.bench._measure import round_ratios as round_ratios
from stejax.bench._measure import summarize as summarize
from stejax.bench._peers import peers_suite as peers_suite
from stejax.bench._report import FORMAT as FORMAT
from stejax.bench._report import check_report as check_report
from stejax.bench._report import markdown as markdown
from stejax.bench._report import write_report as write_report
from stejax.bench._run import PROTOCOL as PROTOCOL
from stejax.bench._run import SUITES as SUITES
from stejax.bench._run import BenchSettings as BenchSettings
from stejax.bench._run import run_bench as run_bench
from stejax.bench._train import train_suite as train_suite
