r"""Reference bits per byte on the same text: byte n-gram models and general-purpose compressors.

Both are computed by the benchmark itself on the bytes the models are scored on.

* **n-gram** of order :math:`n` (context of :math:`n-1` bytes), add-:math:`k`
  smoothed: :math:`P(b \mid c) = (N(c, b) + k) / (N(c) + 256 k)`, counts from the
  training split, :math:`k` chosen on the validation split from :data:`K_GRID`.
  The first :math:`n-1` bytes of a stream see zero bytes as context; the very
  first byte is not scored (nor is it by the models).
* **Compressors** (zlib level 9, bz2 level 9, xz preset 9): the cost of the
  scored text given the training split as context, :math:`8(|C(\text{train} +
  \text{text})| - |C(\text{train})|) / |\text{text}|`.
"""

from __future__ import annotations

import bz2
import lzma
import math
import zlib

import numpy as np

__all__ = ["K_GRID", "compressor_bpb", "ngram_bpb", "references"]

K_GRID = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)


def _grams(stream: np.ndarray, order: int) -> tuple[np.ndarray, np.ndarray]:
    """(context id, context id * 256 + next byte) for every byte of ``stream``, zero-padded on the left."""
    pad = np.concatenate([np.zeros(order - 1, np.int64), stream.astype(np.int64)])
    ctx = np.zeros(stream.size, np.int64)
    for j in range(order - 1):
        ctx = ctx * 256 + pad[j : j + stream.size]
    return ctx, ctx * 256 + stream.astype(np.int64)


def _lookup(keys: np.ndarray, counts: np.ndarray, queries: np.ndarray) -> np.ndarray:
    at = np.clip(np.searchsorted(keys, queries), 0, max(keys.size - 1, 0))
    return np.where(keys[at] == queries, counts[at], 0) if keys.size else np.zeros(queries.size, np.int64)


def ngram_bpb(
    train: np.ndarray, validation: np.ndarray, text: np.ndarray, order: int, *, ks: tuple[float, ...] = K_GRID
) -> dict[str, float]:
    """Bits per byte of ``text`` under an add-k byte n-gram fitted on ``train``, k chosen on ``validation``.

    Returns:
      ``{"bpb": ..., "k": ..., "validation_bpb": ...}``.

    Example:
      >>> import numpy as np
      >>> t = np.frombuffer(b"abababababab", np.uint8)
      >>> ngram_bpb(t, t, t, 2)["bpb"] < ngram_bpb(t, t, t, 1)["bpb"]
      True
    """
    if order < 1:
        raise ValueError(f"ngram_bpb: order must be >= 1; got {order}.")
    ctx, full = _grams(train, order)
    ctx_keys, ctx_counts = np.unique(ctx, return_counts=True)
    full_keys, full_counts = np.unique(full, return_counts=True)

    def bits(stream: np.ndarray, k: float) -> float:
        c, f = _grams(stream, order)
        n_full = _lookup(full_keys, full_counts, f)
        n_ctx = _lookup(ctx_keys, ctx_counts, c)
        # The first byte has no context at all; the models do not score it either.
        return float(-np.mean(np.log2((n_full[1:] + k) / (n_ctx[1:] + 256 * k))))

    scored = {k: bits(validation, k) for k in ks}
    best = min(scored, key=scored.__getitem__)
    return {"bpb": bits(text, best), "k": best, "validation_bpb": scored[best]}


def compressor_bpb(train: np.ndarray, text: np.ndarray, method: str) -> float:
    """Bits per byte of ``text`` for a compressor that has seen ``train`` first.

    (zlib's window is 32 KiB and bz2's block 900 kB, so only the end of
    ``train`` matters to them; xz at preset 9 sees up to 64 MiB.)

    Raises:
      ValueError: an unknown method (expected zlib, bz2 or xz).
    """
    compress = {
        "zlib": lambda b: zlib.compress(b, 9),
        "bz2": lambda b: bz2.compress(b, 9),
        "xz": lambda b: lzma.compress(b, preset=9),
    }
    if method not in compress:
        raise ValueError(f"compressor_bpb: unknown method {method!r}; expected one of {sorted(compress)}.")
    context, scored = train.tobytes(), text.tobytes()
    extra = len(compress[method](context + scored)) - len(compress[method](context))
    return 8 * extra / max(len(scored), 1)


def references(
    train: np.ndarray,
    validation: np.ndarray,
    text: np.ndarray,
    *,
    orders: tuple[int, ...] = (1, 2, 3, 4),
    context_bytes: int | None = None,
) -> dict[str, dict[str, float]]:
    """Every reference on ``text``: ``{"ngram-1": {...}, ..., "zlib": {"bpb": ...}, ...}``.

    ``context_bytes``: the compressors see only the last this many bytes of
    ``train`` (None: all of it); the n-grams always count all of ``train``.
    """
    out: dict[str, dict[str, float]] = {f"ngram-{n}": ngram_bpb(train, validation, text, n) for n in orders}
    context = train if context_bytes is None else train[-context_bytes:]
    for method in ("zlib", "bz2", "xz"):
        out[method] = {"bpb": compressor_bpb(context, text, method), "context_bytes": int(context.size)}
    for name, value in out.items():
        if not math.isfinite(value["bpb"]):
            raise FloatingPointError(f"references: {name} gave {value['bpb']} bits per byte.")
    return out
