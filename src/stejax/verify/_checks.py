"""The contract checks, run per dtype on generated inputs.

Every composition is checked the same way: the function, the reference and
the declared derivative (or tangent map) go through the same transformation,
and the transformed function's value, JVP and VJP are compared with the
transformed reference (bit for bit) and the transformed declaration. A rule
that behaves differently under a transformation (it reads the rank, converts
to NumPy, casts) then disagrees with its own declaration there.
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from stejax.verify import _compare as cmp
from stejax.verify._compare import CheckFailed, Expected
from stejax.verify._inputs import Layout, few_bit_values, finfo, is_floating_dtype, make_values, rng_for
from stejax.verify._report import Check
from stejax.verify._tolerance import Tolerance

CHECK_KINDS = (
    "forward_bitwise",
    "jvp_primal",
    "tangent",
    "linearity",
    "tangent_structure",
    "adjoint",
    "grad",
    "jit",
    "vmap",
    "grad_of_vmap",
    "vmap_of_grad",
    "jacfwd_jacrev",
    "scan",
    "checkpoint",
)
# The checks that transform fn (the plumbing of the rule rather than its numbers).
COMPOSITION_CHECKS = ("jit", "vmap", "grad_of_vmap", "vmap_of_grad", "jacfwd_jacrev", "scan", "checkpoint")
# The checks whose outcome depends on the values of static parameters.
VALUE_CHECKS = ("forward_bitwise", "jvp_primal", "tangent")


def kinds_for(dtype: np.dtype, composition_dtypes: Sequence[np.dtype], kinds: Sequence[str] = CHECK_KINDS):
    """``kinds`` without the compositions for a dtype not among ``composition_dtypes``."""
    if dtype in composition_dtypes:
        return tuple(kinds)
    return tuple(k for k in kinds if k not in COMPOSITION_CHECKS)


# Linearity coefficients: with five-bit tangents, 2 t1 - t2 / 2 is exact in every dtype.
_A, _B = 2.0, -0.5
# The Python loop that vmap is compared with runs over at most this many rows.
_LOOP_ROWS = 3
# The Jacobians are taken on at most this many elements of the first argument.
_JAC_ELEMENTS = 32


@dataclasses.dataclass(frozen=True)
class Subject:
    """What is checked, as functions of the positional arguments.

    Attributes:
      fn: the function under test.
      reference: the exact forward function.
      partials: ``partials(*args)``, the declared partials broadcast to the
        output's shape (a tuple, one per differentiable argument), or None.
      tangent_map: ``tangent_map(args, tangents)``, the declared output tangent,
        or None.
      diff_argnums: the differentiable positional arguments.
    """

    fn: Callable[..., Any]
    reference: Callable[..., Any]
    partials: Callable[..., tuple[Any, ...]] | None
    tangent_map: Callable[..., Any] | None
    diff_argnums: tuple[int, ...]


def declared_partials(derivative: Callable[..., Any], reference: Callable[..., Any], n: int):
    """The declared derivative as a tuple of ``n`` partials broadcast to the reference's output shape."""

    def partials(*args):
        d = derivative(*args)
        parts = tuple(d) if isinstance(d, tuple | list) else (d,)
        if len(parts) != n:
            raise CheckFailed(
                f"the declared derivative returned {len(parts)} partial(s); the function has "
                f"{n} differentiable argument(s)."
            )
        shape = jax.eval_shape(reference, *args).shape
        return tuple(jnp.broadcast_to(jnp.asarray(p), shape) for p in parts)

    return partials


# --- evaluation: value, JVP, VJP and the declaration, traceable --------------------------------


def _merge(args, diff_argnums, diff_values):
    out = list(args)
    for i, v in zip(diff_argnums, diff_values, strict=True):
        out[i] = v
    return tuple(out)


def _zero_tangent(a):
    if is_floating_dtype(jnp.result_type(a)):
        return jnp.zeros_like(a)
    return np.zeros(np.shape(a), jax.dtypes.float0)


def full_tangents(args, diff_argnums, tangents):
    """Tangents for every positional argument: ``tangents`` on the differentiable ones, zero elsewhere."""
    full = [_zero_tangent(a) for a in args]
    for i, t in zip(diff_argnums, tangents, strict=True):
        full[i] = t
    return tuple(full)


def _tangent_map(s: Subject) -> Callable[..., Any]:
    """The declared tangent map of a subject without ``partials`` (it declares one or the other)."""
    if s.tangent_map is None:
        raise ValueError("a subject declares `partials` or a `tangent_map`; this one has neither.")
    return s.tangent_map


def evaluate(s: Subject, args, tangents, cotangent, *, value: bool = True, ones: bool = False) -> dict[str, Any]:
    """The JVP and VJP of ``s.fn`` at ``args`` and the declaration there; traceable.

    With ``value``, also the value of ``s.fn`` (from the VJP's forward pass)
    and of the reference; with
    ``ones``, also the VJP of a cotangent of ones (the gradient of the sum).
    """
    args = tuple(args)
    _, jt = jax.jvp(s.fn, args, full_tangents(args, s.diff_argnums, tangents))
    diff_values = tuple(args[i] for i in s.diff_argnums)
    # The value is the VJP's forward pass: fn under the transformation, computed once.
    y, pull = jax.vjp(lambda *d: s.fn(*_merge(args, s.diff_argnums, d)), *diff_values)
    c = jnp.asarray(cotangent).astype(jnp.result_type(y))
    out = {"jt": jt, "ct": pull(c)}
    if ones:
        out["ct_ones"] = pull(jnp.ones_like(c))
    if value:
        out["y"], out["r"] = y, s.reference(*args)
    if s.partials is not None:
        out["partials"] = s.partials(*args)
    else:
        tangent_map = _tangent_map(s)
        m = tangent_map(args, tuple(tangents))
        transpose = jax.linear_transpose(lambda *ts: tangent_map(args, ts), *tangents)
        out["map"] = m
        out["map_ct"] = transpose(c.astype(jnp.result_type(m)))
        if ones:
            out["map_ct_ones"] = transpose(jnp.ones_like(c).astype(jnp.result_type(m)))
    return out


def _vmapped(s: Subject, in_axes: tuple[Any, ...]) -> Subject:
    t_axes = tuple(in_axes[i] for i in s.diff_argnums)
    return dataclasses.replace(
        s,
        fn=jax.vmap(s.fn, in_axes),
        reference=jax.vmap(s.reference, in_axes),
        partials=None if s.partials is None else jax.vmap(s.partials, in_axes),
        tangent_map=None if s.tangent_map is None else jax.vmap(s.tangent_map, in_axes=(in_axes, t_axes)),
    )


def _scan_rows(f, axes):
    """``f`` applied row by row inside ``lax.scan`` to the arguments whose axis is 0."""

    def scanned(*args):
        rows = tuple(a for a, ax in zip(args, axes, strict=True) if ax == 0)

        def body(carry, row):
            it = iter(row)
            item = tuple(next(it) if ax == 0 else a for a, ax in zip(args, axes, strict=True))
            return carry, f(*item)

        return lax.scan(body, None, rows)[1]

    return scanned


def _scanned(s: Subject, in_axes: tuple[Any, ...]) -> Subject:
    t_axes = tuple(in_axes[i] for i in s.diff_argnums)
    n = len(in_axes)
    tangent_map = None
    if s.tangent_map is not None:
        flat = _scan_rows(lambda *a: s.tangent_map(a[:n], a[n:]), (*in_axes, *t_axes))

        def tangent_map(args, ts):
            return flat(*args, *ts)

    return dataclasses.replace(
        s,
        fn=_scan_rows(s.fn, in_axes),
        reference=_scan_rows(s.reference, in_axes),
        partials=None if s.partials is None else _scan_rows(s.partials, in_axes),
        tangent_map=tangent_map,
    )


def _checkpointed(s: Subject) -> Subject:
    return dataclasses.replace(s, fn=jax.checkpoint(s.fn))


# --- running checks ----------------------------------------------------------------------------


def exception_text(e: BaseException) -> str:
    """``TypeError: first line of the message`` (at most 400 characters), and where it was raised."""
    lines = str(e).strip().splitlines()
    text = f"{type(e).__name__}: {lines[0] if lines else ''}"
    if len(text) > 400:
        text = text[:397] + "..."
    frames = traceback.extract_tb(e.__traceback__)
    if frames:
        text += f" (in {frames[-1].name}, line {frames[-1].lineno})"
    return text


def step(label: str, thunk: Callable[[], Any]) -> Any:
    """Run ``thunk`` to completion; an exception becomes a CheckFailed naming the step."""
    try:
        return jax.block_until_ready(thunk())
    except CheckFailed:
        raise
    except Exception as e:
        raise CheckFailed(f"{label} raised {exception_text(e)}") from e


def run_check(name: str, dtype: str | None, body: Callable[[], str]) -> Check:
    """Run one check; any exception becomes a failed check with a readable detail."""
    try:
        with np.errstate(all="ignore"):
            detail = body()
        return Check(name=name, passed=True, detail=detail, dtype=dtype)
    except CheckFailed as e:
        return Check(name=name, passed=False, detail=str(e), dtype=dtype)
    except Exception as e:
        return Check(name=name, passed=False, detail=f"the check raised {exception_text(e)}", dtype=dtype)


def _np_tree(tree):
    return jax.tree.map(np.asarray, tree)


def _on_device(arrays) -> tuple[jax.Array, ...]:
    """Host arrays onto the default device as they are: a transfer, where ``jnp.asarray`` compiles a program."""
    return tuple(jax.device_put(np.asarray(a)) for a in arrays)


class DtypeRun:
    """The checks for one dtype (and one parameter set), sharing inputs and results."""

    def __init__(
        self,
        subject: Subject,
        layout: Layout,
        dtype: np.dtype,
        boundaries: Sequence[float],
        *,
        seed: int,
        label: str = "",
        example: np.ndarray | None = None,
        kinds: Sequence[str] = CHECK_KINDS,
    ):
        self.s = subject
        self.kinds = tuple(kinds)
        self.dtype = dtype
        self.tol = Tolerance.of(dtype)
        self.label = label
        self.seed = seed
        with np.errstate(all="ignore"):  # boundaries beyond the dtype's range become inf
            self.values = make_values(dtype, boundaries, seed, example)
        self.layout = layout
        self.rows = layout.rows_for(self.values.pool.size)
        self._memo: dict[Any, Any] = {}

    def warm_eager(self) -> None:
        """Run ``fn`` and the reference once eagerly on the traced inputs, dropping what they return.

        Their single operations are then compiled when the eager checks run them (JAX keeps one program per
        operation, shape and type): :func:`stejax.verify.check_catalog` calls this in a compile worker, so that
        those compilations overlap the next estimator's tracing. The checks still run ``fn`` and the reference
        eagerly themselves, in the calling thread; a failure here is theirs to report, so it is dropped.
        """
        case = self._memo.get(("jax", "pool"))
        if case is None:  # not traced: nothing to warm
            return
        for f in (self.s.fn, self.s.reference):
            try:
                jax.block_until_ready(f(*case))
            except Exception:  # reported by the check that runs it, in the calling thread
                continue

    # inputs ----------------------------------------------------------------------------------

    def once(self, key: Any, label: str, thunk: Callable[[], Any]) -> Any:
        """``step(label, thunk)`` computed once per key; a failure is remembered and raised again."""
        if key not in self._memo:
            try:
                self._memo[key] = step(label, thunk)
            except CheckFailed as e:
                self._memo[key] = e
        value = self._memo[key]
        if isinstance(value, CheckFailed):
            raise CheckFailed(str(value))
        return value

    def case(self, which: str) -> tuple[Any, ...]:
        """The positional arguments of the ``pool`` or ``smooth`` case, as NumPy arrays."""
        key = ("case", which)
        if key not in self._memo:
            rng = rng_for(self.seed, self.dtype.name, "arguments")
            values = getattr(self.values, which)
            self._memo[key] = self.layout.arguments(values, self.dtype, rng, self.rows)
        return self._memo[key]

    def jax_case(self, which: str) -> tuple[Any, ...]:
        key = ("jax", which)
        if key not in self._memo:
            self._memo[key] = _on_device(self.case(which))
        return self._memo[key]

    def x(self, which: str) -> np.ndarray:
        return np.asarray(self.case(which)[0])

    def tangents(self, which: str, purpose: str) -> tuple[np.ndarray, ...]:
        """Five-bit random tangents of each differentiable argument's shape and dtype."""
        rng = rng_for(self.seed, self.dtype.name, which, purpose)
        args = self.case(which)
        return tuple(few_bit_values(rng, np.shape(args[i]), self._tangent_dtype(args[i])) for i in self.s.diff_argnums)

    def cotangent(self, which: str, purpose: str = "cotangent") -> np.ndarray:
        rng = rng_for(self.seed, self.dtype.name, which, purpose)
        out = self.out_struct(which)
        return few_bit_values(rng, tuple(out.shape), np.dtype(out.dtype))

    def out_struct(self, which: str) -> jax.ShapeDtypeStruct:
        """The reference's output shape and dtype, without running it."""
        out = self.once(
            ("shape", which), "the reference", lambda: jax.eval_shape(self.s.reference, *self.jax_case(which))
        )
        if not isinstance(out, jax.ShapeDtypeStruct):
            raise CheckFailed(f"the reference returns {cmp.describe_array(out)}, not one array.")
        return out

    def _tangent_dtype(self, a) -> np.dtype:
        dt = np.asarray(a).dtype
        return dt if is_floating_dtype(dt) else self.dtype

    def in_axes(self) -> tuple[Any, ...]:
        """0 for the first argument and for others that share its leading axis, None for the rest."""
        args = self.case("smooth")
        x = np.asarray(args[0])
        axes: list[Any] = [0]
        for a in args[1:]:
            a = np.asarray(a)
            axes.append(0 if a.ndim == x.ndim and a.ndim >= 1 and a.shape[0] == x.shape[0] else None)
        return tuple(axes)

    # shared results --------------------------------------------------------------------------

    def reference_out(self, which: str) -> np.ndarray:
        out = self.once(("reference", which), "the reference", lambda: self.s.reference(*self.jax_case(which)))
        return cmp.single_array(out, "the reference's output")

    def fn_out(self, which: str) -> Any:
        return self.once(("fn", which), "fn", lambda: self.s.fn(*self.jax_case(which)))

    def smooth_inputs(self):
        key = ("smooth inputs",)
        if key not in self._memo:
            args = self.jax_case("smooth")
            tangents = _on_device(self.tangents("smooth", "compose"))
            (cotangent,) = _on_device([self.cotangent("smooth", "compose")])
            self._memo[key] = (args, tangents, cotangent)
        return self._memo[key]

    # the checks ------------------------------------------------------------------------------

    def name(self, kind: str) -> str:
        return f"{kind}[{self.dtype.name}{self.label}]"

    def run(self) -> list[Check]:
        return [run_check(self.name(k), self.dtype.name, getattr(self, f"check_{k}")) for k in self.kinds]

    def check_forward_bitwise(self) -> str:
        x = self.x("pool")
        ref = self.reference_out("pool")
        problem = cmp.bitwise_problem(self.fn_out("pool"), ref, "fn", "the reference", x)
        if problem:
            raise CheckFailed(f"eager: {problem}")
        (jit_fn, jit_ref), _ = self.piece("forward")
        problem = cmp.bitwise_problem(jit_fn, jit_ref, "jit(fn)", "jit(reference)", x)
        if problem:
            raise CheckFailed(f"under jit: {problem}")
        v = self.values
        chosen = f" (of {v.boundaries_total}, evenly chosen)" if v.boundaries_total > v.boundaries_used else ""
        compiled = cmp.bitwise_problem(jit_ref, ref, "jit(reference)", "the eager reference", x)
        note = f" Note: XLA compiles the reference itself differently: {compiled}" if compiled else ""
        return (
            f"{ref.size} values equal the reference bit for bit, eagerly and under jit "
            f"(jit(fn) against jit(reference)); inputs: +-0, +-inf, NaN, magnitudes up to "
            f"+-{cmp.fmt(finfo(self.dtype).max)}, ordinary values and "
            f"triplets around {v.boundaries_used} boundaries{chosen}.{note}"
        )

    def check_jvp_primal(self) -> str:
        out, compiled = self.piece("tangents")
        fn_value = self.piece("forward")[0][0] if compiled else self.fn_out("pool")
        against = "jit(fn)" if compiled else "fn(x)"
        problem = cmp.bitwise_problem(out["primal"], fn_value, "the primal of jvp", against, self.x("pool"))
        if problem:
            raise CheckFailed(problem)
        return "the primal jvp returns equals fn called without differentiation, bit for bit"

    def check_tangent(self) -> str:
        out, _ = self.piece("tangents")
        out = _np_tree(out)
        x = self.x("pool")
        args = self.case("pool")
        tangents = self.tangents("pool", "t1")
        shape = tuple(self.out_struct("pool").shape)
        skip = None
        if self.s.partials is not None:
            partials = tuple(np.asarray(d).astype(self.dtype) for d in out["partials"])
            # The contract speaks of finite partials: where one is not, d * 0 is NaN too.
            skip = np.zeros(shape, bool)
            for d in partials:
                skip |= ~np.isfinite(cmp.f64(d))
        notes = []
        for k, i in enumerate(self.s.diff_argnums):
            jt = out["tangents"][k]
            what = "the tangent" if len(tangents) == 1 else f"the tangent of argument {i}"
            if self.s.partials is not None:
                # Elementwise partials: the argument's tangent broadcasts to the output (a tangent map's
                # argument may have another shape, a matrix product's weights say).
                t_out = np.broadcast_to(tangents[k], shape)
                d = partials[k]
                expected = cmp.product(d, t_out, self.dtype, self.tol)
                extra = [("derivative", d), ("tangent", t_out)]
                problem, note = cmp.declared_problem(
                    jt, expected, self.dtype, self.tol, what, x, skip=skip, extra=extra
                )
            else:
                m = cmp.mapped(out["maps"][k], self.tol)
                problem, note = cmp.declared_problem(jt, m, self.dtype, self.tol, what, x)
            if problem:
                raise CheckFailed(problem)
            arg_shape = np.shape(args[i])
            notes.append(f"argument {i}" + (f" of shape {arg_shape}" if arg_shape != x.shape else "") + f": {note}")
        kind = "derivative * tangent" if self.s.partials is not None else "the declared tangent map"
        return f"the tangent equals {kind}; " + "; ".join(notes)

    def check_linearity(self) -> str:
        lin, _ = self.piece("tangents")
        j1, j2, j12 = (cmp.single_array(lin[k], "the tangent") for k in ("j1", "j2", "j12"))
        a1, a2 = _A * cmp.f64(j1), _B * cmp.f64(j2)
        value = a1 + a2
        magnitude = np.abs(a1) + np.abs(a2)
        considered = np.isfinite(a1) & np.isfinite(a2)
        if self.s.partials is not None:
            for d in self.piece("tangents")[0]["partials"]:
                considered &= np.isfinite(cmp.f64(d))
        else:
            finite = magnitude[np.isfinite(magnitude)]
            magnitude = magnitude + (finite.max() if finite.size else 0.0)
        expected = Expected(
            value=value,
            magnitude=magnitude,
            exact=np.zeros(value.shape, bool),
            ulps=self.tol.linearity_ulps,
            floor=self.tol.tiny,
        )
        if j12.shape != value.shape:
            raise CheckFailed(f"jvp returned tangents of shapes {j12.shape} and {value.shape}.")
        bad = cmp.mismatches(j12, expected, self.dtype, self.tol) & considered
        if bad.any():
            raise CheckFailed(
                f"jvp(2 t1 - t2/2) differs from 2 jvp(t1) - jvp(t2)/2 at {int(bad.sum())} of "
                f"{int(considered.sum())} points; " + cmp.examples(bad, j12, value, self.x("pool")) + "."
            )
        skipped = int((~considered).sum())
        return (
            f"jvp(2 t1 - t2/2) = 2 jvp(t1) - jvp(t2)/2 within {self.tol.linearity_ulps} ulp at "
            f"{int(considered.sum())} points" + (f" (skipped {skipped} with a non-finite part)" if skipped else "")
        )

    def check_tangent_structure(self) -> str:
        args = self.jax_case("pool")
        diff = self.s.diff_argnums
        tangents = _on_device(self.tangents("pool", "t1"))
        (cotangent,) = _on_device([self.cotangent("pool")])

        def shapes():
            primal, jt = jax.jvp(self.s.fn, args, full_tangents(args, diff, tangents))
            _, pull = jax.vjp(lambda *d: self.s.fn(*_merge(args, diff, d)), *(args[i] for i in diff))
            return primal, jt, pull(cotangent.astype(jnp.result_type(primal)))

        primal, jt, cts = step("tracing jvp and vjp", lambda: jax.eval_shape(shapes))
        # Annotated: the return type jax declares for structure() names an extension type
        # without a stub, which mypy cannot resolve and then refuses to compare.
        ps: jax.tree_util.PyTreeDef = jax.tree.structure(primal)
        ts: jax.tree_util.PyTreeDef = jax.tree.structure(jt)
        if ps != ts:
            raise CheckFailed(f"the tangent's pytree structure {ts} differs from the primal's {ps}.")
        for p, t in zip(jax.tree.leaves(primal), jax.tree.leaves(jt), strict=True):
            if p.shape != t.shape:
                raise CheckFailed(f"the tangent has shape {t.shape}; the primal has {p.shape}.")
            if p.dtype != t.dtype:
                raise CheckFailed(f"the tangent has dtype {t.dtype}; the primal has {p.dtype}.")
        for i, c in zip(diff, cts, strict=True):
            a = args[i]
            if c.shape != a.shape or c.dtype != a.dtype:
                raise CheckFailed(
                    f"the cotangent of argument {i} is {cmp.describe_array(c)}; the argument is "
                    f"{cmp.describe_array(a)}."
                )
        return f"the tangent is {cmp.describe_array(primal)} like the primal; each cotangent is like its argument"

    def check_adjoint(self) -> str:
        ev = _np_tree(self.piece("smooth")[0])
        _, tangents, c = self.smooth_inputs()
        jt = cmp.single_array(ev["jt"], "the tangent")
        lhs_terms = cmp.f64(jt) * cmp.f64(c)
        rhs_terms = [cmp.f64(t) * cmp.f64(ct) for t, ct in zip(tangents, ev["ct"], strict=True)]
        lhs, rhs = lhs_terms.sum(), sum(r.sum() for r in rhs_terms)
        if not (np.isfinite(lhs) and np.isfinite(rhs)):
            raise CheckFailed(f"<jvp(t), c> = {cmp.fmt(lhs)} and <t, vjp(c)> = {cmp.fmt(rhs)} on finite inputs.")
        # Each side's elements carry the rounding of a product; a broadcast argument's
        # cotangent also that of a sum over the elements it was broadcast to.
        bound = self.tol.tangent_ulps * self.tol.eps * np.abs(lhs_terms).sum()
        for t, r in zip(tangents, rhs_terms, strict=True):
            n = max(1, jt.size // max(1, np.size(t)))
            bound += self.tol.sum_bound_ulps(n) * self.tol.eps * np.abs(r).sum()
        bound += jt.size * self.tol.tiny
        if abs(lhs - rhs) > bound:
            raise CheckFailed(
                f"<jvp(t), c> = {cmp.fmt(lhs)} but <t, vjp(c)> = {cmp.fmt(rhs)}: they differ by "
                f"{abs(lhs - rhs):.3g}, "
                f"beyond the bound {bound:.3g}."
            )
        return f"<jvp(t), c> = {lhs:.6g} and <t, vjp(c)> = {rhs:.6g} agree within {bound:.3g}"

    def check_grad(self) -> str:
        which = "smooth"
        out = _np_tree(self.piece("smooth")[0])
        ones = np.ones(tuple(self.out_struct(which).shape))
        if self.s.partials is not None:
            declared = self._declared_cotangents(out, ones, which, None)
        else:
            declared = [cmp.mapped(c, self.tol) for c in out["map_ct_ones"]]
        for i, got, exp in zip(self.s.diff_argnums, out["ct_ones"], declared, strict=True):
            problem, _ = cmp.declared_problem(
                got, exp, self.dtype, self.tol, f"the gradient with respect to argument {i}", self._x_for(i, which)
            )
            if problem:
                raise CheckFailed(problem)
        return "the gradient of sum(fn) (the VJP of ones) equals the declared derivative" + (
            " (summed over the axes a broadcast argument spans)" if len(self.s.diff_argnums) > 1 else ""
        )

    def _x_for(self, i: int, which: str) -> np.ndarray | None:
        return self.x(which) if i == 0 else None

    # declarations on the host -------------------------------------------------------------------

    def _declared_tangent(self, ev, tangents) -> Expected:
        """The declared output tangent of an evaluation for ``tangents``."""
        if "map" in ev:
            return cmp.mapped(ev["map"], self.tol)
        out_shape = np.shape(ev["partials"][0])
        parts = [
            cmp.product(
                np.asarray(d).astype(self.dtype),
                np.broadcast_to(np.asarray(t), out_shape),
                self.dtype,
                self.tol,
            )
            for d, t in zip(ev["partials"], tangents, strict=True)
        ]
        return cmp.total(parts, self.dtype, self.tol)

    def _declared_cotangents(self, ev, cotangent: np.ndarray, which: str, per_row_axes) -> list[Expected]:
        """The declared cotangent of each differentiable argument.

        ``per_row_axes`` is None for a function of the whole arrays; under vmap
        of the VJP it holds the in_axes, and each row has its own cotangent.
        """
        if "map" in ev:
            return [cmp.mapped(c, self.tol) for c in ev["map_ct"]]
        args = self.case(which)
        out = []
        for k, i in enumerate(self.s.diff_argnums):
            d = np.asarray(ev["partials"][k]).astype(self.dtype)
            shape = tuple(np.shape(args[i]))
            if per_row_axes is None:
                aligned, target = (1,) * (d.ndim - len(shape)) + shape, shape
            else:
                rows, item = d.shape[0], (shape[1:] if per_row_axes[i] == 0 else shape)
                aligned = (rows,) + (1,) * (d.ndim - 1 - len(item)) + item
                target = (rows, *item)
            term = cmp.product(d, np.broadcast_to(cotangent, d.shape), self.dtype, self.tol)
            out.append(cmp.reduced(term, aligned, target, self.tol))
        return out

    def _compare_evaluation(
        self, ev, what: str, *, per_row_axes=None, parts: Sequence[str] = ("value", "tangent", "cotangent")
    ) -> None:
        """An evaluation's value against the reference bitwise, its JVP and VJP against the declaration."""
        ev = _np_tree(ev)
        x = self.x("smooth")
        if "value" in parts:
            problem = cmp.bitwise_problem(ev["y"], ev["r"], f"{what} of fn", f"{what} of the reference", x)
            if problem:
                raise CheckFailed(problem)
        _, tangents, c = self.smooth_inputs()
        if "tangent" in parts:
            problem, _ = cmp.declared_problem(
                ev["jt"], self._declared_tangent(ev, tangents), self.dtype, self.tol, f"the tangent of {what}", x
            )
            if problem:
                raise CheckFailed(problem)
        if "cotangent" in parts:
            declared = self._declared_cotangents(ev, cmp.f64(c), "smooth", per_row_axes)
            for i, got, exp in zip(self.s.diff_argnums, ev["ct"], declared, strict=True):
                what_ct = f"the cotangent of argument {i} under {what}"
                problem, _ = cmp.declared_problem(got, exp, self.dtype, self.tol, what_ct, self._x_for(i, "smooth"))
                if problem:
                    raise CheckFailed(problem)

    # compositions ---------------------------------------------------------------------------

    def check_jit(self) -> str:
        return self._composed("jit")

    def check_scan(self) -> str:
        return self._composed("scan")

    def check_checkpoint(self) -> str:
        return self._composed("checkpoint")

    def _composed(self, kind: str) -> str:
        """jit, scan and checkpoint: first from the one program that nests all three.

        ``jit(scan(checkpoint(fn)))`` exercises all three at the cost of one
        compilation. Only when it fails is the transformation compiled alone,
        so that the failure is reported by the check it belongs to.
        """
        try:
            self._compare_evaluation(self.piece("composed")[0], "jit(scan(checkpoint(fn)))")
            shared = True
        except CheckFailed:
            self._compare_evaluation(self.piece(kind)[0], _PIECE_WHAT[kind])
            shared = False
        how = "all three nested: jit(scan(checkpoint(fn)))" if shared else f"{_PIECE_WHAT[kind]} alone, under jit"
        return f"{_PIECE_WHAT[kind]}: value bit for bit, jvp and vjp as declared ({how})"

    def check_vmap(self) -> str:
        axes = self.in_axes()
        x = self.x("smooth")
        ev = _np_tree(self._of_vmap())
        loop = _np_tree(self.piece("loop")[0])
        rows = loop["looped"].shape[0]
        problem = cmp.bitwise_problem(ev["y"][:rows], loop["looped"], "vmap(fn)", "fn in a Python loop", x[:rows])
        if problem:
            raise CheckFailed(problem)
        self._compare_evaluation(ev, "vmap", parts=("value", "tangent"))
        of_rows = _np_tree(self._of_rows())
        _, tangents, _ = self.smooth_inputs()
        problem, _ = cmp.declared_problem(
            of_rows["jt"], self._declared_tangent(of_rows, tangents), self.dtype, self.tol, "vmap of jvp", x
        )
        if problem:
            raise CheckFailed(problem)
        note = f"in_axes {axes}"
        if "all_batched" in loop:
            what = "vmap(fn) with every argument batched"
            problem = cmp.bitwise_problem(loop["all_batched"], ev["y"], what, "vmap(fn)", x)
            if problem:
                raise CheckFailed(problem)
            note += ", and every argument batched"
        return (
            f"vmap ({note}) equals fn in a Python loop over {rows} rows, bit for bit; "
            "jvp of vmap and vmap of jvp as declared"
        )

    def _of_vmap(self):
        """The value, JVP and VJP of vmap(fn) (so grad of vmap)."""
        return self.piece("of_vmap")[0]

    def _of_rows(self):
        """vmap of the per-row value, JVP and VJP (so vmap of grad)."""
        return self.piece("of_rows")[0]

    def check_grad_of_vmap(self) -> str:
        self._compare_evaluation(self._of_vmap(), "grad of vmap", parts=("cotangent",))
        return "the cotangent of vmap(fn) equals the declared one"

    def check_vmap_of_grad(self) -> str:
        self._compare_evaluation(self._of_rows(), "vmap of grad", per_row_axes=self.in_axes(), parts=("cotangent",))
        return "vmap of each row's cotangent equals the declared one, row by row"

    def check_jacfwd_jacrev(self) -> str:
        args = self.jac_case()
        diff = self.s.diff_argnums
        jac = _np_tree(self.piece("jac")[0])
        jf, jr = jac["jacfwd"], jac["jacrev"]
        for k, i in enumerate(diff):
            a, b = cmp.single_array(jf[k], "jacfwd"), cmp.single_array(jr[k], "jacrev")
            what = f"jacfwd with respect to argument {i}"
            problem = cmp.same_kind_problem(a, b, what, "jacrev")
            if problem:
                raise CheckFailed(problem)
            if self.s.partials is None:
                problem, _ = cmp.declared_problem(a, cmp.mapped(b, self.tol), self.dtype, self.tol, what, None)
                if problem:
                    raise CheckFailed(problem.replace("the declared value", "jacrev"))
                continue
            # Each entry is the derivative times 1 or 0 both ways: exact (within the platform contract).
            bad = cmp.unequal(a, b, self.tol)
            if bad.any():
                raise CheckFailed(
                    f"{what} differs from jacrev at {int(bad.sum())} of {bad.size} entries; "
                    + cmp.examples(bad, a, b, None)
                    + "."
                )
            d = np.asarray(jac["partials"][k]).astype(self.dtype)
            declared = _elementwise_jacobian(d, np.shape(args[i]), d.shape)
            got = cmp.f64(a).reshape(declared.shape)
            bad = cmp.unequal(got, declared, self.tol)
            if bad.any():
                raise CheckFailed(
                    f"{what} differs from the declared Jacobian (the derivative where an output reads "
                    f"the input, zero elsewhere) at {int(bad.sum())} of {bad.size} entries; "
                    + cmp.examples(bad, got, declared, None)
                    + "."
                )
        return "jacfwd equals jacrev" + (
            ", and both the declared (diagonal) Jacobian" if self.s.partials is not None else ""
        )

    # compiled pieces ------------------------------------------------------------------------

    def shared_pieces(self) -> list[str]:
        """The pieces the checks need, computed in the shared program."""
        return list(dict.fromkeys(name for k in self.kinds for name in _KIND_PIECES.get(k, ())))

    def pieces(self, names: Sequence[str]) -> dict[str, tuple[Callable[..., Any], tuple[Any, ...]]]:
        """The compiled computations called ``names``: ``name -> (traceable function, inputs)``."""
        return {name: getattr(self, f"_piece_{name}")() for name in names}

    def _piece_forward(self):
        s = self.s
        return (lambda a: (s.fn(*a), s.reference(*a))), (self.jax_case("pool"),)

    def _piece_tangents(self):
        s = self.s
        t1, t2 = self.tangents("pool", "t1"), self.tangents("pool", "t2")
        combined = tuple(
            (_A * a.astype(np.float64) + _B * b.astype(np.float64)).astype(a.dtype) for a, b in zip(t1, t2, strict=True)
        )
        linearity = "linearity" in self.kinds
        n = len(t1)

        def f(
            a: tuple[jax.Array, ...], t1: tuple[jax.Array, ...], t2: tuple[jax.Array, ...], t12: tuple[jax.Array, ...]
        ) -> dict[str, Any]:
            def jvp(t):
                return jax.jvp(s.fn, a, full_tangents(a, s.diff_argnums, t))

            primal, j1 = jvp(t1)
            # One tangent on each argument in turn (the first is t1 itself when there is one).
            per_arg = [tuple(t if j == k else jnp.zeros_like(t) for j, t in enumerate(t1)) for k in range(n)]
            out: dict[str, Any] = {"primal": primal, "tangents": [j1] if n == 1 else [jvp(t)[1] for t in per_arg]}
            if linearity:
                out.update(j1=j1, j2=jvp(t2)[1], j12=jvp(t12)[1])
            if s.partials is not None:
                out["partials"] = s.partials(*a)
            else:
                tangent_map = _tangent_map(s)
                out["maps"] = [tangent_map(a, only) for only in per_arg]
            return out

        return f, (self.jax_case("pool"), _on_device(t1), _on_device(t2), _on_device(combined))

    def _piece_smooth(self):
        s = self.s
        return (lambda a, t, c: evaluate(s, a, t, c, value=False, ones=True)), self.smooth_inputs()

    def _piece_loop(self):
        s, axes = self.s, self.in_axes()
        rows = min(self.rows, _LOOP_ROWS)
        # The rows, and the other arguments broadcast to every row, are cut on the host (exact data
        # movement): eagerly, slicing on the device would compile a program per slice.
        host, args = self.case("smooth"), self.jax_case("smooth")
        items = tuple(
            tuple(_on_device([h[i]])[0] if ax == 0 else a for h, a, ax in zip(host, args, axes, strict=True))
            for i in range(rows)
        )
        stacked = None
        if None in axes:
            n = np.shape(host[0])[0]
            stacked = tuple(
                a if ax == 0 else _on_device([np.broadcast_to(h, (n, *np.shape(h)))])[0]
                for h, a, ax in zip(host, args, axes, strict=True)
            )

        def f(items, stacked):
            out = {"looped": jnp.stack([s.fn(*item) for item in items])}
            if stacked is not None:
                # Every argument batched too: each row gets the same value of the others.
                out["all_batched"] = jax.vmap(s.fn)(*stacked)
            return out

        return f, (items, stacked)

    def _piece_of_vmap(self):
        vs = _vmapped(self.s, self.in_axes())
        return (lambda a, t, c: evaluate(vs, a, t, c)), self.smooth_inputs()

    def _piece_of_rows(self):
        s, axes = self.s, self.in_axes()
        t_axes = tuple(axes[i] for i in s.diff_argnums)
        per_row = jax.vmap(lambda a, t, c: evaluate(s, a, t, c, value=False), in_axes=(axes, t_axes, 0))
        return per_row, self.smooth_inputs()

    def jac_case(self) -> tuple[Any, ...]:
        """The first rows of the smooth case, at most 32 elements: Jacobians grow as its square."""
        key = ("jac case",)
        if key not in self._memo:
            rows = max(2, min(self.rows, _JAC_ELEMENTS // self.layout.item_size))
            args = self.case("smooth")
            # Sliced on the host, then transferred: the same values as slicing on the device, without a program.
            self._memo[key] = _on_device(a[:rows] if ax == 0 else a for a, ax in zip(args, self.in_axes(), strict=True))
        return self._memo[key]

    def _piece_jac(self):
        s = self.s
        diff = s.diff_argnums
        argnums = tuple(range(len(diff)))

        def f(args):
            def g(*d):
                return s.fn(*_merge(args, diff, d))

            values = tuple(args[i] for i in diff)
            out = {
                "jacfwd": jax.jacfwd(g, argnums=argnums)(*values),
                "jacrev": jax.jacrev(g, argnums=argnums)(*values),
            }
            if s.partials is not None:
                out["partials"] = s.partials(*args)
            return out

        return f, (self.jac_case(),)

    def _piece_composed(self):
        return self._evaluation_piece(_scanned(_checkpointed(self.s), self.in_axes()))

    def _piece_jit(self):
        return self._evaluation_piece(self.s)

    def _piece_scan(self):
        return self._evaluation_piece(_scanned(self.s, self.in_axes()))

    def _piece_checkpoint(self):
        return self._evaluation_piece(_checkpointed(self.s))

    def _evaluation_piece(self, sub: Subject):
        return (lambda a, t, c: evaluate(sub, a, t, c)), self.smooth_inputs()

    def piece(self, name: str) -> tuple[Any, bool]:
        """A piece's result, and whether it ran compiled.

        From the shared program when that ran; otherwise computed alone:
        compiled for the jit-bound pieces, eagerly for the others, so that a
        rule that only works eagerly fails only the checks that compile.
        """
        if ("piece", name) not in self._memo and name not in _JIT_BOUND:
            f, inputs = self.pieces([name])[name]
            return self.once(("eager piece", name), _PIECE_LABELS[name], lambda: f(*inputs)), False
        if ("piece", name) not in self._memo and name in _ALONE_TOGETHER:
            self._compile_together(tuple(k for k in _ALONE_TOGETHER if k in self.kinds or k == name))
        f, inputs = self.pieces([name])[name]
        return self.once(("piece", name), _PIECE_LABELS[name], lambda: jax.jit(f)(*inputs)), True

    def _compile_together(self, names: tuple[str, ...]) -> None:
        """The pieces ``names``, each under its own transformation, compiled and run as one program.

        When the nested composition fails, jit, scan and checkpoint are each
        computed apart from the others; one program holds the three (one
        compilation instead of three). When it cannot be traced, compiled or
        run, nothing is kept and each piece is compiled alone, so that the
        failure is reported by the check it belongs to.
        """
        key = ("together", names)
        if key in self._memo:
            return
        self._memo[key] = True
        try:
            built = self.pieces(names)
            functions = [built[n][0] for n in names]

            def program(inputs):
                return [f(*i) for f, i in zip(functions, inputs, strict=True)]

            results = jax.block_until_ready(jax.jit(program)([built[n][1] for n in names]))
        except Exception:
            return
        for n, result in zip(names, results, strict=True):
            self._memo[("piece", n)] = result


# The pieces that are about compilation, computed under jit even alone.
_JIT_BOUND = frozenset({"forward", "composed", "jit", "scan", "checkpoint"})
# The compositions that the nested one stands for, computed together when it fails.
_ALONE_TOGETHER = ("jit", "scan", "checkpoint")
_PIECE_WHAT = {"jit": "jit", "scan": "lax.scan", "checkpoint": "jax.checkpoint"}
# The compiled pieces each check reads.
_KIND_PIECES = {
    "forward_bitwise": ("forward",),
    "jvp_primal": ("tangents", "forward"),
    "tangent": ("tangents",),
    "linearity": ("tangents",),
    "adjoint": ("smooth",),
    "grad": ("smooth",),
    "jit": ("composed",),
    "vmap": ("of_vmap", "of_rows", "loop"),
    "grad_of_vmap": ("of_vmap",),
    "vmap_of_grad": ("of_rows",),
    "jacfwd_jacrev": ("jac",),
    "scan": ("composed",),
    "checkpoint": ("composed",),
}
_PIECE_LABELS = {
    "forward": "jax.jit(fn) and jax.jit(reference)",
    "tangents": "jax.jvp(fn) and the declaration",
    "smooth": "jax.jvp and jax.vjp of fn",
    "of_vmap": "jvp and vjp of vmap(fn)",
    "loop": "fn in a Python loop over rows",
    "of_rows": "vmap of the jvp and vjp of fn",
    "jac": "jax.jacfwd and jax.jacrev of fn",
    "composed": "jit(scan(checkpoint(fn))) with jvp and vjp",
    "jit": "jax.jit of value, jvp and vjp",
    "scan": "fn inside lax.scan with jvp and vjp",
    "checkpoint": "jax.checkpoint(fn) with jvp and vjp",
}


def _call_jit(f, inputs):
    return jax.jit(f)(*inputs)


def _elementwise_jacobian(d: np.ndarray, arg_shape, out_shape) -> np.ndarray:
    """The Jacobian of an elementwise rule: ``d[o]`` where output ``o`` reads argument element ``j``."""
    out_size, arg_size = int(np.prod(out_shape)), int(np.prod(arg_shape))
    aligned = (1,) * (len(out_shape) - len(arg_shape)) + tuple(arg_shape)
    index = np.broadcast_to(np.arange(arg_size).reshape(aligned), out_shape).reshape(-1)
    jac = np.zeros((out_size, arg_size))
    jac[np.arange(out_size), index] = cmp.f64(d).reshape(-1)
    return jac


class SharedProgram:
    """The compiled pieces of several runs, compiled together as one program.

    One compilation instead of one per dtype, parameter set and piece. A
    piece that cannot be traced is left out of the program (the others still
    share it); if the program cannot be compiled or run, each check computes
    what it needs alone. Either way a failure is reported by the check it
    belongs to.
    Tracing happens in the constructor; :meth:`compile` may run in another
    thread while the caller prepares the next program.
    """

    def __init__(self, runs: Sequence[DtypeRun]):
        with np.errstate(all="ignore"):
            self._trace(runs)

    def _trace(self, runs: Sequence[DtypeRun]) -> None:
        self.runs = tuple(runs)
        found: list[tuple[tuple[int, str], tuple[Callable[..., Any], tuple[Any, ...]]]] = []
        for n, run in enumerate(self.runs):
            for name in run.shared_pieces():
                try:
                    found.append(((n, name), run.pieces([name])[name]))
                except Exception:
                    continue
        self.keys: list[tuple[int, str]] = []
        self.inputs: list[tuple[Any, ...]] = []
        self.lowered: jax.stages.Lowered | None = None
        self.compiled: jax.stages.Compiled | None = None
        if found and not self._lower(found):
            # A piece that cannot be traced is left to its checks, which compute it alone; the
            # pieces that can still share one program.
            traceable = [item for item in found if _traces(*item[1])]
            if traceable and len(traceable) < len(found):
                self._lower(traceable)

    def _lower(self, found) -> bool:
        """Lower the pieces ``found`` as one program; whether that worked."""
        functions = [f for _, (f, _) in found]
        inputs = [i for _, (_, i) in found]

        def program(inputs):
            return [f(*i) for f, i in zip(functions, inputs, strict=True)]

        try:
            self.lowered = jax.jit(program).lower(inputs)
        except Exception:
            return False
        self.keys, self.inputs = [key for key, _ in found], inputs
        return True

    def compile(self) -> None:
        if self.lowered is not None:
            try:
                self.compiled = self.lowered.compile()
            except Exception:
                self.compiled = None

    def finish(self) -> list[Check]:
        """Run the program, then every run's checks."""
        if self.compiled is not None:
            try:
                with np.errstate(all="ignore"):
                    results = jax.block_until_ready(self.compiled(self.inputs))
            except Exception:
                results = None
            if results is not None:
                for (n, name), result in zip(self.keys, results, strict=True):
                    self.runs[n]._memo[("piece", name)] = result
        checks: list[Check] = []
        for run in self.runs:
            checks += run.run()
        return checks


def _traces(f: Callable[..., Any], inputs: tuple[Any, ...]) -> bool:
    """Whether ``f(*inputs)`` can be traced (abstractly: nothing is compiled or run)."""
    try:
        jax.eval_shape(f, *inputs)
    except Exception:
        return False
    return True


def run_checks(runs: Sequence[DtypeRun]) -> list[Check]:
    """Run each run's checks, their compiled pieces compiled together first."""
    program = SharedProgram(runs)
    program.compile()
    return program.finish()


def invalid_checks(fn: Callable[..., Any], invalid: Sequence[tuple[Any, type[BaseException]]]) -> list[Check]:
    """One check per invalid case: calling ``fn`` with those arguments must raise that exception."""
    checks = []
    for n, (arguments, expected) in enumerate(invalid):
        arguments = tuple(arguments) if isinstance(arguments, tuple | list) else (arguments,)
        shown = ", ".join(cmp.describe_array(np.asarray(a)) for a in arguments)

        def body(arguments=arguments, expected=expected, shown=shown):
            try:
                out = fn(*arguments)
                jax.block_until_ready(out)
            except expected as e:
                return f"fn({shown}) raised {exception_text(e)}, as required"
            except Exception as e:
                raise CheckFailed(f"fn({shown}) raised {exception_text(e)}; expected {expected.__name__}.") from e
            raise CheckFailed(f"fn({shown}) returned {cmp.describe_array(out)}; expected {expected.__name__}.")

        checks.append(run_check(f"invalid[{n}]", None, body))
    return checks
