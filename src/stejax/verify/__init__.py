r"""Contract checks for surrogate-gradient estimators.

:func:`check_surrogate` checks any function against its exact forward function
and its declared surrogate derivative; :func:`check_estimator` and
:func:`check_catalog` do the same for catalog members from their metadata. Each
returns a :class:`Report` (or a :class:`CatalogReport`) of named checks, with
the environment and tolerances they ran under; :func:`write_report` writes its
JSON and Markdown. :func:`stejax.testing.assert_surrogate` turns a report into
an assertion for a test suite.

Inputs. In every dtype the first argument takes the special values (+-0,
+-inf, NaN, +-largest finite, +-smallest normal and subnormal), magnitudes from
the smallest subnormal to the largest finite value, ordinary values around the
boundaries, and for every boundary the float below, the point and the float
above. Tangents and cotangents are random nonzero multiples of 1/8 in
[-2, 2]: five significant bits, so that many products are exact even in
bfloat16. Everything is seeded.

Tolerance policy, per dtype (``eps`` is the distance from 1 to the next float,
``tiny`` the smallest normal number; ``report.environment["tolerances"]``
records the numbers):

* Forward values, the primal that ``jax.jvp`` returns, and the value of ``fn``
  under every composition: **bit for bit**, signed zeros, infinities and NaN
  positions included. The forward is the exact operation, so nothing less is
  right. Under a transformation the value is compared with the reference under
  the same transformation (``jit(fn)`` with ``jit(reference)``, ``vmap(fn)``
  with ``vmap(reference)`` and with a Python loop), which isolates the
  estimator from XLA's own compilation choices.
* Tangents against ``derivative * tangent``: the declared value is formed in
  float64 from the dtype-rounded derivative and the tangent. Where it is
  representable in the dtype (a normal number or zero), **equality** is
  required: a rule that forms the product with one rounding gets it exactly,
  and every piecewise-constant rule (derivatives 0, 1, powers of two) is
  exact. Elsewhere ``|got - declared| <= 4 eps |declared| + tiny``: four ulps
  let a rule form the product in another order (a few roundings of half an
  ulp), and ``tiny`` because XLA on CPU flushes subnormal results to zero.
  Points where the declared derivative (any partial) is infinite or NaN are
  skipped for this comparison only; the detail says how many.
* Sums: the cotangent of an argument that is broadcast (a scalar step size)
  sums ``n`` products, and the adjoint identity sums over every element. The
  bound is ``(4 + ceil(log2 n)) eps`` times the sum of the magnitudes, plus
  ``n tiny``: the error of a tree-shaped sum or of one accumulated in a wider
  type, which is how XLA reduces. A sum with a single nonzero term is exact.
* Linearity: with ``a = 2``, ``b = -1/2`` and five-bit tangents,
  ``a t1 + b t2`` is exact in every dtype, so the only roundings are the
  rule's own: ``|jvp(a t1 + b t2) - (a jvp(t1) + b jvp(t2))| <= 4 eps
  (|a jvp(t1)| + |b jvp(t2)|) + tiny`` elementwise (one rounding on each side,
  twice over).
* Tangent maps (``tangent_map=``, non-diagonal Jacobians): a map sums products
  across elements, so one output's rounding depends on all of them; the bound
  is ``4 eps (|declared| + max |declared|) + tiny``, the maximum taken over
  the finite values of the array.
* ``jacfwd`` against ``jacrev`` under ``derivative=``: exact, since every
  entry is the derivative times one or zero either way; under
  ``tangent_map=`` the tangent-map bound.

Platforms. The tolerances above are XLA on CPU's, the reference platform.
Elsewhere the verifier follows the backend's :func:`platform_contract`
(recorded in ``report.environment["platform_contract"]``): on a TPU a declared
derivative evaluated in one program may differ from the rule's own evaluation
in another by the contract's ``derivative_ulps`` (1 ulp in float16 and
bfloat16, 4 in float32), so a tangent that must be exact on CPU must be within
that many ulps there, and every bound above grows by as many ulps. Forward
values stay bit for bit on every platform.

The compositions (``jit``, ``vmap``, ``grad_of_vmap``, ``vmap_of_grad``,
``jacfwd_jacrev``, ``scan``, ``checkpoint``) apply the same transformation to
the declaration: a rule that reads the rank, converts to NumPy or casts behaves
differently there and then disagrees with its own declaration.

Cost. Run time is compilation: XLA spends about 10 ms on each fused
computation, whatever the array size. Everything but the eager forward is
therefore compiled as one program per function (all dtypes and checks
together); a part that cannot be traced is left out of that program, and when
the program cannot be compiled or run, each check recomputes its own part, so the
failure is reported by the check it belongs to (jit, scan and checkpoint, whose
nested composition is checked first, are then computed apart in one more
program, and each alone only if that fails). Inputs go to the device as
transfers and results come back to the host once: every comparison, bit view
and bound is host arithmetic.
:func:`check_estimator` and :func:`check_catalog` run the compositions in the
widest dtype only (``composition_dtypes="widest"``), the value and tangent
checks in every dtype, and compile one estimator while checking the previous
one (more at once with cores to spare: one per two cores beyond the first, up
to four).
"""

from stejax.verify._catalog import check_catalog as check_catalog
from stejax.verify._catalog import check_estimator as check_estimator
from stejax.verify._checks import CHECK_KINDS as CHECK_KINDS
from stejax.verify._checks import COMPOSITION_CHECKS as COMPOSITION_CHECKS
from stejax.verify._load import load_callable as load_callable
from stejax.verify._platform import PlatformContract as PlatformContract
from stejax.verify._platform import flush_subnormal_inputs as flush_subnormal_inputs
from stejax.verify._platform import measure_platform as measure_platform
from stejax.verify._platform import platform_contract as platform_contract
from stejax.verify._products import ProductCheck as ProductCheck
from stejax.verify._products import check_integer_product as check_integer_product
from stejax.verify._products import gradient_error as gradient_error
from stejax.verify._report import CatalogReport as CatalogReport
from stejax.verify._report import Check as Check
from stejax.verify._report import Report as Report
from stejax.verify._report import write_report as write_report
from stejax.verify._surrogate import check_surrogate as check_surrogate

__all__ = [
    "CHECK_KINDS",
    "COMPOSITION_CHECKS",
    "CatalogReport",
    "Check",
    "PlatformContract",
    "ProductCheck",
    "Report",
    "check_catalog",
    "check_estimator",
    "check_integer_product",
    "check_surrogate",
    "flush_subnormal_inputs",
    "gradient_error",
    "load_callable",
    "measure_platform",
    "platform_contract",
    "write_report",
]
