"""persistent_cache_off: JAX's persistent compilation cache off inside the block, as it was after."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from stejax._compile_cache import persistent_cache_off
from stejax.bench._measure import CompileCounter


def test_persistent_cache_off_compiles_inside_and_restores_the_setting():
    before = jax.config.jax_enable_compilation_cache
    x = jnp.ones(7)

    def program(x):
        return jnp.sin(x) * 3.0 + 1.0

    with persistent_cache_off():
        assert jax.config.jax_enable_compilation_cache is False
        with CompileCounter() as counter:
            jax.jit(program).lower(x).compile()
        assert counter.count == 1
        with persistent_cache_off():  # nested: the inner block restores the outer one's setting
            pass
        assert jax.config.jax_enable_compilation_cache is False
    assert jax.config.jax_enable_compilation_cache is before
