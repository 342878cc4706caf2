"""The key stream (stejax.keys): splitting, consumption marks and the key-reuse debug mode."""

from __future__ import annotations

import inspect

import jax
import numpy as np
import pytest

from stejax import keys


def _line_of(marker: str) -> int:
    """The line number of the line in this file that contains ``marker``."""
    lines = inspect.getsource(inspect.getmodule(_line_of)).splitlines()
    (n,) = [i + 1 for i, line in enumerate(lines) if marker in line and "_line_of(" not in line]
    return n


def test_split_is_jax_random_split():
    key = jax.random.key(3)
    ours = keys.split(key, 4)
    theirs = jax.random.split(jax.random.key(3), 4)
    assert ours.shape == (4,)
    assert jax.dtypes.issubdtype(ours.dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(ours), jax.random.key_data(theirs))


def test_split_unpacks():
    a, b = keys.split(jax.random.key(0))
    assert a.shape == () and b.shape == ()


@pytest.mark.parametrize(
    ("key", "num", "error", "match"),
    [
        (jax.random.PRNGKey(0), 2, TypeError, "typed PRNG key made by jax.random.key"),
        (np.zeros(2, np.uint32), 2, TypeError, "typed PRNG key"),
        ("seed", 2, TypeError, "got str"),
        (jax.random.key(0), 0, ValueError, "num must be >= 1; got 0"),
        (jax.random.key(0), True, TypeError, "num must be an int"),
        (jax.random.key(0), 2.0, TypeError, "num must be an int"),
        (
            jax.random.split(jax.random.key(0), 3),
            2,
            ValueError,
            r"single key of shape \(\); got shape \(3,\)",
        ),
    ],
)
def test_split_rejects_bad_arguments(key, num, error, match):
    with pytest.raises(error, match=match):
        keys.split(key, num)


def test_consume_rejects_raw_keys():
    with pytest.raises(TypeError, match="typed PRNG key"):
        keys.consume(jax.random.PRNGKey(0))


def test_consume_returns_the_key_and_checks_nothing_outside_debug_mode():
    key = jax.random.key(1)
    assert keys.consume(key) is key
    assert keys.consume(key) is key  # no ledger: reuse is not tracked


def test_reuse_raises_naming_both_labels():
    with keys.checked() as ledger:
        a, _ = keys.split(jax.random.key(0), where="root split")
        keys.consume(a, where="init layer 0")
        with pytest.raises(keys.KeyReuseError) as info:
            keys.consume(a, where="dropout layer 1")
    err = info.value
    assert err.first == "init layer 0"
    assert err.second == "dropout layer 1"
    assert err.made == "root split"
    assert "first at init layer 0, again at dropout layer 1" in str(err)
    assert "It was made at root split" in str(err)
    assert err.key_bits == np.asarray(jax.random.key_data(a)).tobytes().hex()
    assert isinstance(err, jax.errors.KeyReuseError)
    assert len(ledger) == 3  # the root and its two children


def test_reuse_names_file_and_line_by_default():
    with keys.checked():
        key = jax.random.key(7)
        keys.consume(key)  # first-use-marker
        with pytest.raises(keys.KeyReuseError) as info:
            keys.consume(key)  # second-use-marker
    here = "tests/test_keys.py"
    assert info.value.first.endswith(f"{here}:{_line_of('# first-use-marker')}")
    assert info.value.second.endswith(f"{here}:{_line_of('# second-use-marker')}")
    assert "It was not made by stejax.keys.split" in str(info.value)


def test_splitting_a_consumed_key_is_reuse():
    with keys.checked():
        key = jax.random.key(2)
        keys.consume(key, where="shuffle")
        with pytest.raises(keys.KeyReuseError, match="first at shuffle, again at split at init"):
            keys.split(key, where="init")


def test_splitting_twice_is_reuse():
    with keys.checked():
        key = jax.random.key(2)
        keys.split(key, where="first split")
        with pytest.raises(keys.KeyReuseError, match="first at split at first split, again at split at second"):
            keys.split(key, where="second")


def test_a_key_array_marks_each_key():
    with keys.checked(jax_check=False):
        batch = keys.split(jax.random.key(5), 3, where="per-example keys")
        keys.consume(batch, where="vmapped dropout")
        with pytest.raises(keys.KeyReuseError, match="first at vmapped dropout, again at again"):
            keys.consume(batch[1], where="again")


def test_fresh_keys_pass_and_unused_keys_are_listed():
    with keys.checked() as ledger:
        k_init, k_data, _spare = keys.split(jax.random.key(0), 3, where="root")
        a, b = keys.split(k_init, where="init")
        jax.random.normal(keys.consume(a, where="layer 0"), (2,))
        jax.random.normal(keys.consume(b, where="layer 1"), (2,))
        jax.random.permutation(keys.consume(k_data, where="shuffle"), 4)
        assert ledger.unused() == ("root",)  # k_spare, never used


def test_same_bits_from_two_calls_are_the_same_key():
    with keys.checked(), pytest.raises(keys.KeyReuseError, match="first at run 1, again at run 2"):
        keys.consume(jax.random.key(9), where="run 1")
        keys.consume(jax.random.key(9), where="run 2")


def test_ledgers_are_scoped_to_their_block():
    key = jax.random.key(4)
    with keys.checked() as outer:
        keys.consume(key, where="outer")
        with keys.checked() as inner:
            keys.consume(key, where="inner")  # a fresh ledger: not a reuse
        assert len(inner) == 1 and len(outer) == 1
        with pytest.raises(keys.KeyReuseError, match="first at outer, again at outer again"):
            keys.consume(key, where="outer again")
    keys.consume(key)  # no ledger any more


def test_checked_turns_on_jax_key_reuse_flag_for_the_block():
    before = jax.config.jax_debug_key_reuse
    with keys.checked():
        assert jax.config.jax_debug_key_reuse is True
    assert jax.config.jax_debug_key_reuse == before
    with keys.checked(jax_check=False):
        assert jax.config.jax_debug_key_reuse == before


def test_jax_flag_catches_reuse_inside_jit():
    @jax.jit
    def twice(key):
        return jax.random.normal(key, ()) + jax.random.normal(key, ())

    with keys.checked(), pytest.raises(jax.errors.KeyReuseError, match="already consumed"):
        twice(jax.random.key(0))


def test_traced_keys_are_left_to_jax():
    # Inside jit a key is a tracer without bits: the ledger records nothing.
    @jax.jit
    def draw(key):
        return jax.random.normal(keys.consume(key, where="traced"), ())

    with keys.checked(jax_check=False) as ledger:
        draw(jax.random.key(0))
        draw(jax.random.key(0))
    assert len(ledger) == 0


def test_a_jitted_step_is_checked_by_running_it_eagerly():
    @jax.jit
    def step(key):
        a, _b = keys.split(key, where="step split")
        noise = jax.random.normal(keys.consume(a, where="noise"), ())
        return noise + jax.random.normal(keys.consume(a, where="dropout"), ())  # the bug: a, not _b

    with (
        jax.disable_jit(),
        keys.checked(),
        pytest.raises(keys.KeyReuseError, match="first at noise, again at dropout"),
    ):
        step(jax.random.key(0))
