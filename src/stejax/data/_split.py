"""A deterministic, stratified, duplicate-free train/validation/test split."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import operator

import numpy as np

from stejax.data._dataset import Dataset

__all__ = ["Splits", "assert_disjoint", "split"]

_SPLIT_NAMES = ("train", "val", "test")


@dataclasses.dataclass(frozen=True, eq=False)
class Splits:
    """The three parts of a dataset made by :func:`split`, and how they were made.

    Attributes:
      train: the training part.
      val: the validation part (empty when ``val_fraction=0``).
      test: the test part (empty when ``test_fraction=0``).
      seed: the seed the split was drawn with.
      train_index: int64 ``(len(train),)``, ascending: the rows of the original
        dataset that make up ``train``, in order. Likewise ``val_index`` and
        ``test_index``.
      n_duplicates: how many rows were dropped before splitting because their
        features repeat an earlier row byte for byte.
    """

    train: Dataset
    val: Dataset
    test: Dataset
    seed: int
    train_index: np.ndarray  # int64 (len(train),)
    val_index: np.ndarray  # int64 (len(val),)
    test_index: np.ndarray  # int64 (len(test),)
    n_duplicates: int


def _row_hashes(x: np.ndarray) -> list[str]:
    # SHA-256 of each row's float32 bytes: identical bytes <=> identical example (0.0 and
    # -0.0 differ, which is fine: a loader never produces -0.0 from integer pixels).
    x = np.ascontiguousarray(x, dtype=np.float32)
    return [hashlib.sha256(row.tobytes()).hexdigest() for row in x]


def _check_fraction(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"split: {name} must be a float, got {type(value).__name__}")
    if not (math.isfinite(value) and 0 <= value < 1):
        raise ValueError(f"split: {name} must be in [0, 1), got {value}")
    return float(value)


def _round_half_up(value: float) -> int:
    return math.floor(value + 0.5)


def _take(dataset: Dataset, index: np.ndarray, part: str) -> Dataset:
    return dataclasses.replace(dataset, x=dataset.x[index], y=dataset.y[index], name=f"{dataset.name}[{part}]")


def split(dataset: Dataset, *, seed: int, val_fraction: float = 0.15, test_fraction: float = 0.15) -> Splits:
    r"""Split a dataset into train, validation and test parts, stratified by class.

    Duplicates first: a row whose features equal an earlier row's byte for byte
    (same SHA-256 of its float32 bytes) is dropped, keeping the first occurrence and
    its label, so no example can sit in two parts; :attr:`Splits.n_duplicates`
    counts the dropped rows. (Real sets do hold exact duplicate images; the
    scikit-learn digits hold none.)

    Then each class :math:`c` with :math:`n_c` remaining rows gets
    :math:`\lfloor n_c \cdot f_{test} + 1/2 \rfloor` test rows and
    :math:`\lfloor n_c \cdot f_{val} + 1/2 \rfloor` validation rows, the rest going
    to training. So the validation and test counts of each class are within half
    an example of their targets, the training count within one (never negative,
    since the fractions sum below 1).
    Which rows go where is drawn with ``np.random.default_rng(seed)``: one
    permutation per class, classes in ascending order. The same dataset and seed
    give the same split on every machine; the parts keep the original row order.
    Finally :func:`assert_disjoint` checks the result.

    Args:
      dataset: the dataset to split.
      seed: a non-negative int (required keyword; there is no default seed).
      val_fraction: the fraction of each class for validation, in ``[0, 1)``.
        Default 0.15.
      test_fraction: the fraction of each class for testing, in ``[0, 1)``.
        Default 0.15. ``val_fraction + test_fraction`` must be below 1.

    Returns:
      :class:`Splits` with parts named ``"<name>[train]"``, ``"<name>[val]"`` and
      ``"<name>[test]"``, each with the dataset's ``n_classes`` and image shape.

    Raises:
      TypeError: ``seed`` is not an int or a fraction is not a number.
      ValueError: ``seed`` is negative, a fraction is outside ``[0, 1)`` or they sum
        to 1 or more.

    Example:
      >>> from stejax.data import load_digits, split
      >>> parts = split(load_digits(), seed=0)
      >>> len(parts.train), len(parts.val), len(parts.test), parts.n_duplicates
      (1259, 269, 269, 0)
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"split: dataset must be a Dataset, got {type(dataset).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise TypeError(f"split: seed must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"split: seed must be non-negative, got {seed}")
    val_fraction = _check_fraction("val_fraction", val_fraction)
    test_fraction = _check_fraction("test_fraction", test_fraction)
    if val_fraction + test_fraction >= 1:
        raise ValueError(
            f"split: val_fraction + test_fraction must be below 1 to leave training data, got "
            f"{val_fraction} + {test_fraction} = {val_fraction + test_fraction}"
        )

    seen: set[str] = set()
    keep = np.zeros(len(dataset), dtype=bool)
    for i, digest in enumerate(_row_hashes(dataset.x)):
        if digest not in seen:
            seen.add(digest)
            keep[i] = True

    rng = np.random.default_rng(operator.index(seed))
    parts: dict[str, list[np.ndarray]] = {name: [] for name in _SPLIT_NAMES}
    kept = np.flatnonzero(keep)
    # A stable sort by label groups the rows by class, each group in ascending row order.
    by_class = kept[np.argsort(dataset.y[kept], kind="stable")]
    _, starts = np.unique(dataset.y[by_class], return_index=True)
    for rows in np.split(by_class, starts[1:]):
        n_test = _round_half_up(rows.size * test_fraction)
        n_val = _round_half_up(rows.size * val_fraction)
        shuffled = rows[rng.permutation(rows.size)]
        parts["test"].append(shuffled[:n_test])
        parts["val"].append(shuffled[n_test : n_test + n_val])
        parts["train"].append(shuffled[n_test + n_val :])
    index = {name: np.sort(np.concatenate([np.empty(0, np.int64), *rows])) for name, rows in parts.items()}
    splits = Splits(
        train=_take(dataset, index["train"], "train"),
        val=_take(dataset, index["val"], "val"),
        test=_take(dataset, index["test"], "test"),
        seed=int(seed),
        train_index=index["train"],
        val_index=index["val"],
        test_index=index["test"],
        n_duplicates=int((~keep).sum()),
    )
    assert_disjoint(splits)
    return splits


def assert_disjoint(splits: Splits) -> None:
    """Check that no example appears in two parts of a split, by content.

    Two rows are the same example when their float32 feature bytes have the same
    SHA-256, whatever their labels or positions. Duplicates inside one part are
    not an error here.

    Args:
      splits: the split to check.

    Raises:
      ValueError: naming the SHA-256 of the first shared example, the two parts and
        the row in each, and how many examples are shared in all.

    Example:
      >>> from stejax.data import assert_disjoint, load_digits, split
      >>> assert_disjoint(split(load_digits(), seed=0))  # silent when disjoint
    """
    first_row: dict[str, tuple[str, int]] = {}
    clashes: list[tuple[str, str, int, str, int]] = []
    for part in _SPLIT_NAMES:
        local: dict[str, int] = {}
        for row, digest in enumerate(_row_hashes(getattr(splits, part).x)):
            local.setdefault(digest, row)
        for digest, row in local.items():
            if digest in first_row:
                other, other_row = first_row[digest]
                clashes.append((digest, other, other_row, part, row))
            else:
                first_row[digest] = (part, row)
    if clashes:
        digest, part_a, row_a, part_b, row_b = clashes[0]
        raise ValueError(
            f"split is not disjoint: the example with sha256 {digest} is in both {part_a!r} "
            f"(row {row_a}) and {part_b!r} (row {row_b}); {len(clashes)} shared examples in all"
        )
