"""Data-parallel training on JAX's own engine: a device mesh, sharded batches, placed parameters.

The batch is split along its leading axis over the mesh axis ``"data"``
(:data:`DATA_AXIS`) with a ``NamedSharding``; the parameters and the optimiser
state are replicated on every device, or, as an option, split along one axis each
(``"sharded"``, as in ZeRO-3 / FSDP). The step is the same pure :func:`update`,
jitted with the output shardings fixed, so XLA's partitioner inserts the
all-reduce of the gradient (the mean over the batch becomes a sum of per-device
partial sums): the results equal the one-device ones up to the order of those
reductions.

Every function here works unchanged across processes (``jax.distributed``):
:func:`place` builds each global array with ``jax.make_array_from_callback``
from a value that every process holds whole, each process giving only the slices
its own devices keep, and :func:`gather` brings a global array back to every
process.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from stejax.model import ModelConfig, QATConfig, init_params
from stejax.train._step import Batch, update

__all__ = [
    "DATA_AXIS",
    "PARAM_SHARDINGS",
    "compiled_parallel_update",
    "data_mesh",
    "gather",
    "param_shardings",
    "place",
    "shard_batch",
]

DATA_AXIS = "data"
PARAM_SHARDINGS = ("replicated", "sharded")

_XLA_HINT = (
    "On CPU, ask XLA for more host devices before JAX starts, e.g. "
    "XLA_FLAGS=--xla_force_host_platform_device_count=8; across hosts, call jax.distributed.initialize first."
)


def data_mesh(devices: int | Sequence[jax.Device] | None = None) -> Mesh:
    """A one-axis mesh named ``"data"`` for data-parallel training.

    Args:
      devices: None (default) for every device of every process
        (``jax.devices()``), an int ``n`` for the first ``n`` of them, or the
        devices themselves.

    Returns:
      A ``jax.sharding.Mesh`` of shape ``{"data": n}``.

    Raises:
      ValueError: more devices asked for than there are, or fewer than one; the
        message says how to get more CPU devices.
      TypeError: ``devices`` of another type.

    Example:
      >>> from stejax.train import data_mesh
      >>> mesh = data_mesh(1)
      >>> mesh.axis_names, mesh.size
      (('data',), 1)
    """
    available = jax.devices()
    if devices is None:
        chosen = list(available)
    elif isinstance(devices, bool) or not isinstance(devices, (int, Sequence)):
        raise TypeError(f"data_mesh: devices must be None, an int or a sequence of devices; got {devices!r}.")
    elif isinstance(devices, int):
        if not 1 <= devices <= len(available):
            raise ValueError(
                f"data_mesh: asked for {devices} device(s); {len(available)} available "
                f"({available[0].platform}, {jax.process_count()} process(es)). {_XLA_HINT}"
            )
        chosen = list(available[:devices])
    else:
        chosen = list(devices)
        if not chosen:
            raise ValueError("data_mesh: the sequence of devices is empty.")
    return Mesh(np.array(chosen, dtype=object), (DATA_AXIS,))


def _data_size(mesh: Mesh, where: str) -> int:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"{where}: mesh must be a jax.sharding.Mesh (see stejax.train.data_mesh); got {mesh!r}.")
    if DATA_AXIS not in mesh.axis_names:
        raise ValueError(
            f"{where}: the mesh needs an axis named {DATA_AXIS!r} to split the batch over; got axes {mesh.axis_names}."
        )
    return int(mesh.shape[DATA_AXIS])


def _split_spec(shape: tuple[int, ...], n: int) -> PartitionSpec:
    """Split the largest axis whose size ``n`` divides (the first such on ties); replicate if none."""
    if n == 1:
        return PartitionSpec()
    candidates = [(size, -axis) for axis, size in enumerate(shape) if size % n == 0 and size > 0]
    if not candidates:
        return PartitionSpec()
    axis = -max(candidates)[1]
    return PartitionSpec(*([None] * axis), DATA_AXIS)


def param_shardings(tree: Any, mesh: Mesh, mode: str = "replicated") -> Any:
    """The ``NamedSharding`` of each leaf of a parameter (or optimiser-state) PyTree.

    * ``"replicated"`` (default): every device holds every leaf, ``PartitionSpec()``.
    * ``"sharded"``: each leaf is split over the ``"data"`` axis along its largest
      axis that the axis size divides (the first such on ties); a leaf with no
      such axis (a scalar step, a 10-wide bias on 8 devices) is replicated. The
      step gathers what it needs (XLA inserts the all-gathers), so the values are
      those of the replicated layout.

    Args:
      tree: a PyTree of arrays or ``jax.ShapeDtypeStruct``.
      mesh: a mesh with a ``"data"`` axis.
      mode: ``"replicated"`` or ``"sharded"``.

    Returns:
      A PyTree of the same structure with a ``NamedSharding`` per leaf.

    Raises:
      ValueError: an unknown mode, or a mesh without a ``"data"`` axis.
    """
    if mode not in PARAM_SHARDINGS:
        raise ValueError(f"param_shardings: mode must be one of {list(PARAM_SHARDINGS)}; got {mode!r}.")
    n = _data_size(mesh, "param_shardings")
    if mode == "replicated":
        return jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec()), tree)
    return jax.tree.map(lambda leaf: NamedSharding(mesh, _split_spec(tuple(np.shape(leaf)), n)), tree)


def place(tree: Any, shardings: Any) -> Any:
    """Host values to global arrays with the given shardings; works the same in every process.

    Each leaf must hold the whole value in every process (as after the same
    seeded computation everywhere); each process contributes the slices its
    addressable devices keep (``jax.make_array_from_callback``), so nothing is
    copied between hosts. Typed PRNG keys are placed like any other array.

    Args:
      tree: a PyTree of NumPy or JAX arrays (or typed keys).
      shardings: one ``Sharding`` for all leaves, or a PyTree of them matching ``tree``.

    Returns:
      The PyTree of global ``jax.Array`` s.
    """
    if isinstance(shardings, jax.sharding.Sharding):
        shardings = jax.tree.map(lambda _: shardings, tree)

    def one(leaf, sharding):
        if not jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key):
            leaf = np.asarray(leaf)
        return jax.make_array_from_callback(np.shape(leaf), sharding, lambda index: leaf[index])

    return jax.tree.map(one, tree, shardings)


def batch_shardings(mesh: Mesh) -> tuple[NamedSharding, NamedSharding]:
    """The shardings of a :class:`Batch`'s ``x`` and ``y``: examples split over ``"data"``, features whole."""
    _data_size(mesh, "batch_shardings")
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS, None)), NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def shard_batch(batch: Batch | tuple[Any, Any], mesh: Mesh) -> Batch:
    """A batch ``(x, y)`` as global arrays whose examples are split over the mesh's ``"data"`` axis.

    Every process passes the whole (global) batch and keeps its devices' rows.

    Raises:
      ValueError: the batch size is not a multiple of the ``"data"`` axis size.

    Example:
      >>> import numpy as np
      >>> from stejax.train import data_mesh, shard_batch
      >>> b = shard_batch((np.zeros((4, 64), np.float32), np.zeros(4, np.int32)), data_mesh(1))
      >>> b.x.shape, str(b.x.sharding.spec)
      ((4, 64), "P('data', None)")
    """
    n = _data_size(mesh, "shard_batch")
    x, y = batch
    if np.shape(x)[0] % n:
        raise ValueError(
            f"shard_batch: the batch of {np.shape(x)[0]} examples does not split evenly over the {n} devices "
            f"of the mesh's {DATA_AXIS!r} axis; use a batch size that is a multiple of {n}."
        )
    x_sharding, y_sharding = batch_shardings(mesh)
    return Batch(place(x, x_sharding), place(y, y_sharding))


def gather(tree: Any) -> Any:
    """Global arrays back to NumPy arrays, whole, in every process.

    A leaf this process can read whole (single process, or replicated) is read
    directly; a leaf split across processes is all-gathered
    (``jax.experimental.multihost_utils.process_allgather``), which every
    process must call together.
    """

    def one(leaf):
        if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable or leaf.is_fully_replicated:
            return np.asarray(leaf) if not jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key) else leaf
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))

    return jax.tree.map(one, tree)


@functools.lru_cache(maxsize=64)
def compiled_parallel_update(
    model_config: ModelConfig,
    qat_config: QATConfig,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    param_sharding: str = "replicated",
    statistics: bool = True,
):
    """:func:`update` jitted for a mesh: ``(params, opt_state, batch, key) -> (params, opt_state, metrics)``.

    The same pure step as :func:`compiled_update`; its inputs are global arrays
    (:func:`place` the parameters and optimiser state with
    :func:`param_shardings`, :func:`shard_batch` the batch, and place the key
    replicated). The outputs keep the parameters' and the optimiser state's
    shardings, so the next step compiles nothing new, and the metrics are
    replicated. Cached per model, QAT configuration, optimiser, mesh and layout.
    ``statistics=False`` leaves out the zero-gradient fractions (see :func:`update`).

    Raises:
      ValueError: an unknown ``param_sharding`` or a mesh without a ``"data"`` axis.
    """
    abstract_params = jax.eval_shape(
        lambda k: init_params(k, model_config, qat_config), jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
    )
    abstract_state = jax.eval_shape(optimizer.init, abstract_params)
    replicated = NamedSharding(mesh, PartitionSpec())
    out_shardings = (
        param_shardings(abstract_params, mesh, param_sharding),
        param_shardings(abstract_state, mesh, param_sharding),
        replicated,
    )
    step = functools.partial(
        update, model_config=model_config, qat_config=qat_config, optimizer=optimizer, statistics=statistics
    )
    return jax.jit(step, out_shardings=out_shardings)
