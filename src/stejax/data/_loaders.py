"""Loaders: the scikit-learn digits set, and a user's own data from .npz or IDX files."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

from stejax.data._dataset import Dataset, features_from_raw, labels_from_raw
from stejax.data._idx import read_idx

__all__ = ["DIGITS_NAME", "load_digits", "load_idx", "load_npz"]


# The name load_digits gives its dataset (and run directories record).
DIGITS_NAME = "sklearn-digits"


def load_digits() -> Dataset:
    r"""The 8x8 handwritten digits that ship inside scikit-learn (no download).

    1797 greyscale images of the digits 0 to 9 (about 180 per class), each an 8x8
    grid of counts in 0..16 (the number of "on" pixels in a 4x4 block of the
    original 32x32 bitmap). Feature order: row-major, pixel :math:`(r, c)` is
    feature :math:`8r + c`, the same order as ``sklearn.datasets.load_digits().data``
    and ``.images[i].reshape(64)``. The set has no duplicate images.

    Needs scikit-learn, an optional dependency imported only here.

    Returns:
      A :class:`Dataset` with ``x`` float32 ``(1797, 64)`` holding whole numbers in
      ``[0, 16]``, ``y`` int32 in ``[0, 10)``, ``n_classes=10``,
      ``image_shape=(8, 8, 1)`` and ``name="sklearn-digits"``.

    Raises:
      ImportError: scikit-learn is not installed.

    Example:
      >>> from stejax.data import load_digits
      >>> digits = load_digits()
      >>> digits.x.shape, digits.x.dtype.name, digits.n_classes, digits.image_shape
      ((1797, 64), 'float32', 10, (8, 8, 1))

    Reference:
      E. Alpaydin, C. Kaynak, "Optical Recognition of Handwritten Digits",
      UCI Machine Learning Repository, 1998.
    """
    try:
        from sklearn.datasets import load_digits as _sklearn_load_digits
    except ImportError as e:
        raise ImportError("load_digits needs scikit-learn, an optional dependency: pip install scikit-learn") from e
    bunch = _sklearn_load_digits()
    # The counts are whole numbers in 0..16, so float64 -> float32 is exact.
    images = np.asarray(bunch.images).reshape(-1, 8, 8)
    x, image_shape, _ = features_from_raw(images, "sklearn.datasets.load_digits")
    y, _ = labels_from_raw(np.asarray(bunch.target), 10, "sklearn.datasets.load_digits")
    return Dataset(
        x=x,
        y=y,
        n_classes=10,
        image_shape=image_shape,
        feature_order="row-major pixels: pixel (r, c) of the 8x8 image is feature 8*r + c; values 0..16",
        name=DIGITS_NAME,
    )


def load_npz(path: str | os.PathLike, *, x_key: str = "x", y_key: str = "y", n_classes: int | None = None) -> Dataset:
    """Load a labelled dataset from a NumPy ``.npz`` archive (as ``np.savez`` writes).

    The features array may be ``(N, F)``, ``(N, H, W)`` greyscale images or
    ``(N, H, W, C)`` images of any bool, integer or float dtype; images are
    flattened row-major (pixel ``(r, c, ch)`` is feature ``(r * W + c) * C + ch``)
    and ``image_shape`` records ``(H, W, C)``. Features become float32 and must be
    finite. Labels are a 1-D integer array (or floats holding whole numbers).
    Pickled objects are never loaded.

    Args:
      path: the ``.npz`` file.
      x_key: the name of the features array in the archive. Default ``"x"``.
      y_key: the name of the labels array. Default ``"y"``.
      n_classes: the number of classes; labels must lie in ``[0, n_classes)``.
        Default ``None``: ``max(label) + 1``.

    Returns:
      A :class:`Dataset` named after the file, with ``source=(str(path),)``.

    Raises:
      FileNotFoundError: no such file.
      ValueError: not an ``.npz`` archive, a key is missing, the features are not
        2-D after flattening each example, the counts of features and labels
        differ, a label is negative, out of range or not a whole number, or a
        feature is NaN or infinite. The message names the file, the key, what was
        expected and what came (with the first bad index).

    Example:
      >>> import os, tempfile, numpy as np
      >>> from stejax.data import load_npz
      >>> path = os.path.join(tempfile.mkdtemp(), "tiny.npz")
      >>> np.savez(path, x=np.zeros((4, 3, 3), np.uint8), y=np.array([0, 1, 2, 1]))
      >>> ds = load_npz(path)
      >>> ds.x.shape, ds.n_classes, ds.image_shape
      ((4, 9), 3, (3, 3, 1))
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such .npz file")
    try:
        archive = np.load(path, allow_pickle=False)
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
        raise ValueError(f"{path}: not a readable .npz archive ({e})") from e
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: expected an .npz archive of named arrays, got a single .npy array")
    with archive:
        arrays = {}
        for role, key in (("features", x_key), ("labels", y_key)):
            if key not in archive.files:
                raise ValueError(f"{path}: no {role} array named {key!r}; the archive holds {sorted(archive.files)}")
            try:
                arrays[role] = archive[key]
            except ValueError as e:  # an object array, which would need pickle
                raise ValueError(f"{path} (key {key!r}): cannot load array without pickle ({e})") from e
    x, image_shape, order = features_from_raw(arrays["features"], f"{path} (key {x_key!r})")
    y, n_classes = labels_from_raw(arrays["labels"], n_classes, f"{path} (key {y_key!r})")
    if x.shape[0] != y.shape[0]:
        raise ValueError(
            f"{path}: {x.shape[0]} examples under key {x_key!r} but {y.shape[0]} labels under key "
            f"{y_key!r}; expected one label per example"
        )
    return Dataset(
        x=x,
        y=y,
        n_classes=n_classes,
        image_shape=image_shape,
        feature_order=order,
        name=path.name,
        source=(str(path),),
    )


def load_idx(
    images_path: str | os.PathLike, labels_path: str | os.PathLike, *, n_classes: int | None = None
) -> Dataset:
    """Load a labelled dataset from a pair of IDX files, as MNIST is distributed.

    The images file holds ``(N, F)``, ``(N, H, W)`` or ``(N, H, W, C)`` data of any
    IDX type; the labels file a rank-1 array of ``N`` labels. Files whose names end
    in ``.gz`` are decompressed. See :func:`read_idx` for the format. Images are
    flattened row-major to float32 (pixel ``(r, c, ch)`` is feature
    ``(r * W + c) * C + ch``), so MNIST gives ``x`` of shape ``(N, 784)`` with
    values 0..255 and ``image_shape=(28, 28, 1)``.

    Args:
      images_path: the IDX file of features.
      labels_path: the IDX file of labels.
      n_classes: the number of classes; labels must lie in ``[0, n_classes)``.
        Default ``None``: ``max(label) + 1``.

    Returns:
      A :class:`Dataset` named after the images file, with
      ``source=(str(images_path), str(labels_path))``.

    Raises:
      FileNotFoundError: either file is missing.
      ValueError: a malformed IDX file (see :func:`read_idx`), images not 2-D
        after flattening each example, labels not rank 1, different counts of
        images and labels, a label negative, out of range or not a whole number,
        or a NaN or infinite feature. The message names the file.

    Example:
      >>> import os, tempfile, numpy as np
      >>> from stejax.data import load_idx, write_idx
      >>> folder = tempfile.mkdtemp()
      >>> images, labels = os.path.join(folder, "img.idx"), os.path.join(folder, "lab.idx")
      >>> write_idx(images, np.zeros((5, 28, 28), np.uint8))
      >>> write_idx(labels, np.array([7, 2, 1, 0, 4], np.uint8))
      >>> ds = load_idx(images, labels, n_classes=10)
      >>> ds.x.shape, ds.image_shape, len(ds)
      ((5, 784), (28, 28, 1), 5)
    """
    images_path, labels_path = Path(images_path), Path(labels_path)
    for path in (images_path, labels_path):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such IDX file")
    x, image_shape, order = features_from_raw(read_idx(images_path), f"{images_path} (IDX images)")
    y, n_classes = labels_from_raw(read_idx(labels_path), n_classes, f"{labels_path} (IDX labels)")
    if x.shape[0] != y.shape[0]:
        raise ValueError(
            f"{images_path} holds {x.shape[0]} images but {labels_path} holds {y.shape[0]} labels; "
            "expected one label per image"
        )
    return Dataset(
        x=x,
        y=y,
        n_classes=n_classes,
        image_shape=image_shape,
        feature_order=order,
        name=images_path.name,
        source=(str(images_path), str(labels_path)),
    )
