"""The in-memory dataset record and the checks every loader runs on raw arrays."""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["Dataset"]

# Largest label count that still fits the int32 labels.
_MAX_CLASSES = int(np.iinfo(np.int32).max)


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
    """A labelled classification dataset: plain, validated, read-only arrays.

    Every loader returns one of these, and :func:`stejax.data.split` returns three.
    Construction checks the fields (so any ``Dataset`` is well formed) and stores
    read-only views of the arrays, so the record cannot be changed in place; make a
    new one with :func:`dataclasses.replace` instead.

    Attributes:
      x: features, float32, shape ``(N, F)``, all finite. Images are flattened in
        row-major (C) order: pixel ``(r, c, ch)`` of an ``(H, W, C)`` image is
        feature ``(r * W + c) * C + ch``.
      y: labels, int32, shape ``(N,)``, each in ``[0, n_classes)``.
      n_classes: the number of classes (a positive int). It may exceed
        ``y.max() + 1`` when a class has no examples here (a small split, say).
      image_shape: ``(H, W, C)`` with ``H * W * C == F`` when the features are an
        image, else ``None``.
      feature_order: a sentence saying what feature ``j`` is, for run records.
      name: a short name, e.g. ``"sklearn-digits"`` or a file name.
      source: the files the data was read from, as strings (one for ``.npz``, the
        images file then the labels file for IDX); empty for data made in memory or
        taken from scikit-learn.

    Raises:
      TypeError: an array is not a NumPy array of the required dtype, or a field
        has the wrong type.
      ValueError: shapes disagree, a label is out of range, a feature is NaN or
        infinite, or ``image_shape`` does not match ``F``.
    """

    x: np.ndarray  # float32 (N, F)
    y: np.ndarray  # int32 (N,)
    n_classes: int
    image_shape: tuple[int, int, int] | None = None
    feature_order: str = "features in the column order of x"
    name: str = "unnamed"
    source: tuple[str, ...] = ()

    def __post_init__(self):
        where = f"Dataset {self.name!r}"
        if not isinstance(self.name, str):
            raise TypeError(f"Dataset: name must be a str, got {type(self.name).__name__}")
        if not isinstance(self.feature_order, str):
            raise TypeError(f"{where}: feature_order must be a str, got {type(self.feature_order).__name__}")
        if not isinstance(self.source, tuple) or not all(isinstance(s, str) for s in self.source):
            raise TypeError(f"{where}: source must be a tuple of str, got {self.source!r}")
        _check_class_count(self.n_classes, where)
        for field, dtype, ndim in (("x", np.float32, 2), ("y", np.int32, 1)):
            value = getattr(self, field)
            if not isinstance(value, np.ndarray) or value.dtype != dtype:
                got = value.dtype if isinstance(value, np.ndarray) else type(value).__name__
                raise TypeError(f"{where}: {field} must be a numpy {np.dtype(dtype).name} array, got {got}")
            if value.ndim != ndim:
                raise ValueError(f"{where}: {field} must be {ndim}-D, got shape {value.shape}")
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(
                f"{where}: x has {self.x.shape[0]} rows but y has {self.y.shape[0]} labels; expected one label per row"
            )
        if self.image_shape is not None:
            shape = self.image_shape
            if (
                not isinstance(shape, tuple)
                or len(shape) != 3
                or not all(isinstance(s, int) and s > 0 for s in shape)
                or int(np.prod(shape)) != self.x.shape[1]
            ):
                raise ValueError(
                    f"{where}: image_shape must be a tuple (H, W, C) of positive ints with "
                    f"H * W * C == {self.x.shape[1]} features, got {shape!r}"
                )
        _check_finite(self.x, where)
        _check_label_range(self.y, self.n_classes, where)
        for field in ("x", "y"):
            view = getattr(self, field).view()
            view.flags.writeable = False
            object.__setattr__(self, field, view)

    def __len__(self) -> int:
        """The number of examples ``N``."""
        return int(self.y.shape[0])


def _check_class_count(n_classes, where: str) -> None:
    if isinstance(n_classes, bool) or not isinstance(n_classes, int | np.integer):
        raise TypeError(f"{where}: n_classes must be an int, got {type(n_classes).__name__}")
    if not 1 <= n_classes <= _MAX_CLASSES:
        raise ValueError(f"{where}: n_classes must be in [1, {_MAX_CLASSES}], got {n_classes}")


def _check_finite(x: np.ndarray, where: str, original: np.ndarray | None = None) -> None:
    bad = ~np.isfinite(x)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        value = (x if original is None else original)[row, col]
        reason = " (too large for float32)" if np.isfinite(value) else ""
        raise ValueError(
            f"{where}: features must be finite float32 values, got {value}{reason} "
            f"at row {row}, feature {col} ({int(bad.any(axis=1).sum())} bad rows in all)"
        )


def _check_label_range(y: np.ndarray, n_classes: int, where: str) -> None:
    bad = (y < 0) | (y >= n_classes)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{where}: labels must be in [0, {n_classes}), got {y[i]} at index {i} ({int(bad.sum())} bad labels in all)"
        )


def features_from_raw(raw: np.ndarray, where: str) -> tuple[np.ndarray, tuple[int, int, int] | None, str]:
    """Check and flatten raw features (read from a file) to float32 ``(N, F)``.

    Rank 2 is a feature matrix; rank 3 is ``(N, H, W)`` greyscale images; rank 4 is
    ``(N, H, W, C)`` images. Returns the features, the image shape (or None) and a
    feature-order sentence. ``where`` names the file in error messages.
    """
    if raw.dtype.kind not in "biuf":
        raise ValueError(f"{where}: features must be numeric (bool, int or float), got dtype {raw.dtype}")
    if raw.ndim not in (2, 3, 4):
        raise ValueError(
            f"{where}: features must be 2-D after flattening each example, i.e. of shape (N, F), "
            f"(N, H, W) or (N, H, W, C); got shape {raw.shape}"
        )
    if raw.shape[0] == 0:
        raise ValueError(f"{where}: no examples (shape {raw.shape}); expected at least one")
    if any(s == 0 for s in raw.shape[1:]):
        raise ValueError(f"{where}: examples are empty (shape {raw.shape}); expected at least one feature")
    if raw.ndim == 2:
        image_shape = None
        order = "features in the column order of the file"
    else:
        h, w = int(raw.shape[1]), int(raw.shape[2])
        c = int(raw.shape[3]) if raw.ndim == 4 else 1
        image_shape = (h, w, c)
        order = f"row-major pixels: pixel (r, c, ch) of the {h}x{w}x{c} image is feature ({w}*r + c)*{c} + ch"
    flat = raw.reshape(raw.shape[0], -1)
    # Values beyond the float32 range become inf here and are reported below.
    with np.errstate(over="ignore", invalid="ignore"):
        x = np.ascontiguousarray(flat, dtype=np.float32)
    _check_finite(x, where, original=flat)
    return x, image_shape, order


def labels_from_raw(raw: np.ndarray, n_classes: int | None, where: str) -> tuple[np.ndarray, int]:
    """Check raw labels (read from a file) and return them as int32 with the class count.

    Integer labels, or float labels holding whole numbers, are accepted. Without
    ``n_classes`` the count is ``max(label) + 1``. ``where`` names the file.
    """
    if raw.dtype.kind not in "iuf":
        raise ValueError(f"{where}: labels must be integers, got dtype {raw.dtype}")
    if raw.ndim != 1:
        raise ValueError(f"{where}: labels must be 1-D of shape (N,), got shape {raw.shape}")
    if raw.shape[0] == 0:
        raise ValueError(f"{where}: no labels; expected at least one")
    if raw.dtype.kind == "f":
        whole = np.isfinite(raw) & (raw == np.floor(raw))
        if not whole.all():
            i = int(np.flatnonzero(~whole)[0])
            raise ValueError(
                f"{where}: labels must be whole numbers, got {raw[i]} at index {i} "
                f"({int((~whole).sum())} bad labels in all)"
            )
    negative = raw < 0
    if negative.any():
        i = int(np.flatnonzero(negative)[0])
        raise ValueError(
            f"{where}: labels must be non-negative, got {raw[i]} at index {i} "
            f"({int(negative.sum())} negative labels in all)"
        )
    if n_classes is None:
        top = raw.max()
        if top >= _MAX_CLASSES:
            raise ValueError(f"{where}: labels must be below {_MAX_CLASSES}, got {top}")
        n_classes = int(top) + 1
    else:
        _check_class_count(n_classes, where)
        n_classes = int(n_classes)
        too_big = raw >= n_classes
        if too_big.any():
            i = int(np.flatnonzero(too_big)[0])
            raise ValueError(
                f"{where}: labels must be in [0, {n_classes}), got {raw[i]} at index {i} "
                f"({int(too_big.sum())} bad labels in all)"
            )
    return raw.astype(np.int32), n_classes
