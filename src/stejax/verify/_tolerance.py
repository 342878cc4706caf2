"""The verifier's tolerances, one record per dtype (the reasons are in ``stejax.verify``)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import ml_dtypes
import numpy as np

from stejax.verify._platform import PlatformContract, platform_contract

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
      platform: the backend the tolerances are for.
      platform_ulps: the platform contract's elementwise ulps in this dtype
        (:func:`stejax.verify.platform_contract`): 0 on CPU. Where it is not
        0, the platform may evaluate a declared derivative with other roundings
        than the rule, so a tangent that would be exact on CPU may be that many
        ulps off, and every bound grows by as many ulps.
    """

    dtype: str
    eps: float
    tiny: float
    tangent_ulps: int = TANGENT_ULPS
    linearity_ulps: int = LINEARITY_ULPS
    sum_ulps: int = SUM_ULPS
    platform: str = "cpu"
    platform_ulps: int = 0

    @classmethod
    def of(cls, dtype: Any, contract: PlatformContract | None = None) -> Tolerance:
        """The tolerances in ``dtype`` on the platform of ``contract`` (default: JAX's default backend)."""
        contract = platform_contract() if contract is None else contract
        info = ml_dtypes.finfo(np.dtype(dtype))
        return cls(
            dtype=np.dtype(dtype).name,
            eps=float(info.eps),
            tiny=float(info.tiny),
            platform=contract.platform,
            platform_ulps=contract.ulps(dtype),
        )

    def sum_bound_ulps(self, n: int) -> int:
        """The ulps of the magnitude allowed for a sum of ``n`` terms."""
        return self.sum_ulps + (math.ceil(math.log2(n)) if n > 1 else 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "eps": self.eps,
            "tiny": self.tiny,
            "forward": "bitwise",
            "tangent": (
                f"exact where derivative*tangent is representable, else {self.tangent_ulps} ulp + tiny"
                if not self.platform_ulps
                else f"within {self.platform_ulps} ulp (the {self.platform} contract) where derivative*tangent is "
                f"representable, else {self.tangent_ulps + self.platform_ulps} ulp + tiny"
            ),
            "platform": self.platform,
            "platform_ulps": self.platform_ulps,
            "tangent_ulps": self.tangent_ulps,
            "linearity_ulps": self.linearity_ulps,
            "sum": f"({self.sum_ulps} + ceil(log2 n)) ulp of the sum of magnitudes + n * tiny",
            "sum_ulps": self.sum_ulps,
            "tangent_map": f"{self.tangent_ulps} ulp of (|value| + max |value|) + tiny",
        }
