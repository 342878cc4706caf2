"""Which layers the kernels cover, and whether the automatic choice takes them: static facts, never a raise."""

from __future__ import annotations

from stejax.lowbit.kernels._grouped import grouped_kernel_fits
from stejax.lowbit.kernels._int8 import int8_kernel_fits
from stejax.lowbit.kernels._skeleton import kernel_backend
from stejax.lowbit.kernels._ternary import ternary_kernel_fits

__all__ = ["FORMS", "supports", "use_kernels"]

# The resident weight forms of :class:`stejax.lowbit.nnx.LowBitLinear`.
FORMS = ("int8", "int4", "int2", "ternary-int8", "ternary-2bit")


def supports(form: str, *, rows: int, k: int, n: int, group: int | None = None) -> bool:
    """Whether a kernel takes a layer of this form and shape with its default blocks.

    Answers from shapes alone (no device, no arrays; False, never an error, for what it does not cover), as
    the automatic choice asks it at trace time.

    Args:
      form: one of :data:`FORMS`.
      rows: the input rows of one call (the product of the input's leading axes).
      k, n: the kernel's contraction and output widths.
      group: the contraction rows of one scale group (``int4`` and ``int2``; None otherwise).

    Example:
      >>> supports("ternary-2bit", rows=1, k=2048, n=5632)
      True
      >>> supports("int8", rows=1024, k=2048, n=5632)  # a prefill: XLA's product is as good
      False
    """
    if form in ("int8", "ternary-int8"):
        return int8_kernel_fits(rows, k, n)
    if form == "ternary-2bit":
        return ternary_kernel_fits(rows, k, n)
    if form in ("int4", "int2") and group is not None and group > 0 and k % group == 0:
        return grouped_kernel_fits(rows, k, n, group, 4 if form == "int4" else 2)
    return False


def use_kernels(implementation: str | None, form: str, *, rows: int, k: int, n: int, group: int | None) -> bool:
    """The choice of a layer's product: ``"pallas"`` the kernels, ``"xla"`` XLA's, None the kernels where the
    default device is a generation they are verified on (:data:`stejax.lowbit.kernels.VERIFIED_ON`) and
    :func:`supports` the shape, else XLA's."""
    if implementation is not None:
        return implementation == "pallas"
    return kernel_backend() and supports(form, rows=rows, k=k, n=n, group=group)
