"""One explicit stream of PRNG keys, and a debug mode that proves no key is used twice.

stejax never draws randomness from hidden state. A typed key (``jax.random.key``)
enters at the top (the training loop) and is split, with :func:`split`, into one
subkey per consumer: one per layer at initialisation, one for each epoch's shuffle,
one for a stochastic estimator, one per layer for dropout. A function that draws
from a key marks it with :func:`consume` just before the draw. Both are plain
``jax.random`` calls when nothing is checking, so they cost nothing under ``jit``.

The debug mode, :func:`checked`, proves the rule "every subkey is consumed by
exactly one random operation" for a run of eager code: inside the ``with`` block a
:class:`KeyLedger` records, for the raw bits of every key (``jax.random.key_data``),
where it was made and the first place that consumed it (a split consumes its
parent). Consuming the same bits a second time raises :class:`KeyReuseError`,
which names both places. The block also turns on JAX's own checker
(``jax.debug_key_reuse(True)``, the ``jax_debug_key_reuse`` flag), which follows
keys through ``jit``, ``vmap`` and ``grad`` by static analysis but cannot say
where the first use was.

The ledger sees concrete keys only. Under ``jit`` or inside ``vmap`` a key is a
tracer without bits, so :func:`split` and :func:`consume` record nothing there and
JAX's checker is the only guard. To check a jitted training step with the ledger,
run it once eagerly in debug mode::

    with jax.disable_jit(), stejax.keys.checked() as ledger:
        state = step(state, batch, key)

Example:
  >>> import jax
  >>> from stejax import keys
  >>> with keys.checked():
  ...     k_init, k_data = keys.split(jax.random.key(0), where="root")
  ...     w = jax.random.normal(keys.consume(k_init, where="init"), (2,))
  ...     try:
  ...         jax.random.normal(keys.consume(k_init, where="dropout"), (2,))
  ...     except keys.KeyReuseError as e:
  ...         print(str(e).splitlines()[0])  # doctest: +ELLIPSIS
  PRNG key 0x... was consumed twice: first at init, again at dropout.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass

import jax
import numpy as np

__all__ = ["KeyLedger", "KeyReuseError", "check_key", "checked", "consume", "split"]

# The ledger of the innermost `checked()` block; None outside one. A context
# variable rather than a module global, so that threads and nested blocks do not
# see each other's ledgers.
_ACTIVE_LEDGER: contextvars.ContextVar[KeyLedger | None] = contextvars.ContextVar("stejax_key_ledger", default=None)


class KeyReuseError(jax.errors.KeyReuseError):
    """A PRNG key was consumed by a second random operation.

    A subclass of ``jax.errors.KeyReuseError``, so one ``except`` catches the
    ledger's error and JAX's own.

    Attributes:
      key_bits: the hex digits of the key's raw bits (``jax.random.key_data``).
      first: where the key was consumed first.
      second: where it was consumed again.
      made: where the key was made (by :func:`split`), or None if unknown.
    """

    def __init__(self, key_bits: str, first: str, second: str, made: str | None = None):
        self.key_bits = key_bits
        self.first = first
        self.second = second
        self.made = made
        origin = f"It was made at {made}." if made else "It was not made by stejax.keys.split."
        super().__init__(
            f"PRNG key 0x{key_bits} was consumed twice: first at {first}, again at {second}.\n"
            f"{origin} Split the key and give each random operation its own subkey."
        )


@dataclass(frozen=True)
class _Use:
    made: str | None
    consumed: str | None


class KeyLedger:
    """A record, by raw key bits, of where each key was made and first consumed.

    A debug tool, used through :func:`checked`; it is mutable on purpose (it
    records a run as it happens) and is never part of a pure computation.
    """

    def __init__(self) -> None:
        self._uses: dict[tuple[str, bytes], _Use] = {}

    def __len__(self) -> int:
        return len(self._uses)

    def made(self, key: jax.Array, where: str) -> None:
        """Record that ``key`` (each key, for an array of keys) was made at ``where``."""
        for bits in _bits_of(key):
            use = self._uses.get(bits)
            self._uses[bits] = _Use(made=where, consumed=use.consumed if use else None)

    def consumed(self, key: jax.Array, where: str) -> None:
        """Record that ``key`` (each key, for an array of keys) was consumed at ``where``.

        Raises:
          KeyReuseError: the key was consumed before; the message names both places.
        """
        for bits in _bits_of(key):
            use = self._uses.get(bits, _Use(made=None, consumed=None))
            if use.consumed is not None:
                raise KeyReuseError(bits[1].hex(), use.consumed, where, use.made)
            self._uses[bits] = _Use(made=use.made, consumed=where)

    def unused(self) -> tuple[str, ...]:
        """Where each key that was made by :func:`split` but never consumed was made.

        Not an error: a training loop carries one key forward unconsumed. A subkey
        listed here twice, though, is randomness that was split off and dropped.
        """
        return tuple(u.made for u in self._uses.values() if u.consumed is None and u.made is not None)


def check_key(key: object, *, what: str = "key") -> jax.Array:
    """``key`` if it is a typed PRNG key (``jax.random.key``); TypeError otherwise.

    Raw ``uint32`` keys (``jax.random.PRNGKey``) are refused: their bits are an
    ordinary array that arithmetic could silently change.
    """
    if not (isinstance(key, jax.Array) and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)):
        got = f"dtype {key.dtype}" if hasattr(key, "dtype") else f"{type(key).__name__}"
        raise TypeError(
            f"{what} must be a typed PRNG key made by jax.random.key(seed); got {got}. "
            "Wrap a raw uint32 key with jax.random.wrap_key_data(raw)."
        )
    return key


def split(key: jax.Array, num: int = 2, *, where: str | None = None) -> jax.Array:
    """Split ``key`` into ``num`` new keys; the one way keys are made in stejax.

    Exactly ``jax.random.split(key, num)`` (an array of ``num`` keys, which
    unpacks: ``a, b = split(key)``). Inside :func:`checked` the parent counts as
    consumed and each child is recorded as made at ``where``.

    Args:
      key: a typed PRNG key of shape ``()``.
      num: the number of keys, an int >= 1 (default 2).
      where: a label for the split in debug messages (default: the caller's
        ``file:line``).

    Returns:
      A key array of shape ``(num,)``.

    Raises:
      TypeError: ``key`` is not a typed key or ``num`` is not an int.
      ValueError: ``num`` < 1, or ``key`` is not a single key.
      KeyReuseError: in debug mode, ``key`` was consumed before.
    """
    check_key(key)
    if isinstance(num, bool) or not isinstance(num, (int, np.integer)):
        raise TypeError(f"split: num must be an int; got {num!r} of type {type(num).__name__}.")
    if num < 1:
        raise ValueError(f"split: num must be >= 1; got {num}.")
    if key.shape != ():
        raise ValueError(f"split: key must be a single key of shape (); got shape {key.shape}.")
    ledger = _ACTIVE_LEDGER.get()
    if ledger is not None and not _is_concrete(key):
        ledger = None
    if ledger is not None:
        # Before the split, so that the ledger's message (naming both places)
        # comes ahead of JAX's own check.
        here = _place(where)
        ledger.consumed(key, f"split at {here}")
    children = jax.random.split(key, int(num))
    if ledger is not None:
        ledger.made(children, here)
    return children


def consume(key: jax.Array, *, where: str | None = None) -> jax.Array:
    """Mark ``key`` as used by one random operation, and return it unchanged.

    Call it on the key passed to a ``jax.random`` draw or a random estimator:
    ``jax.random.bernoulli(consume(k, where="dropout"), p, shape)``. An array of
    keys (one per example, for ``vmap``) marks each of them. Outside
    :func:`checked`, and on traced keys, it does nothing.

    Args:
      key: a typed PRNG key, or an array of them.
      where: a label for the random operation in debug messages (default: the
        caller's ``file:line``).

    Returns:
      ``key``, the same object.

    Raises:
      TypeError: ``key`` is not a typed key.
      KeyReuseError: in debug mode, the key was consumed before.
    """
    check_key(key)
    ledger = _ACTIVE_LEDGER.get()
    if ledger is not None and _is_concrete(key):
        ledger.consumed(key, _place(where))
    return key


@contextlib.contextmanager
def checked(*, jax_check: bool = True) -> Iterator[KeyLedger]:
    """Debug mode: a fresh :class:`KeyLedger` for the block, and JAX's own key-reuse check.

    Inside the block :func:`split` and :func:`consume` record every concrete key
    and raise :class:`KeyReuseError` at the second consumption of one. With
    ``jax_check`` (the default) the block also runs under
    ``jax.debug_key_reuse(True)``, which checks traced code (``jit``, ``vmap``)
    and raises ``jax.errors.KeyReuseError`` (of which :class:`KeyReuseError` is
    a subclass). Blocks nest; the inner one has its own ledger.

    Args:
      jax_check: also turn on the ``jax_debug_key_reuse`` flag for the block.

    Yields:
      The block's ledger.
    """
    ledger = KeyLedger()
    token = _ACTIVE_LEDGER.set(ledger)
    try:
        with jax.debug_key_reuse(True) if jax_check else contextlib.nullcontext():
            yield ledger
    finally:
        _ACTIVE_LEDGER.reset(token)


def _is_concrete(key: jax.Array) -> bool:
    return not isinstance(key, jax.core.Tracer)


def _bits_of(key: jax.Array) -> list[tuple[str, bytes]]:
    """The raw bits of each key in ``key`` (one entry for a single key)."""
    data = np.asarray(jax.random.key_data(key))
    per_key = data.reshape(-1, data.shape[-1]) if key.ndim else data.reshape(1, -1)
    # The implementation's name is part of the identity: equal bits under two
    # different PRNGs are different streams.
    impl = str(jax.random.key_impl(key))
    return [(impl, row.tobytes()) for row in per_key]


def _place(where: str | None) -> str:
    """``where`` if given, else the ``file:line`` of the first caller outside this module."""
    if where is not None:
        return where
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    if frame is None:  # pragma: no cover - only this module on the stack
        return "<unknown>"
    path = frame.f_code.co_filename
    rel = os.path.relpath(path) if os.path.isabs(path) else path
    shown = path if rel.startswith("..") else rel
    return f"{shown}:{frame.f_lineno}"
