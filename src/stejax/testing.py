"""Test helpers: assert that a surrogate estimator keeps its contract, in one line of a test."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from stejax.verify import Report, check_surrogate

__all__ = ["assert_surrogate"]


def assert_surrogate(
    fn: Callable[..., Any],
    *,
    reference: Callable[..., Any],
    derivative: Callable[..., Any] | None = None,
    tangent_map: Callable[..., Any] | None = None,
    args: Sequence[Any] | None = None,
    boundaries: Iterable[float] = (),
    dtypes: Iterable[Any] | None = None,
    invalid: Iterable[tuple[Any, type[BaseException]]] = (),
    diff_argnums: Sequence[int] | None = None,
    composition_dtypes: str | Iterable[Any] = "all",
    seed: int = 0,
    key: Any = None,
    params: Mapping[str, Any] | None = None,
    name: str | None = None,
) -> Report:
    """:func:`stejax.verify.check_surrogate`, raising AssertionError when a check fails.

    Takes the same arguments, every one of them (``key=`` for a random
    estimator, ``params=`` for static keywords, ``name=`` for the report's
    title). The message lists every failing check with its detail, and the
    report's notes (a reference that is ``fn`` itself proves nothing about the
    forward).

    Returns:
      The :class:`~stejax.verify.Report`, when every check passed.

    Raises:
      AssertionError: a check failed.

    Example:
      >>> import jax.numpy as jnp, stejax
      >>> from stejax.testing import assert_surrogate
      >>> _ = assert_surrogate(stejax.floor_ste, reference=jnp.floor,
      ...                      derivative=jnp.ones_like, boundaries=(0.0, 1.0),
      ...                      dtypes=("float32",))
    """
    report = check_surrogate(
        fn,
        reference=reference,
        derivative=derivative,
        tangent_map=tangent_map,
        args=args,
        boundaries=boundaries,
        dtypes=dtypes,
        invalid=invalid,
        diff_argnums=diff_argnums,
        composition_dtypes=composition_dtypes,
        seed=seed,
        key=key,
        params=params,
        name=name,
    )
    if not report.ok:
        lines = [report.summary() + ":"]
        lines += [f"  {c.name}: {c.detail}" for c in report.failures]
        lines += [f"  note: {n}" for n in report.notes]
        raise AssertionError("\n".join(lines))
    return report
