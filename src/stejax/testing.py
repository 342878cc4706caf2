"""Test helpers: assert that a surrogate estimator keeps its contract, in one line of a test."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
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
    seed: int = 0,
) -> Report:
    """:func:`stejax.verify.check_surrogate`, raising AssertionError when a check fails.

    Takes the same arguments. The message lists every failing check with its
    detail.

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
        seed=seed,
    )
    if not report.ok:
        lines = [report.summary() + ":"]
        lines += [f"  {c.name}: {c.detail}" for c in report.failures]
        raise AssertionError("\n".join(lines))
    return report
