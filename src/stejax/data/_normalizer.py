"""Per-feature standardisation fitted on training data only."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["Normalizer"]


def _as_features(x: ArrayLike, where: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype.kind not in "iuf":
        raise TypeError(f"{where}: features must be an int or float array, got dtype {x.dtype}")
    return x


@dataclasses.dataclass(frozen=True, eq=False)
class Normalizer:
    r"""Per-feature standardisation :math:`(x - \mu) / \sigma`, as plain data.

    Fit it on the training part only (:meth:`fit`), then :meth:`apply` the same
    statistics to every part, so nothing about validation or test data leaks into
    training. Save it with :meth:`to_dict` (JSON-ready) and restore it bitwise with
    :meth:`from_dict`.

    Attributes:
      mean: float32 ``(F,)``, the per-feature mean :math:`\mu` of the training rows.
      std: float32 ``(F,)``, the per-feature population standard deviation
        :math:`\sigma` of the training rows, except that a feature whose
        :math:`\sigma` is below ``min_std`` (constant in training, like the always
        blank corner pixels of the digits) gets :math:`\sigma = 1`. Such a feature
        is centred but not scaled, as scikit-learn's ``StandardScaler`` does, so a
        value it never took in training is not blown up by a tiny divisor.

    Raises:
      TypeError: ``mean`` or ``std`` is not a float32 NumPy array.
      ValueError: they are not 1-D of one length, or hold a non-finite mean or a
        standard deviation that is not positive and finite.
    """

    mean: np.ndarray  # float32 (F,)
    std: np.ndarray  # float32 (F,), every entry > 0

    def __post_init__(self):
        for field in ("mean", "std"):
            value = getattr(self, field)
            if not isinstance(value, np.ndarray) or value.dtype != np.float32:
                got = value.dtype if isinstance(value, np.ndarray) else type(value).__name__
                raise TypeError(f"Normalizer: {field} must be a numpy float32 array, got {got}")
            if value.ndim != 1:
                raise ValueError(f"Normalizer: {field} must be 1-D of shape (F,), got shape {value.shape}")
        if self.mean.shape != self.std.shape:
            raise ValueError(
                f"Normalizer: mean and std must have one shape, got {self.mean.shape} and {self.std.shape}"
            )
        if not np.isfinite(self.mean).all():
            i = int(np.flatnonzero(~np.isfinite(self.mean))[0])
            raise ValueError(f"Normalizer: mean must be finite, got {self.mean[i]} at feature {i}")
        bad = ~(np.isfinite(self.std) & (self.std > 0))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"Normalizer: std must be positive and finite, got {self.std[i]} at feature {i}")
        for field in ("mean", "std"):
            view = getattr(self, field).view()
            view.flags.writeable = False
            object.__setattr__(self, field, view)

    @classmethod
    def fit(cls, x: ArrayLike, *, min_std: float = 1e-6, per_feature: bool = True) -> Normalizer:
        r"""Fit the per-feature mean and standard deviation of training features.

        :math:`\mu_j = \frac{1}{N}\sum_i x_{ij}` and
        :math:`\sigma_j = \sqrt{\frac{1}{N}\sum_i (x_{ij} - \mu_j)^2}`, accumulated in
        float64 and stored as float32; :math:`\sigma_j < ` ``min_std`` becomes 1.

        With ``per_feature=False`` one mean and one standard deviation are taken over
        every entry of ``x`` and repeated for each feature: the usual choice for
        images, where pixels share one scale and a convolution shares its weights
        across positions. Per-pixel statistics instead blow up a pixel that is
        almost always blank in training (the digits' edge pixels have
        :math:`\sigma_j` near 0.03, so one stroke there standardises to 300).

        Args:
          x: training features, shape ``(N, F)`` with ``N >= 1``, int or float, finite.
          min_std: the floor below which a feature counts as constant (in the
            features' units). Default ``1e-6``.
          per_feature: one statistic per feature (default) or one for all.

        Returns:
          A :class:`Normalizer` with ``F`` features.

        Raises:
          TypeError: ``x`` is not numeric, or ``min_std`` is not a number.
          ValueError: ``x`` is not 2-D with at least one row, holds NaN or inf, or
            ``min_std`` is not positive and finite.

        Example:
          >>> import numpy as np
          >>> from stejax.data import Normalizer
          >>> norm = Normalizer.fit(np.array([[0.0, 5.0], [2.0, 5.0]], np.float32))
          >>> norm.mean.tolist(), norm.std.tolist()
          ([1.0, 5.0], [1.0, 1.0])
          >>> norm.apply(np.array([[3.0, 6.0]], np.float32)).tolist()
          [[2.0, 1.0]]
        """
        x = _as_features(x, "Normalizer.fit")
        if isinstance(min_std, bool) or not isinstance(min_std, int | float | np.integer | np.floating):
            raise TypeError(f"Normalizer.fit: min_std must be a float, got {type(min_std).__name__}")
        if not (np.isfinite(min_std) and min_std > 0):
            raise ValueError(f"Normalizer.fit: min_std must be positive and finite, got {min_std}")
        if x.ndim != 2 or x.shape[0] == 0:
            raise ValueError(f"Normalizer.fit: x must be 2-D (N, F) with N >= 1, got shape {x.shape}")
        wide = x.astype(np.float64)
        if not np.isfinite(wide).all():
            row, col = (int(i) for i in np.argwhere(~np.isfinite(wide))[0])
            raise ValueError(f"Normalizer.fit: x must be finite, got {x[row, col]} at row {row}, feature {col}")
        if not isinstance(per_feature, bool):
            raise TypeError(f"Normalizer.fit: per_feature must be a bool, got {type(per_feature).__name__}")
        if per_feature:
            mean, std = wide.mean(axis=0), wide.std(axis=0)
        else:
            mean = np.full(x.shape[1], wide.mean())
            std = np.full(x.shape[1], wide.std())
        std = np.where(std < min_std, 1.0, std)
        return cls(mean=mean.astype(np.float32), std=std.astype(np.float32))

    def apply(self, x: ArrayLike) -> np.ndarray:
        r"""Standardise features: :math:`(x - \mu) / \sigma`, feature by feature.

        Computed in float32 (subtract, then divide, each rounded to float32), so the
        result does not depend on the input dtype beyond its conversion to float32.

        Args:
          x: features of shape ``(..., F)``, int or float.

        Returns:
          A new float32 array of ``x``'s shape.

        Raises:
          TypeError: ``x`` is not numeric.
          ValueError: ``x``'s last dimension is not ``F``.
        """
        x = _as_features(x, "Normalizer.apply")
        if x.ndim == 0 or x.shape[-1] != self.mean.shape[0]:
            raise ValueError(
                f"Normalizer.apply: x must have shape (..., {self.mean.shape[0]}) to match the fitted "
                f"features, got shape {x.shape}"
            )
        return (x.astype(np.float32) - self.mean) / self.std

    def to_dict(self) -> dict[str, list[float]]:
        """The statistics as a JSON-ready dict ``{"mean": [...], "std": [...]}``.

        Each float32 is written as the Python float of equal value, so
        :meth:`from_dict` restores it bit for bit.

        Example:
          >>> import json, numpy as np
          >>> from stejax.data import Normalizer
          >>> norm = Normalizer.fit(np.arange(6, dtype=np.float32).reshape(3, 2))
          >>> again = Normalizer.from_dict(json.loads(json.dumps(norm.to_dict())))
          >>> bool((again.mean == norm.mean).all() and (again.std == norm.std).all())
          True
        """
        return {"mean": [float(v) for v in self.mean], "std": [float(v) for v in self.std]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Normalizer:
        """Rebuild a :class:`Normalizer` from :meth:`to_dict`'s output.

        Args:
          data: a mapping with lists ``"mean"`` and ``"std"`` of one length.

        Returns:
          The :class:`Normalizer`.

        Raises:
          ValueError: a key is missing or unknown, a value is not a list of numbers,
            or the statistics are invalid (see the class).
        """
        if not isinstance(data, Mapping) or set(data) != {"mean", "std"}:
            got = sorted(data) if isinstance(data, Mapping) else type(data).__name__
            raise ValueError(f"Normalizer.from_dict: expected exactly the keys ['mean', 'std'], got {got}")
        arrays = {}
        for key in ("mean", "std"):
            try:
                values = np.asarray(data[key], dtype=np.float64)
            except (TypeError, ValueError) as e:
                raise ValueError(f"Normalizer.from_dict: {key!r} must be a list of numbers ({e})") from e
            with np.errstate(over="ignore"):  # out-of-range values become inf, rejected below
                arrays[key] = values.astype(np.float32)
        return cls(**arrays)
