"""diagnose: run a pipeline stage by stage, eager first, then add jit, vmap and grad back one at a time."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from stejax import keys
from stejax.diagnose._compare import TOLERANCES, compare_trees, first_nonfinite
from stejax.diagnose._key_origin import constant_keys
from stejax.diagnose._nans import nan_origin
from stejax.diagnose._pipeline import Pipeline
from stejax.diagnose._report import FAILED, NOT_RUN, PASSED, STAGES, Report, StageResult

__all__ = ["MAX_GRAD_NORM", "diagnose"]

# How many identical replicas the vmap and grad stages map over.
_REPLICAS = 2

_WHAT = {
    "data": "the batch: a pair (inputs, labels), every input finite, labels within the classes",
    "keys": (
        "the key stream: forward and loss run eagerly under stejax.keys.checked(); no key consumed twice; "
        "traced, no key made from constants (every key comes from the pipeline's key)"
    ),
    "shapes": "shapes and dtypes against the contract: inputs, labels, logits (N, n_classes), a scalar loss",
    "forward": "eager forward (jit disabled): it runs and the logits are finite",
    "loss": "eager loss: it runs and the value is finite",
    "gradients": (
        "eager jax.grad of the loss: finite, global norm within max_grad_norm * max(1, parameter norm), "
        "the same tree, shapes and dtypes as the parameters"
    ),
    "update": "eager update(params, grads): finite, the same tree, shapes and dtypes as the parameters",
    "jit": "jax.jit of forward, loss and update against the eager results, leaf by leaf",
    "vmap": f"jax.jit(jax.vmap(...)) of forward, loss and update over {_REPLICAS} identical replicas",
    "grad": "jax.jit(jax.grad(loss)) and jax.jit(jax.vmap(jax.grad(loss))) against the eager gradient",
}


@dataclasses.dataclass
class _Outcome:
    ok: bool
    why: str
    rerun: Callable[[], Any] | None = None  # the failing computation, to re-run under debug_nans


class _State:
    """What one diagnose run has computed so far (private, filled stage by stage)."""

    def __init__(self, pipeline: Pipeline, examples: int, max_grad_norm: float):
        self.pipeline = pipeline
        self.examples = examples
        self.max_grad_norm = max_grad_norm
        self.x: Any = None
        self.y: Any = None
        self.k_forward: jax.Array | None = None
        self.k_loss: jax.Array | None = None
        self.logits: Any = None
        self.loss_value: Any = None
        self.forward_error: BaseException | None = None
        self.loss_error: BaseException | None = None
        self.grads: Any = None
        self.new_params: Any = None

    # The pipeline's functions with positional keys, for jax transformations.
    def forward(self, params, x, key):
        return self.pipeline.forward(params, x, key=key)

    def loss(self, params, x, y, key):
        return self.pipeline.loss(params, (x, y), key=key)

    def update(self, params, grads):
        return self.pipeline.update(params, grads)


# The gradient's global L2 norm may be at most this many times max(1, the
# parameters' global L2 norm). A healthy step's gradient is within a few orders of
# magnitude of the parameters; 1e6 times them is an explosion that a step of any
# usual learning rate turns into garbage parameters, while it is still finite.
MAX_GRAD_NORM = 1e6


def diagnose(pipeline: Pipeline, *, examples: int = 2, max_grad_norm: float = MAX_GRAD_NORM) -> Report:
    """Find the first stage at which a training pipeline goes wrong.

    The stages run in this order on the first ``examples`` examples of the batch
    (the whole batch for the data check), each only when all before it passed:

    ``data``
      the batch is a pair, every input is finite, the labels are within the
      contract's classes;
    ``keys``
      ``pipeline.key`` is a typed key; forward and loss run eagerly (jit disabled)
      under :func:`stejax.keys.checked`, whose ledger and JAX's own key-reuse check
      refuse any key consumed twice; and forward and loss, traced with the
      pipeline's keys, make no key from constants (a ``random_seed`` or
      ``random_wrap`` whose operands depend on no argument, such as
      ``jax.random.key(0)`` inside forward, or a key closed over from outside):
      keys must come from the pipeline's key;
    ``shapes``
      inputs and labels against the contract (:class:`stejax.model.InputContract`,
      or the first example's shape and dtype), logits ``(N, n_classes)`` and a
      floating scalar loss;
    ``forward``, ``loss``, ``gradients``, ``update``
      the eager results (``jax.disable_jit``) are finite, and the gradient and the
      updated parameters have the tree structure, shapes and dtypes of the
      parameters; the gradient's global L2 norm is at most
      ``max_grad_norm * max(1, global L2 norm of the parameters)`` (a finite
      explosion fails too, naming the norm, the bound and the leaf with the
      largest norm);
    ``jit``, ``vmap``, ``grad``
      the transformations are added back one at a time (``jit``; then ``jit`` of
      ``vmap`` over identical replicas; then ``jit`` of ``grad`` and of ``vmap`` of
      ``grad``), and every output is compared with the eager result: the tree
      structure, each leaf's shape and dtype, and its values within
      :data:`stejax.diagnose.TOLERANCES` for its dtype (integers and keys exactly).

    The stage that fails first is named in :attr:`Report.first_failure`, with the
    reason. When its failure involves a NaN or an infinity the stage is run again
    under ``jax.debug_nans`` (and ``jax.debug_infs``) to name the operation that
    produced the first one. Nothing is masked and no tolerance is relaxed: a
    difference is reported as found.

    Args:
      pipeline: the :class:`Pipeline`.
      examples: how many examples of the batch the stages run on, >= 1 (default 2).
      max_grad_norm: the bound on the gradient's global norm, relative to
        ``max(1, global norm of the parameters)``, > 0 (default
        :data:`MAX_GRAD_NORM`, 1e6).

    Returns:
      The :class:`Report`.

    Example:
      >>> import jax, jax.numpy as jnp, numpy as np
      >>> from stejax.diagnose import Pipeline, diagnose
      >>> def forward(p, x, *, key):
      ...     return x @ p["w"]
      >>> def loss(p, batch, *, key):
      ...     x, y = batch
      ...     logits = forward(p, x, key=key)
      ...     return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))
      >>> def update(p, g):
      ...     return jax.tree.map(lambda a, b: a - 0.1 * b, p, g)
      >>> batch = (np.ones((4, 3), np.float32), np.array([0, 1, 0, 1], np.int32))
      >>> p = {"w": jnp.zeros((3, 2))}
      >>> report = diagnose(Pipeline(p, batch, jax.random.key(0), forward, loss, update))
      >>> report.first_failure is None
      True
    """
    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 1:
        raise ValueError(f"diagnose: examples must be an int >= 1; got {examples!r}.")
    if not isinstance(pipeline, Pipeline):
        raise TypeError(f"diagnose: expected a stejax.diagnose.Pipeline; got {type(pipeline).__name__}.")
    if isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, int | float) or not max_grad_norm > 0:
        raise ValueError(f"diagnose: max_grad_norm must be a number > 0; got {max_grad_norm!r}.")
    state = _State(pipeline, examples, float(max_grad_norm))
    checks = {
        "data": _data,
        "keys": _keys,
        "shapes": _shapes,
        "forward": _forward,
        "loss": _loss,
        "gradients": _gradients,
        "update": _update,
        "jit": _jit,
        "vmap": _vmap,
        "grad": _grad,
    }
    results: list[StageResult] = []
    first: str | None = None
    why, origin = "", None
    for stage in STAGES:
        if first is not None:
            results.append(StageResult(stage, NOT_RUN, _WHAT[stage], f"not run: stage '{first}' failed first"))
            continue
        started = time.perf_counter()
        with jax.debug_key_reuse(False):
            outcome = _guarded(stage, checks[stage], state)
        seconds = time.perf_counter() - started
        results.append(StageResult(stage, PASSED if outcome.ok else FAILED, _WHAT[stage], outcome.why, seconds))
        if not outcome.ok:
            first, why = stage, outcome.why
            if outcome.rerun is not None:
                with jax.debug_key_reuse(False):
                    origin = nan_origin(outcome.rerun)
    n = 0 if state.x is None else int(np.shape(state.x)[0])
    return Report(
        pipeline=pipeline.name,
        first_failure=first,
        why=why,
        nan_origin=origin,
        stages=tuple(results),
        examples=n,
        tolerances={k: dict(v) for k, v in TOLERANCES.items()},
    )


def _guarded(stage: str, check: Callable[[_State], _Outcome], state: _State) -> _Outcome:
    try:
        return check(state)
    except Exception as error:  # a stage that cannot even run has failed, and says why
        return _Outcome(False, f"the {stage} check raised {_error(error)}")


def _error(error: BaseException) -> str:
    text = " ".join(str(error).split())
    if len(text) > 600:
        text = text[:600] + " ..."
    return f"{type(error).__name__}: {text}"


# ----------------------------------------------------------------------------- data


def _data(state: _State) -> _Outcome:
    batch = state.pipeline.batch
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        return _Outcome(False, f"the batch must be a pair (inputs, labels); got {type(batch).__name__}.")
    inputs, labels = (np.asarray(b) for b in batch)
    for name, a in (("inputs", inputs), ("labels", labels)):
        if not (np.issubdtype(a.dtype, np.number) or np.issubdtype(a.dtype, np.bool_)):
            return _Outcome(False, f"{name} are not numbers: dtype {a.dtype}.")
        if a.ndim == 0 or a.shape[0] == 0:
            return _Outcome(False, f"{name} need a leading batch axis with at least one example; got shape {a.shape}.")
    for name, a in (("inputs", inputs), ("labels", labels)):
        if np.issubdtype(a.dtype, np.inexact):
            finite = np.isfinite(a.astype(np.float64))
            if not finite.all():
                bad = np.argwhere(~finite)
                row, rest = int(bad[0][0]), tuple(int(v) for v in bad[0][1:])
                rows = int((~finite.reshape(a.shape[0], -1).all(axis=1)).sum())
                place = f"example {row}" + (f", position {rest}" if rest else "")
                return _Outcome(
                    False,
                    f"{name} hold {len(bad)} non-finite value(s) in {rows} example(s); the first: "
                    f"{a[tuple(bad[0])]!r} at {place}. The batch is non-finite before any operation of the "
                    "pipeline runs: look at loading and preprocessing (a division by a zero standard "
                    "deviation, a missing value read as NaN).",
                )
    contract = state.pipeline.contract
    if contract is not None and np.issubdtype(labels.dtype, np.integer):
        out_of_range = (labels < 0) | (labels >= contract.n_classes)
        if out_of_range.any():
            i = tuple(int(v) for v in np.argwhere(out_of_range)[0])
            return _Outcome(False, f"labels must be in [0, {contract.n_classes}); got {labels[i]} at index {i}.")
    n = min(state.examples, inputs.shape[0])
    state.x, state.y = jnp.asarray(inputs[:n]), jnp.asarray(labels[:n])
    return _Outcome(True, f"{inputs.shape[0]} example(s), all finite; the stages below run on the first {n}.")


# ----------------------------------------------------------------------------- keys


def _keys(state: _State) -> _Outcome:
    try:
        key = keys.check_key(state.pipeline.key, what="pipeline.key")
    except TypeError as error:
        return _Outcome(False, str(error))
    if key.shape != ():
        return _Outcome(False, f"pipeline.key must be one key of shape (); got shape {key.shape}.")
    state.k_forward, state.k_loss = jax.random.split(key)
    params, x, y = state.pipeline.params, state.x, state.y
    stopped: list[str] = []
    with jax.disable_jit(), keys.checked() as ledger:
        try:
            state.logits = jax.block_until_ready(state.forward(params, x, state.k_forward))
        except jax.errors.KeyReuseError as error:
            return _reuse("forward", error)
        except Exception as error:  # examined at its own stage, once the keys are cleared
            state.forward_error = error
            stopped.append(f"forward stopped with {type(error).__name__}")
        try:
            state.loss_value = jax.block_until_ready(state.loss(params, x, y, state.k_loss))
        except jax.errors.KeyReuseError as error:
            return _reuse("loss", error)
        except Exception as error:
            state.loss_error = error
            stopped.append(f"loss stopped with {type(error).__name__}")
    made = _made_keys(state)
    if made:
        return made
    why = (
        f"no key consumed twice in eager forward and loss ({len(ledger)} key(s) in stejax's ledger; "
        "JAX's key-reuse check on); no key made from constants"
    )
    if stopped:
        why += f"; proven only up to where {' and '.join(stopped)} (examined at its stage below)"
    return _Outcome(True, why + ".")


def _made_keys(state: _State) -> _Outcome | None:
    """A failure if forward or loss, traced with the pipeline's keys, builds a key from constants."""
    params, x, y = state.pipeline.params, state.x, state.y
    traced: dict[str, tuple[Callable[..., Any], tuple[Any, ...], BaseException | None]] = {
        "forward": (state.forward, (params, x, state.k_forward), state.forward_error),
        "loss": (state.loss, (params, x, y, state.k_loss), state.loss_error),
    }
    for name, (fn, args, error) in traced.items():
        if error is not None:  # it does not run: its own stage says why
            continue
        try:
            found = constant_keys(fn, *args)
        except Exception:  # it does not trace: the jit stage says why
            continue
        if found:
            return _Outcome(
                False,
                f"{name} makes its own PRNG key from constants instead of using the key it is given: "
                f"{'; '.join(found)}. Such a key draws the same randomness (the same dropout mask) at every "
                f"step; keys must come from the pipeline's key: use the `key` argument, split with "
                "stejax.keys.split for each random operation.",
            )
    return None


def _reuse(where: str, error: BaseException) -> _Outcome:
    return _Outcome(
        False,
        f"{where} consumed a PRNG key twice: {_error(error)} Two random operations on one key draw "
        "correlated (often identical) randomness. Split the key (stejax.keys.split) and give each random "
        "operation its own subkey.",
    )


# ----------------------------------------------------------------------------- shapes


def _shapes(state: _State) -> _Outcome:
    inputs, labels = (np.asarray(b) for b in state.pipeline.batch)
    contract = state.pipeline.contract
    if contract is not None:
        shape, dtype, n_classes = tuple(contract.shape), np.dtype(contract.dtype), contract.n_classes
        source = "the contract"
    else:
        shape, dtype, n_classes = inputs.shape[1:], inputs.dtype, None
        source = "the first example (no contract given)"
    want = f"a batch (N, {', '.join(map(str, shape))})" if shape else "a batch (N,)"
    if inputs.shape[1:] != shape:
        return _Outcome(
            False,
            f"inputs: {source} wants examples of shape {shape} ({want}); got a batch of shape {inputs.shape}. "
            "Reshape in preprocessing to the contract's layout.",
        )
    if inputs.dtype != dtype:
        return _Outcome(
            False,
            f"inputs: {source} wants dtype {dtype}; got {inputs.dtype}. Cast explicitly in preprocessing.",
        )
    if labels.shape != (inputs.shape[0],):
        return _Outcome(False, f"labels must have shape ({inputs.shape[0]},), one per example; got {labels.shape}.")
    if not np.issubdtype(labels.dtype, np.integer):
        return _Outcome(False, f"labels must have an integer dtype (class indices); got {labels.dtype}.")
    n = int(state.x.shape[0])
    found = [f"inputs {tuple(state.x.shape)} {state.x.dtype}, labels {tuple(state.y.shape)} {state.y.dtype}"]
    if state.logits is not None:
        logits = state.logits
        if not isinstance(logits, jax.Array | np.ndarray):
            return _Outcome(False, f"forward must return one array of logits; got {type(logits).__name__}.")
        classes = n_classes if n_classes is not None else (logits.shape[1] if logits.ndim == 2 else "C")
        if logits.ndim != 2 or logits.shape[0] != n or (n_classes is not None and logits.shape[1] != n_classes):
            return _Outcome(
                False, f"logits must have shape ({n}, {classes}) (examples, classes); got {tuple(logits.shape)}."
            )
        if not jnp.issubdtype(logits.dtype, jnp.floating):
            return _Outcome(False, f"logits must be floating point; got dtype {logits.dtype}.")
        found.append(f"logits {tuple(logits.shape)} {logits.dtype}")
    if state.loss_value is not None:
        value = state.loss_value
        if not isinstance(value, jax.Array | np.ndarray):
            return _Outcome(
                False,
                f"loss must return a JAX or NumPy array scalar (shape (), a floating dtype); got a "
                f"{type(value).__module__}.{type(value).__qualname__} ({value!r:.80}): build the loss with jnp "
                "so that jax.grad can differentiate it.",
            )
        if np.shape(value) != ():
            return _Outcome(False, f"loss must return a scalar array of shape (); got shape {np.shape(value)}.")
        if not jnp.issubdtype(value.dtype, jnp.floating):
            return _Outcome(False, f"loss must be floating point; got dtype {value.dtype}.")
        found.append(f"loss () {value.dtype}")
    return _Outcome(True, "; ".join(found) + f", as {source} says.")


# ----------------------------------------------------------------------------- the eager pipeline


def _forward(state: _State) -> _Outcome:
    params, x, key = state.pipeline.params, state.x, state.k_forward

    def rerun():
        with jax.disable_jit():
            return state.forward(params, x, key)

    invalid = _non_positive_quantiser_params(params)
    if invalid:
        return _Outcome(
            False,
            f"the parameters hold a non-positive quantiser step, scale or clipping level: {invalid}. A "
            "quantiser refuses it when called eagerly (ValueError) and, under jit, computes plausible wrong "
            "values (zeros, a mirrored grid); it must be > 0: initialise it positive, and if training drove "
            "it there, lower the learning rate or keep it positive (a floor such as max(step, 1e-8)).",
        )
    if state.forward_error is not None:
        return _Outcome(False, f"forward raised {_error(state.forward_error)}", rerun)
    bad = first_nonfinite(state.logits, what="logits")
    if bad:
        return _Outcome(False, f"{bad}{_params_note(params)}.", rerun)
    return _Outcome(True, f"logits {tuple(state.logits.shape)} finite, in [{_range(state.logits)}].")


def _loss(state: _State) -> _Outcome:
    params, x, y, key = state.pipeline.params, state.x, state.y, state.k_loss

    def rerun():
        with jax.disable_jit():
            return state.loss(params, x, y, key)

    if state.loss_error is not None:
        return _Outcome(False, f"loss raised {_error(state.loss_error)}", rerun)
    if not np.isfinite(float(state.loss_value)):
        return _Outcome(
            False,
            f"the loss is {float(state.loss_value)!r} from finite logits: the loss function itself makes the "
            "non-finite value (a log of zero, a division by zero, an overflowing exp); write it in a stable "
            "form (log-sum-exp, log_softmax).",
            rerun,
        )
    return _Outcome(True, f"loss = {float(state.loss_value):.6g}.")


def _gradients(state: _State) -> _Outcome:
    params, x, y, key = state.pipeline.params, state.x, state.y, state.k_loss

    def grads():
        with jax.disable_jit():
            return jax.grad(state.loss)(params, x, y, key)

    try:
        state.grads = jax.block_until_ready(grads())
    except Exception as error:
        return _Outcome(False, f"jax.grad of the loss raised {_error(error)}")
    mismatch = _same_layout(state.grads, params, what="grads", against="the parameters")
    if mismatch:
        return _Outcome(False, mismatch)
    bad = first_nonfinite(state.grads, what="grads")
    if bad:
        return _Outcome(
            False,
            f"{bad}, while the loss ({float(state.loss_value):.6g}) is finite: the backward pass overflows "
            "or divides by zero (an exploding surrogate derivative, sqrt or log at 0).",
            grads,
        )
    leaf_norms = [
        (jax.tree_util.keystr(path), _norm(g)) for path, g in jax.tree_util.tree_flatten_with_path(state.grads)[0]
    ]
    norm = float(np.sqrt(sum(n**2 for _, n in leaf_norms)))
    params_norm = float(np.sqrt(sum(_norm(p) ** 2 for p in jax.tree.leaves(params))))
    bound = state.max_grad_norm * max(1.0, params_norm)
    if not norm <= bound:
        leaf, largest = max(leaf_norms, key=lambda item: item[1])
        return _Outcome(
            False,
            f"the gradient explodes: global norm {norm:.4g} exceeds the bound {bound:.4g} "
            f"(max_grad_norm {state.max_grad_norm:g} * max(1, parameter norm {params_norm:.4g})); the largest "
            f"leaf is grads{leaf} with norm {largest:.4g}. The loss ({float(state.loss_value):.6g}) is finite: "
            "look at the backward pass through that leaf (a surrogate derivative too steep, a division by a "
            "small value).",
        )
    return _Outcome(
        True,
        f"gradient finite, global norm {norm:.4g} within the bound {bound:.4g}; tree, shapes and dtypes as the "
        "parameters.",
    )


def _update(state: _State) -> _Outcome:
    params, grads = state.pipeline.params, state.grads

    def rerun():
        with jax.disable_jit():
            return state.update(params, grads)

    try:
        with jax.disable_jit():
            state.new_params = jax.block_until_ready(state.update(params, grads))
    except Exception as error:
        return _Outcome(False, f"update raised {_error(error)}")
    mismatch = _same_layout(state.new_params, params, what="new params", against="the parameters it was given")
    if mismatch:
        return _Outcome(
            False,
            mismatch + " The next step would take other arrays than this one (and a jitted step would compile "
            "again); make update return each leaf in its parameter's shape and dtype.",
        )
    bad = first_nonfinite(state.new_params, what="new params")
    if bad:
        return _Outcome(False, f"{bad} after one update from finite parameters and gradients.", rerun)
    invalid = _non_positive_quantiser_params(state.new_params)
    if invalid:
        return _Outcome(
            False,
            f"one update makes a quantiser step, scale or clipping level non-positive: {invalid}. The next "
            "forward would refuse it eagerly (ValueError) and compute plausible wrong values under jit; lower "
            "the learning rate of that parameter or keep it positive (a floor such as max(step, 1e-8)).",
        )
    pairs = zip(jax.tree.leaves(state.new_params), jax.tree.leaves(params), strict=True)
    change = max([float(jnp.max(jnp.abs(a - b))) for a, b in pairs if np.size(a)] or [0.0])
    return _Outcome(True, f"new parameters finite, same tree, shapes and dtypes; largest change {change:.3g}.")


# ----------------------------------------------------------------------------- transformations


def _jit(state: _State) -> _Outcome:
    p, x, y = state.pipeline.params, state.x, state.y
    calls = {
        "forward": (lambda: jax.jit(state.forward)(p, x, state.k_forward), state.logits),
        "loss": (lambda: jax.jit(state.loss)(p, x, y, state.k_loss), state.loss_value),
        "update": (lambda: jax.jit(state.update)(p, state.grads), state.new_params),
    }
    for name, (call, eager) in calls.items():
        try:
            got = jax.block_until_ready(call())
        except Exception as error:
            return _Outcome(
                False,
                f"jit({name}) raised {_error(error)} Under jit the values are abstract: Python control flow "
                "or NumPy on them fails; use jnp, jax.lax.cond or static arguments.",
            )
        diff = compare_trees(got, eager, what=f"jit({name})")
        if diff:
            return _Outcome(False, diff + _purity_note(state, name), _nan_rerun(got, eager, call))
    return _Outcome(True, "jit(forward), jit(loss) and jit(update) match the eager results within the tolerances.")


def _vmap(state: _State) -> _Outcome:
    p, x, y = state.pipeline.params, state.x, state.y
    stacked = _replicate((p, x, y, state.grads))
    sp, sx, sy, sg = stacked
    calls = {
        "forward": (
            lambda: jax.jit(jax.vmap(state.forward, in_axes=(0, 0, None)))(sp, sx, state.k_forward),
            state.logits,
        ),
        "loss": (
            lambda: jax.jit(jax.vmap(state.loss, in_axes=(0, 0, 0, None)))(sp, sx, sy, state.k_loss),
            state.loss_value,
        ),
        "update": (lambda: jax.jit(jax.vmap(state.update))(sp, sg), state.new_params),
    }
    return _replicas(calls, "vmap", "jit(vmap(forward)), jit(vmap(loss)) and jit(vmap(update))")


def _grad(state: _State) -> _Outcome:
    p, x, y = state.pipeline.params, state.x, state.y
    sp, sx, sy = _replicate((p, x, y))
    grad = jax.grad(state.loss)
    try:
        got = jax.block_until_ready(jax.jit(grad)(p, x, y, state.k_loss))
    except Exception as error:
        return _Outcome(False, f"jit(grad(loss)) raised {_error(error)}")
    diff = compare_trees(got, state.grads, what="jit(grad(loss))")
    if diff:
        call = lambda: jax.jit(grad)(p, x, y, state.k_loss)  # noqa: E731
        return _Outcome(
            False,
            diff + " The eager gradient and the compiled one disagree: look at custom_jvp/custom_vjp rules and "
            "anything in the backward pass that reads Python-side state.",
            _nan_rerun(got, state.grads, call),
        )
    calls = {
        "grad(loss)": (
            lambda: jax.jit(jax.vmap(grad, in_axes=(0, 0, 0, None)))(sp, sx, sy, state.k_loss),
            state.grads,
        )
    }
    outcome = _replicas(calls, "grad", "jit(vmap(grad(loss)))")
    if outcome.ok:
        return _Outcome(True, "jit(grad(loss)) and " + outcome.why)
    return outcome


def _replicas(calls, stage: str, names: str) -> _Outcome:
    for name, (call, eager) in calls.items():
        what = f"jit(vmap({name}))"
        try:
            got = jax.block_until_ready(call())
        except Exception as error:
            return _Outcome(
                False,
                f"{what} raised {_error(error)} The function does not batch: look for code that assumes "
                "an unbatched rank, host callbacks without a vmap rule, or custom rules that do not batch.",
            )
        for r in range(_REPLICAS):
            one = jax.tree.map(lambda a, r=r: a[r], got)
            diff = compare_trees(one, eager, what=f"{what} replica {r}")
            if diff:
                return _Outcome(
                    False,
                    diff + " Identical replicas must give the eager result each: something mixes the replicas "
                    "(a reduction over the batched axis, a host callback that sees the whole batch).",
                    _nan_rerun(one, eager, call),
                )
    return _Outcome(True, f"{names} over {_REPLICAS} identical replicas match the eager results.")


# ----------------------------------------------------------------------------- helpers


def _replicate(tree: Any) -> Any:
    return jax.tree.map(lambda a: jnp.stack([jnp.asarray(a)] * _REPLICAS), tree)


def _purity_note(state: _State, name: str) -> str:
    """Whether a second eager call reproduces the first: if not, Python-side state is the cause."""
    p, x, y = state.pipeline.params, state.x, state.y
    again = {
        "forward": lambda: state.forward(p, x, state.k_forward),
        "loss": lambda: state.loss(p, x, y, state.k_loss),
        "update": lambda: state.update(p, state.grads),
    }[name]
    first = {"forward": state.logits, "loss": state.loss_value, "update": state.new_params}[name]
    try:
        with jax.disable_jit():
            second = jax.block_until_ready(again())
    except Exception:
        return ""
    if compare_trees(second, first, what=name) is None:
        return (
            f" A second eager call of {name} reproduces the first, so the compiled function computes "
            "something else than the eager one (look at code that branches on Tracer types or reads values "
            "at trace time)."
        )
    return (
        f" A second eager call of {name} differs from the first as well: {name} reads Python-side state "
        "(a counter, a global, a cache, NumPy's random state) that jit reads once, at trace time, and then "
        "freezes. Pass that state in as an argument or a key."
    )


def _nan_rerun(got: Any, eager: Any, call: Callable[[], Any]) -> Callable[[], Any] | None:
    """``call`` when the transformed result holds a NaN or inf that the eager one does not."""
    if first_nonfinite(got, what="") is not None and first_nonfinite(eager, what="") is None:
        return call
    return None


def _same_layout(tree: Any, like: Any, *, what: str, against: str) -> str | None:
    # Annotated: the return type jax declares for structure() names an extension type
    # without a stub, which mypy cannot resolve and then refuses to compare.
    want_def: jax.tree_util.PyTreeDef = jax.tree.structure(like)
    got_def: jax.tree_util.PyTreeDef = jax.tree.structure(tree)
    if want_def != got_def:
        return f"{what}: the tree structure differs from {against}: got {got_def}, expected {want_def}."
    for (path, got), want in zip(jax.tree_util.tree_flatten_with_path(tree)[0], jax.tree.leaves(like), strict=True):
        name = f"{what}{jax.tree_util.keystr(path)}"
        if np.shape(got) != np.shape(want):
            return f"{name}: shape {np.shape(got)} differs from {against}' {np.shape(want)}."
        if np.asarray(got).dtype != np.asarray(want).dtype:
            return (
                f"{name}: dtype {np.asarray(got).dtype} differs from {against}' {np.asarray(want).dtype} "
                "(a dtype change)."
            )
    return None


# Parameter names that hold a quantiser's step, scale or clipping level, which must be > 0: the
# reference model's w_step and a_step, the NNX layers' weight_/input_ step, alpha and scale.
_QUANTISER_LEAF = re.compile(r"(^|_)(step|alpha)$|^(weight|input)_scale$")


def _leaf_name(path: Any) -> str:
    """The last name in a tree path (a dict key or attribute), skipping NNX's ``value``."""
    for entry in reversed(path):
        name = getattr(entry, "key", getattr(entry, "name", None))
        if isinstance(name, str) and name not in ("value", "raw_value"):
            return name
    return ""


def _non_positive_quantiser_params(params: Any) -> str | None:
    """The first quantiser step, scale or clipping level leaf with a value <= 0, and how many, or None."""
    found = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if not _QUANTISER_LEAF.search(_leaf_name(path)):
            continue
        try:
            a = np.asarray(leaf)
            values = a.astype(np.float64).reshape(-1)
        except (TypeError, ValueError):  # not numbers (a key): not a quantiser parameter
            continue
        if (values <= 0).any():
            i = int(np.argmax(values <= 0))
            at = f"[{i}]" if a.ndim else ""
            found.append(f"params{jax.tree_util.keystr(path)}{at} = {values[i]:.6g}")
    if not found:
        return None
    more = f" (and {len(found) - 1} more leaf/leaves)" if len(found) > 1 else ""
    return found[0] + more


def _params_note(params: Any) -> str:
    bad = first_nonfinite(params, what="params")
    if bad is None:
        return ", from finite inputs and parameters"
    return f"; the parameters were non-finite before forward ran: {bad}"


def _norm(a: Any) -> float:
    """The L2 norm of one floating leaf, in float64 (a float32 sum of squares overflows near 1e19)."""
    a = np.asarray(a)
    if not np.issubdtype(a.dtype, np.inexact):
        return 0.0
    return float(np.linalg.norm(a.astype(np.float64).ravel()))


def _range(a: Any) -> str:
    a = np.asarray(a, np.float64)
    return f"{a.min():.4g}, {a.max():.4g}"
