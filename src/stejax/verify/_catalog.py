"""``check_estimator`` and ``check_catalog``: the contract checks driven by catalog metadata."""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import os
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import numpy as np

from stejax.estimators._entry import Entry
from stejax.estimators.catalog import CATALOG
from stejax.verify._checks import VALUE_CHECKS, DtypeRun, SharedProgram, exception_text, invalid_checks, kinds_for
from stejax.verify._inputs import Layout, cast_floating, rng_for
from stejax.verify._report import CatalogReport, Check, Report, environment
from stejax.verify._surrogate import make_subject, resolve_composition_dtypes, resolve_dtypes
from stejax.verify._tolerance import Tolerance

__all__ = ["check_catalog", "check_estimator"]


def check_estimator(
    name_or_entry: str | Entry,
    *,
    dtypes: Iterable[Any] | None = None,
    params: Mapping[str, Any] | None = None,
    composition_dtypes: str | Iterable[Any] = "widest",
    seed: int = 0,
) -> Report:
    """Run the checks of :func:`check_surrogate` on a catalog estimator, from its metadata.

    The estimator's ``fn`` is checked against its ``forward`` (the reference)
    and its ``derivative`` (or, for a non-diagonal surrogate, its ``tangent``
    map), on inputs of the shape its ``example_shape`` or ``input_rank`` gives,
    with the extra positional arrays its ``args`` make, the boundaries its
    ``boundaries(**params)`` gives, and ``key=jax.random.key(seed)`` when it
    is random. Integer and boolean inputs must raise TypeError.

    What runs where, to keep the whole catalog to seconds of compilation:

    * at the default parameters, every check in every dtype, except the
      compositions (jit, vmap, grad of vmap, vmap of grad, jacfwd against
      jacrev, scan, checkpoint), which run in the widest dtype: they test how
      the rule behaves under a transformation, which depends neither on the
      dtype nor on the parameters, and they are most of the compilation;
    * at each other point of ``entry.param_grid()``, in every dtype, the checks
      whose outcome depends on the parameters: the forward bit for bit
      (eagerly and under jit), the primal of jvp, and the tangent. These carry
      the point in their name: ``"tangent[bfloat16; bits=2]"``.

    Args:
      name_or_entry: a catalog name (``"round_ste"``) or an :class:`Entry`.
      dtypes: as for :func:`check_surrogate`.
      params: check this one parameter set (every check) instead of the grid.
      composition_dtypes: as for :func:`check_surrogate`, but ``"widest"`` by
        default.
      seed: seeds the inputs and the PRNG key.

    Returns:
      A :class:`Report` whose subject is the estimator's name.

    Raises:
      KeyError: no estimator has that name (the message lists the names).

    Example:
      >>> from stejax.verify import check_estimator
      >>> check_estimator("floor_ste", dtypes=("bfloat16",)).ok
      True
    """
    job = _Job(_entry(name_or_entry), resolve_dtypes(dtypes), params, composition_dtypes, seed)
    job.program.compile()
    return job.finish()


def check_catalog(
    *,
    dtypes: Iterable[Any] | None = None,
    names: Iterable[str] | None = None,
    composition_dtypes: str | Iterable[Any] = "widest",
    seed: int = 0,
) -> CatalogReport:
    """:func:`check_estimator` for every catalog member (or the ``names`` given), in catalog order.

    While one estimator's program compiles (in a worker thread), the next is
    traced and the previous one's checks run: on two cores this saves a third
    of the time. With more cores, up to four programs compile at once (one
    worker per two cores beyond the first, at least one), each estimator's
    program the same as alone. After its program, the worker runs the
    estimator and its reference once eagerly on the same inputs, results
    dropped, so that the single operations the eager checks run are compiled
    there too. Tracing and the checks, which read JAX's thread-local
    configuration (x64, dtype promotion), stay in the calling thread (under
    another configuration than the worker's, the warm-up only compiles
    programs the checks do not use), and the reports come in catalog order.

    Example:
      >>> from stejax.verify import check_catalog
      >>> reports = check_catalog(names=["round_ste"], dtypes=("float32",))
      >>> reports.ok, list(reports)
      (True, ['round_ste'])
    """
    dtypes = resolve_dtypes(dtypes)
    chosen = list(CATALOG) if names is None else [CATALOG[n].name for n in names]
    reports: list[Report] = []
    workers = compile_workers()
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        pending: collections.deque[tuple[_Job, concurrent.futures.Future]] = collections.deque()
        for name in chosen:
            job = _Job(CATALOG[name], dtypes, None, composition_dtypes, seed)
            pending.append((job, pool.submit(job.prepare)))
            # Keep every worker busy: finish the oldest job once more are traced than compile at once.
            if len(pending) > workers:
                done, compiling = pending.popleft()
                compiling.result()
                reports.append(done.finish())
        while pending:
            done, compiling = pending.popleft()
            compiling.result()
            reports.append(done.finish())
    env = environment(
        dtypes,
        {d.name: Tolerance.of(d).to_dict() for d in dtypes},
        seed=seed,
        composition_dtypes=[d.name for d in resolve_composition_dtypes(composition_dtypes, dtypes)],
    )
    return CatalogReport(reports=tuple(reports), environment=env)


def compile_workers(cores: int | None = None) -> int:
    """How many programs :func:`check_catalog` compiles at once: one per two cores beyond the first, 1 to 4."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(4, (cores - 1) // 2))


class _Job:
    """One estimator's checks: traced at construction, compiled apart, finished into a report."""

    def __init__(self, entry: Entry, dtypes, params: Mapping[str, Any] | None, composition_dtypes, seed: int):
        self.entry, self.dtypes, self.seed = entry, dtypes, seed
        self.composed = resolve_composition_dtypes(composition_dtypes, dtypes)
        defaults = entry.default_params()
        self.grid = [dict(params)] if params is not None else entry.param_grid()
        runs: list[DtypeRun] = []
        self.tested = []
        # Metadata that raises (boundaries, example_shape) is a failed check, not an exception.
        self.setup_checks: list[Check] = []
        for point in self.grid:
            full = params is not None or point == defaults
            label = _label(point, defaults)
            try:
                subject, layout, boundaries = _setup(entry, point, seed)
            except Exception as e:
                name = f"metadata[{label.removeprefix('; ') or 'defaults'}]"
                detail = f"the catalog entry's metadata raised {exception_text(e)}"
                self.setup_checks.append(Check(name=name, passed=False, detail=detail))
                continue
            runs += [
                DtypeRun(
                    subject,
                    layout,
                    d,
                    boundaries,
                    seed=seed,
                    label=label,
                    kinds=kinds_for(d, self.composed) if full else VALUE_CHECKS,
                )
                for d in dtypes
            ]
            self.tested.append({"params": {k: _jsonable(v) for k, v in point.items()}, "boundaries": list(boundaries)})
        self.program = SharedProgram(runs)

    def prepare(self) -> None:
        """Compile the program, then warm the eager checks' operations (:meth:`DtypeRun.warm_eager`)."""
        self.program.compile()
        for run in self.program.runs:
            run.warm_eager()

    def finish(self) -> Report:
        entry = self.entry
        checks: list[Check] = self.setup_checks + self.program.finish()
        try:
            subject, layout, _ = _setup(entry, self.grid[0], self.seed)
            invalid = _invalid_inputs(entry, layout, self.seed)
        except Exception as e:
            detail = f"the integer and boolean inputs could not be made: {exception_text(e)}"
            checks.append(Check(name="invalid", passed=False, detail=detail))
        else:
            checks += invalid_checks(subject.fn, invalid)
        env = environment(
            self.dtypes,
            {d.name: Tolerance.of(d).to_dict() for d in self.dtypes},
            seed=self.seed,
            family=entry.family,
            diff_argnums=list(entry.diff_argnums),
            composition_dtypes=[d.name for d in self.composed],
            declaration="derivative" if entry.derivative is not None else "tangent_map",
            parameter_sets=self.tested,
        )
        return Report(subject=entry.name, checks=tuple(checks), environment=env)


def _entry(name_or_entry: str | Entry) -> Entry:
    entry = CATALOG[name_or_entry] if isinstance(name_or_entry, str) else name_or_entry
    if not isinstance(entry, Entry):
        raise TypeError(f"check_estimator: expected a catalog name or an Entry; got {type(entry).__name__}.")
    return entry


def _setup(entry: Entry, params: Mapping[str, Any], seed: int):
    """The subject, layout and boundaries of one parameter set."""
    if entry.example_shape is not None:
        item_shape = tuple(int(n) for n in entry.example_shape(**params))
    else:
        item_shape = (4,) * entry.input_rank
    item_shape, params = per_example_axis(item_shape, params)
    bound = dict(params)
    if entry.random:
        bound["key"] = jax.random.key(seed)
    fn = functools.partial(entry.fn, **bound)
    reference = functools.partial(entry.forward, **bound)
    derivative = None if entry.derivative is None else functools.partial(entry.derivative, **bound)
    tangent_map = None
    if entry.tangent is not None:

        def tangent_map(args, tangents):
            return entry.tangent(*args, tangents=tuple(tangents), **bound)

    subject = make_subject(fn, reference, derivative, tangent_map, tuple(entry.diff_argnums))

    def make_rest(x_shape, dtype, rng):
        return tuple(cast_floating(a, dtype) for a in entry.example_args(rng, x_shape, dtype, params))

    boundaries = tuple(float(b) for b in entry.boundaries(**params))
    return subject, Layout(item_shape=item_shape, make_rest=make_rest), boundaries


def per_example_axis(item_shape: tuple[int, ...], params: Mapping[str, Any]):
    """The example shape and parameters for a per-channel ``axis``, counted in one example.

    The checks lay the first argument out as ``(rows, *item_shape)`` and map the
    compositions (vmap, scan) over the rows, so a channel axis must be an axis of
    one example, never the rows: ``axis=k >= 0`` is axis ``k`` of an example of
    rank at least ``k + 1``, called as the equivalent negative axis (the same
    axis of the batched input and of each row); ``axis=-k`` needs rank ``k``.
    Other parameter sets are returned unchanged.
    """
    axis = params.get("axis")
    if isinstance(axis, bool) or not isinstance(axis, int | np.integer):
        return item_shape, params
    rank = max(len(item_shape), int(axis) + 1 if axis >= 0 else -int(axis))
    item_shape = tuple(item_shape) + (4,) * (rank - len(item_shape))
    return item_shape, {**params, "axis": int(axis) - rank if axis >= 0 else int(axis)}


def _invalid_inputs(entry: Entry, layout: Layout, seed: int):
    """Integer and boolean inputs, with valid other arguments: TypeError."""
    rng = rng_for(seed, "invalid")
    shape = (2, *layout.item_shape)
    rest = layout.make_rest(shape, np.dtype(np.float32), rng)
    integers = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    # Device arrays, as a model hands them over (a transfer; converting host arrays would compile a program).
    cases = [(integers, *rest), (integers % 2 == 0, *rest)]
    return [(tuple(jax.device_put(np.asarray(a)) for a in args), TypeError) for args in cases]


def _label(point: Mapping[str, Any], defaults: Mapping[str, Any]) -> str:
    changed = [f"{k}={v!r}" for k, v in point.items() if defaults.get(k) != v]
    return "; " + ", ".join(changed) if changed else ""


def _jsonable(v: Any) -> Any:
    if isinstance(v, bool | int | float | str) or v is None:
        return v
    if isinstance(v, tuple | list):
        return [_jsonable(x) for x in v]
    return repr(v)
