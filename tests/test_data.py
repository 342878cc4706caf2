"""Tests for stejax.data: loaders, IDX files, the split, the normaliser and batches."""

from __future__ import annotations

import ast
import dataclasses
import gzip
import hashlib
import json
import re
import struct
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import stejax.data as sd
from stejax.data import (
    Dataset,
    Normalizer,
    Splits,
    assert_disjoint,
    batches,
    load_digits,
    load_idx,
    load_npz,
    read_idx,
    split,
    write_idx,
)

DATA_DIR = Path(sd.__file__).parent


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_digits()


def sha256_rows(x: np.ndarray) -> list[str]:
    """Independent content hash: SHA-256 of each row's float32 bytes."""
    return [hashlib.sha256(np.asarray(row, np.float32).tobytes()).hexdigest() for row in x]


def small_dataset(n_per_class=(12, 7, 20), n_features=5, seed=0) -> Dataset:
    """Distinct random integer-valued rows with the given class counts."""
    rng = np.random.default_rng(seed)
    y = np.concatenate([np.full(n, c, np.int32) for c, n in enumerate(n_per_class)])
    rng.shuffle(y)
    x = rng.integers(0, 1000, size=(y.size, n_features)).astype(np.float32)
    return Dataset(x=x, y=y, n_classes=len(n_per_class), name="small")


# --- the package's imports -------------------------------------------------------------------


def test_package_imports_only_numpy_and_the_standard_library():
    allowed = set(sys.stdlib_module_names) | {"numpy", "stejax"}
    for file in sorted(DATA_DIR.glob("*.py")):
        tree = ast.parse(file.read_text())
        for node in tree.body:  # module level only: load_digits imports sklearn inside
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                roots = [(node.module or "").split(".")[0]]
                if roots == ["stejax"]:
                    assert node.module.startswith("stejax.data"), (file.name, node.module)
            else:
                continue
            assert set(roots) <= allowed, (file.name, roots)


def test_public_names_are_re_exported():
    expected = {
        "Dataset",
        "Normalizer",
        "Splits",
        "DIGITS_NAME",
        "assert_disjoint",
        "batches",
        "load_digits",
        "load_idx",
        "load_npz",
        "read_idx",
        "split",
        "write_idx",
    }
    public = {name for name in vars(sd) if not name.startswith("_")}
    assert public == expected


# --- the digits set --------------------------------------------------------------------------


def test_digits_shape_dtype_and_labels(digits):
    assert digits.x.shape == (1797, 64) and digits.x.dtype == np.float32
    assert digits.y.shape == (1797,) and digits.y.dtype == np.int32
    assert digits.n_classes == 10 and digits.image_shape == (8, 8, 1)
    assert digits.name == "sklearn-digits" and digits.source == ()
    assert digits.y.min() == 0 and digits.y.max() == 9
    assert np.bincount(digits.y).min() >= 170
    assert np.array_equal(digits.x, np.round(digits.x))
    assert digits.x.min() == 0 and digits.x.max() == 16
    assert "8*r + c" in digits.feature_order
    assert len(digits) == 1797


def test_digits_feature_order_is_row_major(digits):
    from sklearn.datasets import load_digits as sklearn_digits

    images = sklearn_digits().images
    for r, c in [(0, 0), (0, 7), (3, 5), (7, 0), (7, 7)]:
        assert np.array_equal(digits.x[:, 8 * r + c], images[:, r, c].astype(np.float32))


def test_digits_have_no_duplicate_rows(digits):
    assert np.unique(digits.x, axis=0).shape[0] == digits.x.shape[0]


def test_dataset_arrays_are_read_only(digits):
    with pytest.raises(ValueError, match="read-only"):
        digits.x[0, 0] = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        digits.n_classes = 3


def test_dataset_does_not_freeze_the_callers_arrays():
    x, y = np.zeros((2, 3), np.float32), np.zeros(2, np.int32)
    Dataset(x=x, y=y, n_classes=1)
    x[0, 0] = 1.0  # still writable


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"x": np.zeros((3, 4))}, TypeError, r"x must be a numpy float32 array, got float64"),
        ({"y": np.zeros(3, np.int64)}, TypeError, r"y must be a numpy int32 array, got int64"),
        ({"x": np.zeros(3, np.float32)}, ValueError, r"x must be 2-D, got shape \(3,\)"),
        ({"y": np.zeros(2, np.int32)}, ValueError, r"x has 3 rows but y has 2 labels"),
        ({"y": np.array([0, 2, 1], np.int32)}, ValueError, r"labels must be in \[0, 2\), got 2 at index 1"),
        ({"n_classes": 0}, ValueError, r"n_classes must be in \[1, "),
        ({"n_classes": 2.0}, TypeError, r"n_classes must be an int, got float"),
        (
            {"image_shape": (2, 3, 1)},
            ValueError,
            r"image_shape must be a tuple \(H, W, C\) .* == 4 features, got \(2, 3, 1\)",
        ),
        ({"source": "file.npz"}, TypeError, r"source must be a tuple of str"),
    ],
)
def test_dataset_rejects_bad_fields(change, error, message):
    fields = {"x": np.zeros((3, 4), np.float32), "y": np.zeros(3, np.int32), "n_classes": 2, "name": "toy"}
    with pytest.raises(error, match=r"Dataset 'toy': " + message):
        Dataset(**{**fields, **change})


def test_dataset_rejects_non_finite_features_naming_the_row():
    x = np.zeros((4, 3), np.float32)
    x[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"Dataset 'toy': features must be finite .* at row 2, feature 1"):
        Dataset(x=x, y=np.zeros(4, np.int32), n_classes=1, name="toy")


# --- the split -------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize(("val_fraction", "test_fraction"), [(0.15, 0.15), (0.1, 0.25)])
def test_split_is_stratified(digits, seed, val_fraction, test_fraction):
    parts = split(digits, seed=seed, val_fraction=val_fraction, test_fraction=test_fraction)
    class_counts = np.bincount(digits.y, minlength=10)
    for part, fraction in ((parts.val, val_fraction), (parts.test, test_fraction)):
        counts = np.bincount(part.y, minlength=10)
        assert np.all(np.abs(counts - class_counts * fraction) <= 1), (counts, class_counts * fraction)
    train_fraction = 1 - val_fraction - test_fraction
    train_counts = np.bincount(parts.train.y, minlength=10)
    # Train absorbs both roundings, so it is within one example of its target too.
    assert np.all(np.abs(train_counts - class_counts * train_fraction) <= 1)
    assert len(parts.train) + len(parts.val) + len(parts.test) == len(digits)


def test_split_is_deterministic_by_seed(digits):
    a, b = split(digits, seed=3), split(digits, seed=3)
    for part in ("train", "val", "test"):
        assert np.array_equal(getattr(a, f"{part}_index"), getattr(b, f"{part}_index"))
        assert getattr(a, part).x.tobytes() == getattr(b, part).x.tobytes()
        assert getattr(a, part).y.tobytes() == getattr(b, part).y.tobytes()
    assert a.seed == 3


def test_split_differs_across_seeds(digits):
    tests = [split(digits, seed=seed).test_index for seed in range(4)]
    for i in range(len(tests)):
        for j in range(i + 1, len(tests)):
            assert not np.array_equal(tests[i], tests[j])


@pytest.mark.parametrize("seed", [0, 5])
def test_split_is_disjoint_by_content_and_covers_everything(digits, seed):
    parts = split(digits, seed=seed)
    hashes = {name: set(sha256_rows(getattr(parts, name).x)) for name in ("train", "val", "test")}
    assert not hashes["train"] & hashes["val"]
    assert not hashes["train"] & hashes["test"]
    assert not hashes["val"] & hashes["test"]
    assert hashes["train"] | hashes["val"] | hashes["test"] == set(sha256_rows(digits.x))
    assert parts.n_duplicates == 0
    all_rows = np.concatenate([parts.train_index, parts.val_index, parts.test_index])
    assert np.array_equal(np.sort(all_rows), np.arange(len(digits)))
    for name in ("train", "val", "test"):
        index = getattr(parts, f"{name}_index")
        part = getattr(parts, name)
        assert np.all(np.diff(index) > 0)  # original order kept
        assert np.array_equal(part.x, digits.x[index]) and np.array_equal(part.y, digits.y[index])
        assert part.n_classes == 10 and part.image_shape == (8, 8, 1)
        assert part.name == f"sklearn-digits[{name}]"


def test_split_drops_duplicate_rows_keeping_the_first():
    base = small_dataset()
    # Rows 0 and 5 appear again (row 5 twice, once with another label), at the end.
    extra = [0, 5, 5]
    x = np.concatenate([base.x, base.x[extra]])
    y = np.concatenate([base.y, np.array([base.y[0], base.y[5], (base.y[5] + 1) % 3], np.int32)])
    data = Dataset(x=x, y=y, n_classes=3, name="dupes")
    parts = split(data, seed=0)
    assert parts.n_duplicates == 3
    all_rows = np.sort(np.concatenate([parts.train_index, parts.val_index, parts.test_index]))
    assert np.array_equal(all_rows, np.arange(len(base)))  # the later copies are gone
    every_hash = sha256_rows(parts.train.x) + sha256_rows(parts.val.x) + sha256_rows(parts.test.x)
    assert len(every_hash) == len(set(every_hash)) == len(base)


def test_split_with_zero_fractions_gives_empty_parts():
    data = small_dataset()
    parts = split(data, seed=0, val_fraction=0.0, test_fraction=0.0)
    assert len(parts.train) == len(data) and len(parts.val) == 0 and len(parts.test) == 0
    assert parts.val.x.shape == (0, 5)


def test_split_handles_a_class_with_no_examples():
    data = small_dataset()
    data = dataclasses.replace(data, n_classes=5)
    parts = split(data, seed=0)
    assert parts.train.n_classes == 5
    assert set(np.unique(parts.train.y)) == {0, 1, 2}


def test_assert_disjoint_names_the_shared_example_and_both_parts():
    data = small_dataset()
    parts = split(data, seed=0)
    shared = parts.train.x[3]
    test = dataclasses.replace(
        parts.test,
        x=np.concatenate([parts.test.x, shared[None]]),
        y=np.concatenate([parts.test.y, parts.train.y[3:4]]),
    )
    bad = dataclasses.replace(parts, test=test)
    digest = sha256_rows(shared[None])[0]
    message = rf"sha256 {digest} is in both 'train' \(row 3\) and 'test' \(row {len(parts.test)}\); 1 shared"
    with pytest.raises(ValueError, match=message):
        assert_disjoint(bad)


def test_splits_is_plain_frozen_data(digits):
    parts = split(digits, seed=0)
    assert isinstance(parts, Splits)
    with pytest.raises(dataclasses.FrozenInstanceError):
        parts.seed = 1


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"seed": -1}, ValueError, r"split: seed must be non-negative, got -1"),
        ({"seed": 1.0}, TypeError, r"split: seed must be an int, got float"),
        ({"seed": True}, TypeError, r"split: seed must be an int, got bool"),
        ({"seed": 0, "val_fraction": 1.0}, ValueError, r"val_fraction must be in \[0, 1\), got 1.0"),
        ({"seed": 0, "test_fraction": -0.1}, ValueError, r"test_fraction must be in \[0, 1\), got -0.1"),
        ({"seed": 0, "test_fraction": "0.2"}, TypeError, r"test_fraction must be a float, got str"),
        (
            {"seed": 0, "val_fraction": 0.5, "test_fraction": 0.5},
            ValueError,
            r"must be below 1 to leave training data, got 0.5 \+ 0.5 = 1.0",
        ),
    ],
)
def test_split_rejects_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        split(small_dataset(), **kwargs)


def test_split_needs_a_seed():
    with pytest.raises(TypeError, match="seed"):
        split(small_dataset())


# --- the normaliser --------------------------------------------------------------------------


def test_normalizer_statistics_come_from_train(digits):
    parts = split(digits, seed=0)
    norm = Normalizer.fit(parts.train.x)
    wide = parts.train.x.astype(np.float64)
    mean = wide.mean(axis=0)
    std = np.sqrt(((wide - mean) ** 2).mean(axis=0))
    std[std < 1e-6] = 1.0
    assert norm.mean.dtype == norm.std.dtype == np.float32
    np.testing.assert_array_equal(norm.mean, mean.astype(np.float32))
    # Two float64 formulas of the std may differ in the last float64 bit, not in float32.
    np.testing.assert_array_equal(norm.std, std.astype(np.float32))
    assert norm.std[0] == 1.0  # the top-left pixel is blank in every digit


def test_normalizer_ignores_val_and_test_data(digits):
    parts = split(digits, seed=0)
    rng = np.random.default_rng(0)
    x = digits.x.copy()
    held_out = np.concatenate([parts.val_index, parts.test_index])
    x[held_out] = rng.integers(0, 17, size=(held_out.size, 64)).astype(np.float32) * 100
    changed = split(dataclasses.replace(digits, x=x), seed=0)
    assert not np.array_equal(changed.test.x, parts.test.x)
    a, b = Normalizer.fit(parts.train.x), Normalizer.fit(changed.train.x)
    assert a.mean.tobytes() == b.mean.tobytes() and a.std.tobytes() == b.std.tobytes()


def test_normalizer_apply_matches_a_float32_reference():
    rng = np.random.default_rng(1)
    train = rng.normal(3.0, 2.0, size=(50, 6)).astype(np.float32)
    train[:, 2] = 4.0  # constant: centred, not scaled
    norm = Normalizer.fit(train)
    assert norm.std[2] == 1.0 and norm.mean[2] == 4.0
    x = rng.normal(size=(7, 6)).astype(np.float32)
    expected = (x - norm.mean) / norm.std  # float32 throughout
    out = norm.apply(x)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(norm.apply(x.astype(np.float64)), expected)
    np.testing.assert_array_equal(norm.apply(x[None]), expected[None])


def test_normalizer_global_statistics_are_one_mean_and_std_for_every_feature(digits):
    train = split(digits, seed=0).train.x
    norm = Normalizer.fit(train, per_feature=False)
    wide = train.astype(np.float64)
    assert norm.mean.shape == norm.std.shape == (64,)
    np.testing.assert_array_equal(norm.mean, np.full(64, np.float32(wide.mean())))
    np.testing.assert_array_equal(norm.std, np.full(64, np.float32(wide.std())))
    # A blank-in-training edge pixel keeps the global scale: one stroke there is not blown up.
    per_feature = Normalizer.fit(train)
    edge = int(np.argmin(np.where(per_feature.std > 1e-6, per_feature.std, np.inf)))
    x = np.zeros((1, 64), np.float32)
    x[0, edge] = 16.0
    assert np.abs(per_feature.apply(x)).max() > 100
    assert np.abs(norm.apply(x)).max() < 5
    with pytest.raises(TypeError, match="per_feature must be a bool, got str"):
        Normalizer.fit(train, per_feature="no")


def test_normalizer_min_std_sets_the_floor():
    x = np.array([[0.0, 0.0], [0.01, 1.0]], np.float32)
    assert Normalizer.fit(x).std[0] == np.float32(0.005)
    assert Normalizer.fit(x, min_std=0.1).std[0] == 1.0


def test_normalizer_round_trips_through_json_bitwise(digits):
    norm = Normalizer.fit(split(digits, seed=0).train.x)
    data = json.loads(json.dumps(norm.to_dict()))
    again = Normalizer.from_dict(data)
    assert again.mean.tobytes() == norm.mean.tobytes()
    assert again.std.tobytes() == norm.std.tobytes()
    with pytest.raises(ValueError, match="read-only"):
        again.mean[0] = 0.0


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda n: n.apply(np.zeros((2, 4), np.float32)),
            ValueError,
            r"shape \(\.\.\., 3\) .* got shape \(2, 4\)",
        ),
        (
            lambda n: n.apply(np.array(["a", "b", "c"])),
            TypeError,
            r"must be an int or float array, got dtype <U1",
        ),
        (
            lambda n: Normalizer.fit(np.zeros(3)),
            ValueError,
            r"x must be 2-D \(N, F\) with N >= 1, got shape \(3,\)",
        ),
        (lambda n: Normalizer.fit(np.zeros((0, 3))), ValueError, r"with N >= 1, got shape \(0, 3\)"),
        (
            lambda n: Normalizer.fit(np.array([[0.0, 1.0], [np.inf, 2.0]])),
            ValueError,
            r"x must be finite, got inf at row 1, feature 0",
        ),
        (lambda n: Normalizer.fit(np.zeros((2, 2)), min_std=0.0), ValueError, r"min_std must be positive"),
        (
            lambda n: Normalizer.from_dict({"mean": [0.0]}),
            ValueError,
            r"keys \['mean', 'std'\], got \['mean'\]",
        ),
        (
            lambda n: Normalizer.from_dict({"mean": [0.0, 1.0], "std": [1.0, 0.0]}),
            ValueError,
            r"std must be positive and finite, got 0.0 at feature 1",
        ),
        (
            lambda n: Normalizer.from_dict({"mean": [0.0, 1.0], "std": [1.0]}),
            ValueError,
            r"mean and std must have one shape, got \(2,\) and \(1,\)",
        ),
        (
            lambda n: Normalizer.from_dict({"mean": ["a"], "std": [1.0]}),
            ValueError,
            r"'mean' must be a list of numbers",
        ),
        (
            lambda n: Normalizer(mean=np.zeros(2), std=np.ones(2, np.float32)),
            TypeError,
            r"mean must be a numpy float32 array, got float64",
        ),
    ],
)
def test_normalizer_errors(call, error, message):
    norm = Normalizer.fit(np.arange(6, dtype=np.float32).reshape(2, 3))
    with pytest.raises(error, match=message):
        call(norm)


# --- .npz files ------------------------------------------------------------------------------


def test_npz_round_trip_of_images(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(9, 4, 5), dtype=np.uint8)
    labels = rng.integers(0, 3, size=9)
    path = tmp_path / "mine.npz"
    np.savez(path, x=images, y=labels)
    ds = load_npz(path)
    assert ds.x.dtype == np.float32 and ds.x.shape == (9, 20)
    np.testing.assert_array_equal(ds.x, images.reshape(9, 20).astype(np.float32))
    np.testing.assert_array_equal(ds.x[:, 5 * 2 + 3], images[:, 2, 3])  # pixel (r, c) is feature W*r + c
    assert ds.y.dtype == np.int32 and np.array_equal(ds.y, labels)
    assert ds.n_classes == int(labels.max()) + 1
    assert ds.image_shape == (4, 5, 1)
    assert ds.name == "mine.npz" and ds.source == (str(path),)


def test_npz_round_trip_of_features_with_other_keys(tmp_path):
    x = np.linspace(-1, 1, 12, dtype=np.float64).reshape(4, 3)
    y = np.array([0.0, 1.0, 1.0, 0.0])  # whole-number floats are fine
    path = tmp_path / "features.npz"
    np.savez_compressed(path, inputs=x, targets=y)
    ds = load_npz(path, x_key="inputs", y_key="targets", n_classes=5)
    np.testing.assert_array_equal(ds.x, x.astype(np.float32))
    assert ds.image_shape is None and ds.n_classes == 5
    np.testing.assert_array_equal(ds.y, [0, 1, 1, 0])


def test_npz_round_trip_of_colour_images(tmp_path):
    images = np.arange(2 * 3 * 4 * 2, dtype=np.int16).reshape(2, 3, 4, 2)
    path = tmp_path / "colour.npz"
    np.savez(path, x=images, y=np.array([1, 0]))
    ds = load_npz(path)
    assert ds.image_shape == (3, 4, 2)
    r, c, ch = 2, 1, 1
    np.testing.assert_array_equal(ds.x[:, (r * 4 + c) * 2 + ch], images[:, r, c, ch])


def test_npz_accepts_boolean_images(tmp_path):
    images = np.eye(3, dtype=bool)[None].repeat(2, axis=0)
    path = tmp_path / "bool.npz"
    np.savez(path, x=images, y=np.array([0, 1]))
    ds = load_npz(path)
    np.testing.assert_array_equal(ds.x, images.reshape(2, 9).astype(np.float32))


def _write_npz(path: Path, **arrays) -> Path:
    np.savez(path, **arrays)
    return path


GOOD_X = np.zeros((4, 3), np.float32)
GOOD_Y = np.array([0, 1, 2, 1])


@pytest.mark.parametrize(
    ("arrays", "kwargs", "message"),
    [
        ({"x": GOOD_X}, {}, r"no labels array named 'y'; the archive holds \['x'\]"),
        (
            {"x": np.zeros(4), "y": GOOD_Y},
            {},
            r"\(key 'x'\): features must be 2-D after flattening .* \(4,\)",
        ),
        (
            {"x": np.zeros((2, 2, 2, 2, 2)), "y": GOOD_Y[:2]},
            {},
            r"2-D after flattening .*got shape \(2, 2, 2, 2, 2\)",
        ),
        ({"x": np.zeros((0, 3)), "y": GOOD_Y[:0]}, {}, r"\(key 'x'\): no examples \(shape \(0, 3\)\)"),
        ({"x": GOOD_X, "y": GOOD_Y[:3]}, {}, r"4 examples under key 'x' but 3 labels under key 'y'"),
        (
            {"x": GOOD_X, "y": np.array([0, 1, -2, -1])},
            {},
            r"\(key 'y'\): labels must be non-negative, got -2 at index 2",
        ),
        (
            {"x": GOOD_X, "y": GOOD_Y},
            {"n_classes": 2},
            r"\(key 'y'\): labels must be in \[0, 2\), got 2 at index 2 \(1 bad labels in all\)",
        ),
        (
            {"x": GOOD_X, "y": np.array([0, 1.5, 1, 0])},
            {},
            r"labels must be whole numbers, got 1.5 at index 1",
        ),
        (
            {"x": GOOD_X, "y": np.array([0, 1, np.nan, 0])},
            {},
            r"labels must be whole numbers, got nan at index 2",
        ),
        ({"x": GOOD_X, "y": np.array(["a", "b", "c", "d"])}, {}, r"labels must be integers, got dtype <U1"),
        ({"x": GOOD_X, "y": GOOD_Y[:, None]}, {}, r"labels must be 1-D of shape \(N,\), got shape \(4, 1\)"),
        ({"x": np.array(["a"] * 4)[:, None], "y": GOOD_Y}, {}, r"features must be numeric .* got dtype <U1"),
        ({"x": GOOD_X, "y": GOOD_Y}, {"n_classes": 0}, r"n_classes must be in \[1, "),
    ],
)
def test_npz_errors_name_the_file_and_the_problem(tmp_path, arrays, kwargs, message):
    path = _write_npz(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=re.escape(str(path)) + r".*" + message):
        load_npz(path, **kwargs)


@pytest.mark.parametrize(
    ("value", "where", "message"),
    [
        (np.nan, (2, 1), r"got nan at row 2, feature 1 \(1 bad rows in all\)"),
        (-np.inf, (3, 0), r"got -inf at row 3, feature 0"),
        (1e300, (1, 2), r"got 1e\+300 \(too large for float32\) at row 1, feature 2"),
    ],
)
def test_npz_rejects_non_finite_features(tmp_path, value, where, message):
    x = np.zeros((4, 3))
    x[where] = value
    path = _write_npz(tmp_path / "nan.npz", x=x, y=GOOD_Y)
    with pytest.raises(ValueError, match=re.escape(f"{path} (key 'x'): features must be finite") + ".*" + message):
        load_npz(path)


def test_npz_missing_file(tmp_path):
    path = tmp_path / "nowhere.npz"
    with pytest.raises(FileNotFoundError, match=re.escape(str(path)) + ": no such .npz file"):
        load_npz(path)


def test_npz_not_an_archive(tmp_path):
    path = tmp_path / "garbage.npz"
    path.write_bytes(b"this is not a zip file")
    with pytest.raises(ValueError, match=re.escape(str(path)) + ": not a readable .npz archive"):
        load_npz(path)
    npy = tmp_path / "single.npz"
    with open(npy, "wb") as f:
        np.save(f, GOOD_X)
    with pytest.raises(ValueError, match=re.escape(str(npy)) + ": expected an .npz archive .* single .npy array"):
        load_npz(npy)


def test_npz_never_unpickles(tmp_path):
    path = _write_npz(tmp_path / "objects.npz", x=GOOD_X, y=np.array([0, 1, None, 1], dtype=object))
    with pytest.raises(ValueError, match=re.escape(str(path)) + r" \(key 'y'\): cannot load array without pickle"):
        load_npz(path)


# --- IDX files -------------------------------------------------------------------------------

IDX_TYPES = [
    (0x08, np.uint8),
    (0x09, np.int8),
    (0x0B, np.int16),
    (0x0C, np.int32),
    (0x0D, np.float32),
    (0x0E, np.float64),
]


def idx_bytes(code: int, array: np.ndarray, big_endian_dtype: str) -> bytes:
    """An IDX file written by hand from the format description, independent of write_idx."""
    header = bytes([0, 0, code, array.ndim]) + b"".join(struct.pack(">I", s) for s in array.shape)
    return header + array.astype(big_endian_dtype).tobytes()


def _random_array(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)
    return rng.normal(size=shape).astype(dtype)


@pytest.mark.parametrize(
    ("code", "dtype"), IDX_TYPES, ids=lambda v: np.dtype(v).name if isinstance(v, type) else hex(v)
)
@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4), (2, 2, 3, 2)], ids=str)
@pytest.mark.parametrize("suffix", [".idx", ".idx.gz"])
def test_idx_round_trip(tmp_path, code, dtype, shape, suffix):
    array = _random_array(dtype, shape)
    path = tmp_path / f"data{suffix}"
    write_idx(path, array)
    raw = gzip.decompress(path.read_bytes()) if suffix.endswith(".gz") else path.read_bytes()
    assert raw == idx_bytes(code, array, np.dtype(dtype).newbyteorder(">").str)
    back = read_idx(path)
    assert back.dtype == np.dtype(dtype) and back.dtype.isnative and back.shape == shape
    assert back.tobytes() == array.tobytes()


def test_idx_reads_a_hand_written_mnist_like_file(tmp_path):
    images = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    # The MNIST images magic number is 0x00000803.
    data = struct.pack(">IIII", 0x00000803, 2, 3, 3) + images.tobytes()
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(data)
    np.testing.assert_array_equal(read_idx(path), images)
    gz = tmp_path / "train-images-idx3-ubyte.gz"
    gz.write_bytes(gzip.compress(data))
    np.testing.assert_array_equal(read_idx(gz), images)


def test_idx_gzip_output_is_reproducible(tmp_path):
    array = _random_array(np.uint8, (4, 4))
    a, b = tmp_path / "a.gz", tmp_path / "b.gz"
    write_idx(a, array)
    write_idx(b, array)
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize("gz", [False, True])
def test_load_idx_round_trip(tmp_path, gz):
    suffix = ".gz" if gz else ""
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, size=(11, 6, 5), dtype=np.uint8)
    labels = rng.integers(0, 10, size=11).astype(np.uint8)
    images_path, labels_path = (
        tmp_path / f"images-idx3-ubyte{suffix}",
        tmp_path / f"labels-idx1-ubyte{suffix}",
    )
    write_idx(images_path, images)
    write_idx(labels_path, labels)
    ds = load_idx(images_path, labels_path, n_classes=10)
    np.testing.assert_array_equal(ds.x, images.reshape(11, 30).astype(np.float32))
    np.testing.assert_array_equal(ds.y, labels.astype(np.int32))
    assert ds.n_classes == 10 and ds.image_shape == (6, 5, 1)
    assert ds.name == images_path.name and ds.source == (str(images_path), str(labels_path))


def test_load_idx_accepts_float_features_and_infers_classes(tmp_path):
    x = np.linspace(0, 1, 8, dtype=np.float32).reshape(4, 2)
    write_idx(tmp_path / "x.idx", x)
    write_idx(tmp_path / "y.idx", np.array([0, 3, 1, 3], np.int32))
    ds = load_idx(tmp_path / "x.idx", tmp_path / "y.idx")
    assert ds.n_classes == 4 and ds.image_shape is None
    np.testing.assert_array_equal(ds.x, x)


def _header(code=0x08, shape=(2, 3)) -> bytes:
    return bytes([0, 0, code, len(shape)]) + struct.pack(f">{len(shape)}I", *shape)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x00\x00", r"truncated IDX file: the header needs 4 bytes, the file has 2"),
        (_header()[:9], r"truncated IDX file: a rank-2 header needs 12 bytes, the file has 9"),
        (
            _header(shape=(2, 3)) + bytes(4),
            r"truncated IDX file: shape \(2, 3\) of uint8 needs 6 data bytes, found 4 "
            r"\(only the first 1 of 2",
        ),
        (
            _header(code=0x0C, shape=(3,)) + bytes(5),
            r"truncated IDX file: shape \(3,\) of int32 needs 12 data bytes, found 5",
        ),
        (_header(shape=(2, 3)) + bytes(8), r"2 unexpected bytes after the IDX data: shape \(2, 3\)"),
        (b"\x01\x00\x08\x01" + bytes(8), r"bad IDX magic number 0x01000801: expected two zero bytes"),
        (
            _header(code=0x0A),
            r"unknown IDX data type code 0x0A; expected one of 0x08 \(uint8\), 0x09 \(int8\)",
        ),
        (b"\x00\x00\x08\x00", r"IDX rank 0 in the magic number; expected rank 1 or more"),
        (
            gzip.compress(_header() + bytes(6)),
            r"bad IDX magic number 0x1F8B.*looks gzip-compressed: give it a \.gz",
        ),
    ],
    ids=[
        "short-header",
        "short-dims",
        "short-data",
        "short-int32",
        "trailing",
        "magic",
        "code",
        "rank0",
        "gzip-no-suffix",
    ],
)
def test_idx_format_errors_name_the_file(tmp_path, content, message):
    path = tmp_path / "broken-idx"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=re.escape(str(path)) + ": " + message):
        read_idx(path)


def test_idx_gzip_errors_name_the_file(tmp_path):
    not_gzip = tmp_path / "plain.idx.gz"
    not_gzip.write_bytes(_header() + bytes(6))
    with pytest.raises(ValueError, match=re.escape(str(not_gzip)) + ": not a gzip file although its name"):
        read_idx(not_gzip)
    cut = tmp_path / "cut.idx.gz"
    cut.write_bytes(gzip.compress(_header() + bytes(600))[:-12])
    with pytest.raises(ValueError, match=re.escape(str(cut)) + ": truncated or corrupt gzip stream"):
        read_idx(cut)


def test_idx_missing_files(tmp_path):
    present = tmp_path / "labels.idx"
    write_idx(present, np.zeros(2, np.uint8))
    missing = tmp_path / "images.idx"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing)) + ": no such IDX file"):
        read_idx(missing)
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing)) + ": no such IDX file"):
        load_idx(missing, present)
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing)) + ": no such IDX file"):
        load_idx(present, missing)


def test_load_idx_count_mismatch_names_both_files(tmp_path):
    images, labels = tmp_path / "i.idx", tmp_path / "l.idx"
    write_idx(images, np.zeros((5, 2, 2), np.uint8))
    write_idx(labels, np.zeros(4, np.uint8))
    message = re.escape(f"{images} holds 5 images but {labels} holds 4 labels; expected one label per image")
    with pytest.raises(ValueError, match=message):
        load_idx(images, labels)


@pytest.mark.parametrize(
    ("images", "labels", "kwargs", "bad_file", "message"),
    [
        (
            np.zeros(5, np.uint8),
            np.zeros(5, np.uint8),
            {},
            "i.idx",
            r"\(IDX images\): features must be 2-D after",
        ),
        (
            np.zeros((5, 2), np.uint8),
            np.zeros((5, 1), np.uint8),
            {},
            "l.idx",
            r"labels must be 1-D of shape \(N,\)",
        ),
        (
            np.zeros((3, 2), np.uint8),
            np.array([0, -1, 2], np.int8),
            {},
            "l.idx",
            r"non-negative, got -1 at index 1",
        ),
        (
            np.zeros((3, 2), np.uint8),
            np.array([0, 9, 12], np.uint8),
            {"n_classes": 10},
            "l.idx",
            r"got 12 at index 2",
        ),
        (
            np.zeros((3, 2), np.uint8),
            np.array([0, 0.5, 1], np.float32),
            {},
            "l.idx",
            r"whole numbers, got 0.5",
        ),
        (
            np.array([[0, 1], [np.nan, 2], [0, 0]], np.float32),
            np.zeros(3, np.uint8),
            {},
            "i.idx",
            r"\(IDX images\): features must be finite float32 values, got nan at row 1, feature 0",
        ),
    ],
)
def test_load_idx_content_errors(tmp_path, images, labels, kwargs, bad_file, message):
    write_idx(tmp_path / "i.idx", images)
    write_idx(tmp_path / "l.idx", labels)
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / bad_file)) + ".*" + message):
        load_idx(tmp_path / "i.idx", tmp_path / "l.idx", **kwargs)


def test_write_idx_errors(tmp_path):
    path = tmp_path / "out.idx"
    with pytest.raises(TypeError, match=re.escape(f"write_idx({str(path)!r})") + r": IDX has no type code .*int64"):
        write_idx(path, np.zeros(3, np.int64))
    with pytest.raises(TypeError, match=r"no type code for dtype bool"):
        write_idx(path, np.zeros(3, bool))
    with pytest.raises(ValueError, match=r"IDX rank must be in \[1, 255\], got rank 0"):
        write_idx(path, np.float32(1.0))
    assert not path.exists()


def test_write_idx_accepts_any_byte_order(tmp_path):
    array = np.arange(6, dtype=">i4").reshape(2, 3)
    write_idx(tmp_path / "be.idx", array)
    np.testing.assert_array_equal(read_idx(tmp_path / "be.idx"), array)


# --- batches ---------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [1, 3, 7, 20, 25])
def test_batches_cover_every_example_once_in_the_given_order(batch_size):
    n = 20
    x = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
    y = np.arange(n, dtype=np.int32)
    order = np.random.default_rng(batch_size).permutation(n)
    out = list(batches(x, y, batch_size=batch_size, order=order))
    assert [len(yb) for _, yb in out] == [min(batch_size, n - s) for s in range(0, n, batch_size)]
    seen = np.concatenate([yb for _, yb in out])
    np.testing.assert_array_equal(seen, order)  # order kept, so every example exactly once
    np.testing.assert_array_equal(np.concatenate([xb for xb, _ in out]), x[order])
    assert all(xb.dtype == np.float32 and yb.dtype == np.int32 for xb, yb in out)


def test_batches_drop_last_keeps_one_shape():
    x, y = np.zeros((10, 3), np.float32), np.arange(10)
    out = list(batches(x, y, batch_size=4, seed=0, drop_last=True))
    assert [xb.shape for xb, _ in out] == [(4, 3), (4, 3)]
    seen = np.concatenate([yb for _, yb in out])
    assert len(set(seen.tolist())) == 8
    np.testing.assert_array_equal(seen, np.random.default_rng(0).permutation(10)[:8])


def test_batches_take_a_jax_permutation():
    n = 13
    y = np.arange(n)
    order = jax.random.permutation(jax.random.key(4), n)
    seen = np.concatenate([yb for _, yb in batches(y[:, None], y, batch_size=5, order=order)])
    np.testing.assert_array_equal(seen, np.asarray(order))
    np.testing.assert_array_equal(np.sort(seen), y)


def test_batches_seed_is_deterministic_and_shuffle_false_keeps_order():
    y = np.arange(9)
    first = [yb.tolist() for _, yb in batches(y, y, batch_size=4, seed=5)]
    again = [yb.tolist() for _, yb in batches(y, y, batch_size=4, seed=5)]
    other = [yb.tolist() for _, yb in batches(y, y, batch_size=4, seed=6)]
    assert first == again and first != other
    assert [v for batch in first for v in batch] == np.random.default_rng(5).permutation(9).tolist()
    assert [yb.tolist() for _, yb in batches(y, y, batch_size=4, shuffle=False)] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8],
    ]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"batch_size": 2}, ValueError, r"exactly one of order .* or seed; neither was given"),
        (
            {"batch_size": 2, "order": np.arange(5), "seed": 0},
            ValueError,
            r"exactly one of order .*; both were given",
        ),
        (
            {"batch_size": 2, "shuffle": False, "seed": 0},
            ValueError,
            r"shuffle=False takes neither order nor seed",
        ),
        ({"batch_size": 0, "seed": 0}, ValueError, r"batch_size must be positive, got 0"),
        ({"batch_size": 2.0, "seed": 0}, TypeError, r"batch_size must be an int, got float"),
        ({"batch_size": 2, "seed": -3}, ValueError, r"seed must be non-negative, got -3"),
        (
            {"batch_size": 2, "order": np.arange(4)},
            ValueError,
            r"permutation of range\(5\) of shape \(5,\), got shape",
        ),
        ({"batch_size": 2, "order": np.array([0, 1, 2, 3, 5])}, ValueError, r"range\(5\), got 5 at index 4"),
        (
            {"batch_size": 2, "order": np.array([0, 1, 1, 3, 4])},
            ValueError,
            r"row 1 appears 2 times and row 2 is missing",
        ),
        (
            {"batch_size": 2, "order": np.arange(5.0)},
            TypeError,
            r"order must be an integer array, got dtype float64",
        ),
    ],
)
def test_batches_errors_are_raised_at_call(kwargs, error, message):
    x, y = np.zeros((5, 2)), np.zeros(5)
    with pytest.raises(error, match="batches: .*" + message):
        batches(x, y, **kwargs)  # not iterated: the checks run before the first batch


def test_batches_length_mismatch():
    with pytest.raises(ValueError, match=r"batches: x has 5 examples but y has 4"):
        batches(np.zeros((5, 2)), np.zeros(4), batch_size=2, shuffle=False)
