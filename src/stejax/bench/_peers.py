"""The peers suite: a Qwix int8 QAT training step (Flax NNX) beside stejax's, on the same MLP, batch and optimiser.

Flax and Qwix are optional (``pip install 'stejax[peers]'``) and imported only
when this suite runs; without them the suite is skipped with a note. AQT is
reported as not installed unless it can be imported.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import itertools
import warnings
from typing import Any

import jax
import jax.numpy as jnp

from stejax.bench._measure import compare, standard_promotion
from stejax.bench._nnx import nnx_steps
from stejax.data import Normalizer
from stejax.model import MLPConfig, init_params, preset

__all__ = ["peers_suite"]


def peers_suite(*, repeats: int, warmup: int, quick: bool) -> dict[str, Any]:
    """Time one training step of Qwix's int8 QAT on a Flax NNX MLP against stejax's, interleaved.

    The MLP is the reference recipe's (``64 -> 256 -> 256 -> 10``, ReLU; ``quick``:
    one hidden layer of 16), without dropout, on the same standardised digits
    batch (64; ``quick``: 32) and the same optax optimiser object
    (:func:`stejax.train.make_optimizer`: Adam, warm-up and cosine decay). Variants:

    * ``stejax float``, ``stejax w8a8``: the step :func:`stejax.train.train` takes
      on every batch but an epoch's last (:func:`stejax.train.compiled_train_step`
      with ``log`` False: ``update(..., statistics=False)``; the ``w8a8`` preset:
      8-bit LSQ weights and inputs in every layer, learned steps); ``stejax w8a8
      (with statistics)``: the same update with every quantiser's zero-gradient
      fraction (``statistics=True``);
    * ``stejax int8``: Qwix's scheme built from the catalog on the functional
      pipeline: :func:`stejax.fake_quant` with :func:`stejax.absmax_scale`, int8
      weights per output channel and int8 inputs per tensor, both scales
      recomputed every step, in a plain jitted step (compared with ``qwix int8``);
    * ``flax float``: the same MLP of ``flax.nnx.Linear`` layers, a functional step
      (``nnx.split``/``nnx.merge`` inside ``jax.jit``);
    * ``qwix int8``: that model through ``qwix.quantize_model`` with a ``QtProvider``
      rule for every layer: int8 weights (absmax per output channel) and int8
      activations (absmax, one scale per tensor as ``stejax int8``, where Qwix's
      default is one per example), scales recomputed every step, int8 products,
      straight-through in the backward pass (the float product's gradient).

    A second group (:func:`cnn_group`) times the same int8 scheme on the digits CNN:
    ``stejax int8`` as a functional step beside ``qwix int8`` and ``flax float`` on
    :class:`stejax.flax.models.DigitsCNN`.

    Flax and Qwix run under JAX's standard dtype and rank promotion (they are
    written for it; stejax's own code runs strict).

    Returns:
      ``{"status", "note", "config", "groups", "notes"}``; ``status`` is
      ``"skipped"`` (with the note) when Flax or Qwix cannot be imported.
    """
    notes = [_aqt_note()]
    missing = [name for name in ("flax", "qwix") if not _importable(name)]
    if missing:
        return {
            "status": "skipped",
            "note": f"{' and '.join(missing)} not installed: pip install 'stejax[peers]' to run the peers suite.",
            "config": {},
            "groups": [],
            "notes": notes,
        }
    group, mlp_notes, config = mlp_group(repeats=repeats, warmup=warmup, quick=quick)
    notes += mlp_notes
    cnn, cnn_notes = cnn_group(repeats=repeats, warmup=warmup, quick=quick)
    notes += cnn_notes
    # The spiking peer (Spyx): a two-layer LIF training step per T, beside stejax.snn's.
    from stejax.bench._peers_snn import snn_peer_groups

    snn_groups, snn_notes = snn_peer_groups(repeats=repeats, warmup=warmup, quick=quick)
    notes += snn_notes
    # Qwix's quantize_model beside stejax.flax's rules on the same NNX models (digits CNN, transformer block).
    from stejax.bench._peers_rules import rules_peer_groups

    rules_groups, rules_notes = rules_peer_groups(repeats=repeats, warmup=warmup, quick=quick)
    notes += rules_notes
    # Qwix's int8 QAT and int4 weight-only beside stejax's on the language model (stejax.lm).
    from stejax.bench._peers_lm import lm_peer_groups

    lm_groups, lm_notes = lm_peer_groups(repeats=repeats, warmup=warmup, quick=quick)
    notes += lm_notes
    return {
        "status": "ok",
        "note": "",
        "config": {
            "model": "mlp",
            "hidden": list(config.hidden),
            "batch_size": config.batch_size,
            "flax": importlib.metadata.version("flax"),
            "qwix": importlib.metadata.version("qwix"),
        },
        "groups": [group, cnn, *snn_groups, *rules_groups, *lm_groups],
        "notes": notes,
    }


def mlp_group(*, repeats: int, warmup: int, quick: bool) -> tuple[dict[str, Any], list[str], Any]:
    """The functional-pipeline group of :func:`peers_suite` (its variants, described there), and its notes.

    Also timed in CPU time, with more rounds, by ``benchmarks/qat_step.py``.

    Returns:
      ``(group, notes, config)``: the :func:`stejax.bench.compare` record, the
      peer libraries' warnings, and the :class:`stejax.train.TrainConfig` of the set-up.
    """
    calls, ratios, info, notes, config = mlp_calls(quick=quick)
    group = compare(
        f"QAT training step, MLP, batch {config.batch_size}",
        calls,
        repeats=repeats,
        warmup=warmup,
        ratios=ratios,
        info=info,
    )
    return group, notes, config


def mlp_calls(
    *, quick: bool, programs: dict[str, Any] | None = None
) -> tuple[dict[str, Any], list[tuple[str, str]], dict[str, Any], list[str], Any]:
    """The calls :func:`mlp_group` times, untimed: ``(calls, ratios, info, notes, config)``.

    ``benchmarks/qat_step.py`` times the same calls in CPU time. With ``programs``
    (a dict), each variant's program is stored there by name, for its compiled
    HLO: ``(jitted function, arguments)``, or the compiled text for the Flax
    and Qwix steps.
    """
    import optax
    import qwix
    from flax import nnx

    from stejax.bench._peers_rules import qwix_per_tensor_provider
    from stejax.train import Batch, TrainConfig, compiled_train_step, compiled_update, load_splits, make_optimizer

    config = (
        TrainConfig(model="mlp", dropout=0.0, hidden=(16,), batch_size=32)
        if quick
        else TrainConfig(model="mlp", dropout=0.0)
    )
    splits = load_splits(config)
    normalizer = Normalizer.fit(splits.train.x)
    x = jnp.asarray(normalizer.apply(splits.train.x[: config.batch_size]))
    y = jnp.asarray(splits.train.y[: config.batch_size])
    optimizer = make_optimizer(config, len(splits.train) // config.batch_size)
    model_config = config.model_config(splits.train)
    if not isinstance(model_config, MLPConfig):  # model="mlp" above
        raise TypeError(f"peers: expected an MLPConfig for model='mlp'; got {type(model_config).__name__}.")
    sizes = (model_config.in_features, *model_config.hidden, model_config.n_classes)

    calls = {}
    programs = {} if programs is None else programs
    batch = Batch(x, y)
    for name in ("float", "w8a8"):
        qc = preset(name)
        params = init_params(jax.random.key(0), model_config, qc)
        state = optimizer.init(params)
        # The step stejax.train.train takes on every batch but an epoch's last (log False): the update alone.
        train_step = compiled_train_step(model_config, qc, optimizer)
        calls[f"stejax {name}"] = lambda step=train_step, p=params, s=state: step(p, s, batch, None, False)
        programs[f"stejax {name}"] = (train_step.update, (params, state, batch, None))
        if name == "w8a8":
            full = compiled_update(model_config, qc, optimizer)
            calls["stejax w8a8 (with statistics)"] = lambda step=full, p=params, s=state: step(p, s, batch, None)
            programs["stejax w8a8 (with statistics)"] = (full, (params, state, batch, None))
    # Qwix's scheme from the catalog: the same weights as stejax float, quantised in the step.
    int8_params = init_params(jax.random.key(0), model_config, preset("float"))
    int8_state = optimizer.init(int8_params)
    for label, integer_products in (("stejax int8", False), ("stejax int8 (integer products)", True)):
        int8_step = _int8_step(optimizer, integer_products=integer_products)
        calls[label] = lambda step=int8_step, p=int8_params, s=int8_state: step(p, s, x, y)
        programs[label] = (int8_step, (int8_params, int8_state, x, y))

    class MLP(nnx.Module):
        def __init__(self, sizes: tuple[int, ...], rngs: nnx.Rngs):
            self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in itertools.pairwise(sizes)])

        def __call__(self, h):
            for i, layer in enumerate(self.layers):
                h = layer(h)
                if i < len(self.layers) - 1:
                    h = jax.nn.relu(h)
            return h

    # Flax and Qwix warn about their own deprecated APIs; the warnings are kept as notes.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with standard_promotion():
            float_model = MLP(sizes, nnx.Rngs(0))
            rules = [qwix.QtRule(module_path=".*", weight_qtype=jnp.int8, act_qtype=jnp.int8)]
            # One activation scale per tensor, as stejax int8 (Qwix's default is one per example).
            qwix_model = qwix.quantize_model(float_model, qwix_per_tensor_provider(rules), x)
        # Outside standard_promotion: the promotion mode is part of jit's trace cache key,
        # and the timed calls run in the caller's mode.
        compiled: dict[str, str] = {}
        calls.update(
            nnx_steps(
                nnx, optax, optimizer, {"flax float": float_model, "qwix int8": qwix_model}, x, y, compiled=compiled
            )
        )
        programs.update(compiled)
    notes = sorted({f"{w.category.__name__} from a peer library: {' '.join(str(w.message).split())}" for w in caught})

    ratios = [
        ("stejax int8", "qwix int8"),
        ("stejax int8 (integer products)", "qwix int8"),
        ("stejax int8 (integer products)", "stejax int8"),
        ("stejax w8a8", "stejax float"),
        ("stejax w8a8 (with statistics)", "stejax w8a8"),
        ("qwix int8", "stejax w8a8"),
        ("flax float", "stejax float"),
        ("qwix int8", "flax float"),
    ]
    info = {
        "model": f"MLP {' -> '.join(map(str, sizes))}, ReLU, no dropout",
        "batch_size": config.batch_size,
        "optimizer": f"{config.optimizer}, {config.schedule}, lr {config.learning_rate} (the same optax object)",
        "stejax w8a8": preset("w8a8").describe().rstrip("."),
        "qwix int8": "qwix.QtRule(module_path='.*', weight_qtype=int8, act_qtype=int8): absmax per-channel "
        "weights, dynamic int8 activations with one scale per tensor (QtProvider told so by "
        "qwix_per_tensor_provider; its default is one per example); int8 x int8 -> int32 products in the forward "
        "pass; straight-through backward through the whole product, with the unquantised operands and no clip mask",
        "stejax int8": "Qwix's scheme from the catalog on the functional pipeline: every layer's weights "
        "fake_quant(w, absmax_scale(w, bits=8, axis=1), bits=8, axis=1) (per output channel) and its input "
        "fake_quant(u, absmax_scale(u, bits=8), bits=8) (per tensor, dynamic), scales recomputed every step, "
        "clipped straight-through gradient; a plain jitted value_and_grad and optimiser step",
        "stejax int8 (integer products)": "stejax int8's model, scales, batch and optimiser with each layer's "
        "product through stejax.quantized_matmul(u, w, absmax_scale(u, bits=8), absmax_scale(w, bits=8, axis=1)): "
        "the same codes, multiplied as int8 x int8 -> int32 by dot_general (as Qwix's forward) and rescaled once; "
        "the gradient is the fake-quant composition's (clipped straight-through on each operand, dequantised "
        "operands), as stejax int8's",
        "stejax float, stejax w8a8": "stejax.train.compiled_train_step(...)(params, opt_state, batch, None, "
        "False): the step stejax.train.train takes on every batch but an epoch's last, update(..., "
        "statistics=False) (the finite flag over parameters, loss and gradient, no zero-gradient fractions)",
        "stejax w8a8 (with statistics)": "stejax w8a8's update with the zero-gradient fractions of every "
        "quantiser (update(..., statistics=True)): what they would cost on every step",
        "qwix_quantised_dot_generals": calls.pop("_quantised_dots"),
        "differences": "stejax's update also computes a finite flag (and, with statistics, the zero-gradient "
        "fractions); stejax int8 and Qwix int8 compute neither. The gradients differ: stejax int8 applies the "
        "catalog's clipped straight-through estimator to each operand (the product's gradient taken with the "
        "quantised operands, masked where the rounded value is clipped), Qwix passes the float product's gradient "
        "with the unquantised operands. stejax int8 multiplies the dequantised operands in float32; stejax int8 "
        "(integer products) and Qwix multiply int8 codes into int32 sums. Flax and Qwix run under standard "
        "promotion",
    }
    return calls, ratios, info, notes, config


def cnn_group(*, repeats: int, warmup: int, quick: bool) -> tuple[dict[str, Any], list[str]]:
    """The functional int8 step on the digits CNN against Qwix's, interleaved: ``(group, notes)``."""
    calls, ratios, info, notes = cnn_calls(quick=quick)
    group = compare(
        f"int8 QAT training step, digits CNN, batch {info['batch_size']}",
        calls,
        repeats=repeats,
        warmup=warmup,
        ratios=ratios,
        info=info,
    )
    return group, notes


def cnn_calls(
    *, quick: bool, programs: dict[str, Any] | None = None
) -> tuple[dict[str, Any], list[tuple[str, str]], dict[str, Any], list[str]]:
    """The calls :func:`cnn_group` times, untimed: ``(calls, ratios, info, notes)``.

    ``programs`` as for :func:`mlp_calls`.
    :class:`stejax.flax.models.DigitsCNN` (3x3 convolutions of 16 and 32 channels,
    the second at stride 2, ReLU, one dense layer; ``quick``: 8 and 16) on a random
    batch of 64 (``quick``: 16), the reference recipe's Adam: ``flax float``, ``qwix int8`` (as on the
    MLP, one activation scale per tensor) and ``stejax int8``, the same
    architecture as a functional step built from the catalog, every kernel and
    input through :func:`stejax.fake_quant` with :func:`stejax.absmax_scale` (per
    output channel and per tensor, recomputed every step).
    """
    import optax
    import qwix
    from flax import nnx

    from stejax.bench._peers_rules import qwix_per_tensor_provider
    from stejax.flax.models import DigitsCNN
    from stejax.train import TrainConfig, make_optimizer

    channels = (8, 16) if quick else (16, 32)
    batch = 16 if quick else 64
    # The reference recipe's optimiser (Adam, warm-up and cosine decay), one object for every variant.
    optimizer = make_optimizer(TrainConfig(), 20)
    key_x, key_y, key_p = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(key_x, (batch, 64))
    y = jax.random.randint(key_y, (batch,), 0, 10)
    shapes = [(3, 3, 1, channels[0]), (3, 3, channels[0], channels[1]), (16 * channels[1], 10)]
    params = [
        {"w": 0.1 * jax.random.normal(k, shape), "b": jnp.zeros(shape[-1])}
        for k, shape in zip(jax.random.split(key_p, 3), shapes, strict=True)
    ]
    step = _int8_cnn_step(optimizer)
    state = optimizer.init(params)
    calls: dict[str, Any] = {"stejax int8": lambda: step(params, state, x, y)}
    programs = {} if programs is None else programs
    programs["stejax int8"] = (step, (params, state, x, y))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with standard_promotion():
            float_model = DigitsCNN(channels, rngs=nnx.Rngs(0))
            rules = [qwix.QtRule(module_path=".*", weight_qtype=jnp.int8, act_qtype=jnp.int8)]
            qwix_model = qwix.quantize_model(float_model, qwix_per_tensor_provider(rules), x)
        compiled: dict[str, str] = {}
        models = {"flax float": float_model, "qwix int8": qwix_model}
        calls.update(nnx_steps(nnx, optax, optimizer, models, x, y, compiled=compiled))
        programs.update(compiled)
    notes = sorted({f"{w.category.__name__} from a peer library: {' '.join(str(w.message).split())}" for w in caught})
    info = {
        "model": f"digits CNN, channels {list(channels)}, strides [1, 2], dense head",
        "batch_size": batch,
        "optimizer": "stejax.train.make_optimizer(TrainConfig(), 20): Adam, warm-up and cosine decay, the same "
        "object for every variant",
        "stejax int8": "functional step: each convolution and the head compute fake_quant(u, absmax_scale(u, bits=8), "
        "bits=8) against fake_quant(w, absmax_scale(w, bits=8, axis=-1), bits=8, axis=-1), clipped "
        "straight-through gradient",
        "qwix_quantised_dot_generals": calls.pop("_quantised_dots"),
    }
    ratios = [("stejax int8", "qwix int8"), ("qwix int8", "flax float"), ("stejax int8", "flax float")]
    return calls, ratios, info, notes


def _int8_cnn_step(optimizer):
    """A jitted training step of the digits CNN fake-quantised with Qwix's int8 scheme, built from the catalog."""
    import optax

    from stejax.estimators.calibration import absmax_scale
    from stejax.estimators.uniform import fake_quant

    def quantised(u, w):
        u = fake_quant(u, absmax_scale(u, bits=8), bits=8)
        axis = w.ndim - 1
        return u, fake_quant(w, absmax_scale(w, bits=8, axis=axis), bits=8, axis=axis)

    def forward(params, x):
        h = jnp.reshape(x, (x.shape[0], 8, 8, 1))
        for layer, stride in zip(params[:2], (1, 2), strict=True):
            u, w = quantised(h, layer["w"])
            h = jax.lax.conv_general_dilated(
                u, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
            ) + jnp.reshape(layer["b"], (1, 1, 1, -1))
            h = jax.nn.relu(h)
        u, w = quantised(jnp.reshape(h, (h.shape[0], -1)), params[2]["w"])
        return u @ w + params[2]["b"][None, :]

    def loss(params, x, y):
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(forward(params, x), y))

    def step(params, opt_state, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return jax.jit(step)


def _int8_step(optimizer, *, integer_products: bool = False):
    """A jitted training step of an MLP fake-quantised with Qwix's int8 scheme, built from the catalog.

    Layer ``i`` computes ``Q(u) @ Q_c(w) + b`` with ``Q(u) = fake_quant(u, absmax_scale(u))``
    (8-bit, per tensor, from the current batch) and ``Q_c`` the same per output
    channel; ReLU between layers. The scales are calibration values (no gradient);
    the inputs and weights get the clipped straight-through gradient. With
    ``integer_products``, the product is :func:`stejax.quantized_matmul` with the same
    scales: the same codes multiplied as int8 x int8 -> int32, the same gradient.
    """
    import optax

    from stejax.estimators.calibration import absmax_scale
    from stejax.estimators.uniform import fake_quant
    from stejax.lowbit._matmul import quantized_matmul

    def product(h, w):
        h_scale, w_scale = absmax_scale(h, bits=8), absmax_scale(w, bits=8, axis=1)
        if integer_products:
            return quantized_matmul(h, w, h_scale, w_scale, bits=8)
        return fake_quant(h, h_scale, bits=8) @ fake_quant(w, w_scale, bits=8, axis=1)

    def forward(params, x):
        layers = params["layers"]
        h = x
        for i, layer in enumerate(layers):
            h = product(h, layer["w"]) + layer["b"][None, :]
            if i < len(layers) - 1:
                h = jax.nn.relu(h)
        return h

    def loss(params, x, y):
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(forward(params, x), y))

    def step(params, opt_state, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return jax.jit(step)


def _importable(name: str) -> bool:
    """Whether ``import name`` works (a module set to None in ``sys.modules`` counts as absent)."""
    try:
        return importlib.util.find_spec(name) is not None and importlib.import_module(name) is not None
    except (ImportError, ValueError):
        return False


def _aqt_note() -> str:
    if _importable("aqt"):
        return "AQT (aqtp) is installed but has no benchmark here yet."
    return "AQT (aqtp): not installed."
