"""A jitted functional training step per Flax NNX model, shared by the peer benchmarks."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from stejax.bench._measure import standard_promotion

__all__ = ["nnx_steps"]


def nnx_steps(nnx, optax, optimizer, models, x, y, *, compiled: dict[str, str] | None = None) -> dict[str, Any]:
    """A jitted functional training step per NNX model (``nnx.split`` outside, ``nnx.merge`` inside).

    Besides the calls, ``"_quantised_dots"``: Qwix's ``dot_general_qt`` count in
    the ``"qwix int8"`` loss. With ``compiled`` (a dict), each step is compiled
    now and its HLO text stored there by label (the profile of what the step
    computes; the timed calls reuse that compilation).
    """
    calls: dict[str, Any] = {"_quantised_dots": 0}
    for label, model in models.items():
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)

        def loss_fn(params, x, y, graphdef=graphdef, rest=rest):
            logits = nnx.merge(graphdef, params, rest)(x)
            return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))

        def nnx_step(params, opt_state, x, y, loss_fn=loss_fn):
            with standard_promotion():
                value, grads = jax.value_and_grad(loss_fn)(params, x, y)
                updates, opt_state = optimizer.update(grads, opt_state, params)
                return optax.apply_updates(params, updates), opt_state, value

        step = jax.jit(nnx_step)
        state = optimizer.init(params)
        # Trace now, inside the caller's warning filter (Flax warns while tracing Qwix's
        # interception); the timed calls reuse the trace and compile on the first call.
        traced = step.trace(params, state, x, y)
        if compiled is not None:
            compiled[label] = traced.lower().compile().as_text()
        if label == "qwix int8":
            # Proof that Qwix quantised the products (else this would time a float model).
            with standard_promotion():
                calls["_quantised_dots"] = str(jax.make_jaxpr(loss_fn)(params, x, y)).count("dot_general_qt")
        calls[label] = lambda step=step, p=params, s=state: step(p, s, x, y)
    return calls
