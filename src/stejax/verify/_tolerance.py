"""The verifier's tolerances, one record per dtype (the reasons are in ``stejax.verify``)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import ml_dtypes
import numpy as np

# A rule may form derivative * tangent in another order than the declaration,
# with a few roundings of half an ulp each.
TANGENT_ULPS = 4
# One rounding for jvp(a t1 + b t2) and one for each part, twice over.
LINEARITY_ULPS = 4
# The base of a sum's bound; ceil(log2 n) is added for a sum of n terms.
SUM_ULPS = 4


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """The tolerances the verifier applies in one dtype.

    Attributes:
      dtype: the dtype's name.
      eps: the distance from 1 to the next larger float (``finfo.eps``).
      tiny: the smallest normal number, the absolute floor of every tolerance,
        because XLA on CPU flushes subnormal results to zero.
      tangent_ulps: ulps allowed between a tangent and the declared value where
        the declared value is not representable in the dtype.
      linearity_ulps: ulps of the parts allowed in the linearity identity.
      sum_ulps: the base of the bound for a sum of ``n`` terms, to which
        ``ceil(log2 n)`` is added.
    """

    dtype: str
    eps: float
    tiny: float
    tangent_ulps: int = TANGENT_ULPS
    linearity_ulps: int = LINEARITY_ULPS
    sum_ulps: int = SUM_ULPS

    @classmethod
    def of(cls, dtype: Any) -> Tolerance:
        info = ml_dtypes.finfo(np.dtype(dtype))
        return cls(dtype=np.dtype(dtype).name, eps=float(info.eps), tiny=float(info.tiny))

    def sum_bound_ulps(self, n: int) -> int:
        """The ulps of the magnitude allowed for a sum of ``n`` terms."""
        return self.sum_ulps + (math.ceil(math.log2(n)) if n > 1 else 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "eps": self.eps,
            "tiny": self.tiny,
            "forward": "bitwise",
            "tangent": (f"exact where derivative*tangent is representable, else {self.tangent_ulps} ulp + tiny"),
            "tangent_ulps": self.tangent_ulps,
            "linearity_ulps": self.linearity_ulps,
            "sum": f"({self.sum_ulps} + ceil(log2 n)) ulp of the sum of magnitudes + n * tiny",
            "sum_ulps": self.sum_ulps,
            "tangent_map": f"{self.tangent_ulps} ulp of (|value| + max |value|) + tiny",
        }
