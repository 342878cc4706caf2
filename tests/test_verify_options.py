"""check_surrogate's key, params and name; assert_surrogate's options; a reference that proves nothing."""

import inspect
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stejax
from stejax.testing import assert_surrogate
from stejax.verify import check_surrogate


def _dither_forward(x, *, key, p=0.5):
    # Rounds up or down at random: a random estimator's forward.
    up = jax.random.bernoulli(key, p, x.shape)
    return jnp.where(up, jnp.ceil(x), jnp.floor(x))


def _dither_derivative(x, *, key, p=0.5):
    return jnp.ones_like(x)


dither = stejax.surrogate(_dither_forward, _dither_derivative, name="dither", random=True)


def test_a_random_surrogate_is_verified_with_a_key_and_static_params():
    report = check_surrogate(
        dither,
        reference=_dither_forward,
        derivative=_dither_derivative,
        key=jax.random.key(3),
        params={"p": 0.25},
        boundaries=(0.0, 1.0),
        dtypes=("float32",),
    )
    assert report.ok, report.summary()
    assert report.subject == "dither" and report.environment["params"] == {"p": "0.25"}
    assert report.environment["key"] == "given" and report.notes == ()


def test_the_key_really_reaches_the_reference():
    # Another key in the reference draws other roundings: the forward check must fail.
    def other_key_reference(x, *, key, p=0.5):
        return _dither_forward(x, key=jax.random.fold_in(key, 1), p=p)

    report = check_surrogate(
        dither, reference=other_key_reference, derivative=_dither_derivative, key=jax.random.key(3), dtypes=("float32",)
    )
    assert not report["forward_bitwise[float32]"].passed


def test_a_random_surrogate_without_a_key_is_refused():
    with pytest.raises(TypeError, match=r"check_surrogate: dither is random .* pass key=jax\.random\.key\(0\)"):
        check_surrogate(dither, reference=_dither_forward, derivative=_dither_derivative)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"params": [("p", 0.5)]}, TypeError, r"`params` must be a mapping of keyword names"),
        ({"params": {"key": 1}}, TypeError, r"pass the PRNG key as `key=`"),
        ({"name": ""}, TypeError, r"`name` must be a non-empty string"),
        (
            {"boundaries": [0.5, float("nan")]},
            ValueError,
            r"`boundaries` must be finite .* got nan at position 1",
        ),
        ({"boundaries": [float("inf")]}, ValueError, r"got inf at position 0"),
    ],
)
def test_bad_options_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        check_surrogate(stejax.round_ste, reference=jnp.round, derivative=jnp.ones_like, **kwargs)


def test_name_titles_the_report_and_a_lambda_is_not_called_locals():
    wrapped = lambda x: stejax.round_ste(x)  # noqa: E731
    plain = check_surrogate(wrapped, reference=jnp.round, derivative=jnp.ones_like, dtypes=("float32",))
    assert plain.subject == "<lambda>" and "<locals>" not in plain.summary()
    named = check_surrogate(
        wrapped, reference=jnp.round, derivative=jnp.ones_like, dtypes=("float32",), name="my_round"
    )
    assert named.subject == "my_round" and named.summary().startswith("my_round: all")
    assert named.to_markdown().startswith("# stejax verify: my_round\n")


def test_a_reference_that_is_the_function_itself_is_said_to_prove_nothing():
    for reference in (stejax.round_ste, jax.jit(stejax.round_ste)):
        report = check_surrogate(stejax.round_ste, reference=reference, derivative=jnp.ones_like, dtypes=("float32",))
        assert report.ok  # the checks pass: that is exactly why the note is needed
        assert len(report.notes) == 1 and "prove nothing about its forward" in report.notes[0]
        assert "note: the reference is the function under test itself" in report.summary()
        assert "**Note**: the reference is the function under test itself" in report.to_markdown()
        assert json.loads(report.to_json())["notes"] == list(report.notes)


def test_assert_surrogate_takes_every_option_of_check_surrogate():
    check = inspect.signature(check_surrogate).parameters
    assert_ = inspect.signature(assert_surrogate).parameters
    assert list(assert_) == list(check)
    for name, p in check.items():
        assert (assert_[name].kind, assert_[name].default) == (p.kind, p.default), name


def test_assert_surrogate_passes_the_options_on():
    report = assert_surrogate(
        dither,
        reference=_dither_forward,
        derivative=_dither_derivative,
        key=jax.random.key(0),
        params={"p": 0.75},
        dtypes=("bfloat16", "float32"),
        composition_dtypes="widest",
        name="dither_075",
    )
    assert report.subject == "dither_075" and list(report.environment["composition_dtypes"]) == ["float32"]
    assert [c.name for c in report.checks if c.kind == "vmap"] == ["vmap[float32]"]
    with pytest.raises(AssertionError, match=r"forward_bitwise\[float32\]"):
        assert_surrogate(
            stejax.floor_ste, reference=jnp.round, derivative=jnp.ones_like, dtypes=("float32",), name="floor"
        )


@pytest.mark.parametrize(("name", "axis"), [("fake_quant", 0), ("lsq", 0), ("lsq_plus", -1), ("lsq", 2)])
def test_check_estimator_verifies_per_channel_modes(name, axis):
    from stejax.verify import check_estimator

    report = check_estimator(name, params={"bits": 4, "axis": axis}, dtypes=("float32",))
    assert report.ok, report.summary() + "".join(f"\n{c.name}: {c.detail}" for c in report.failures)
    assert any(c.kind == "vmap" for c in report.checks)


def test_per_group_is_per_channel_on_the_reshaped_input():
    # Groups of g consecutive elements: one scale per row of x.reshape(-1, g), axis 0 of that array,
    # the same values as one scale per element repeated g times.
    g = 4
    x = jnp.linspace(-2, 2, 24, dtype=jnp.float32)
    scale = stejax.absmax_scale(x, bits=4, group_size=g).reshape(-1)
    grouped = stejax.fake_quant(x.reshape(-1, g), scale, bits=4, axis=0).reshape(x.shape)
    per_element = stejax.fake_quant(x, jnp.repeat(scale, g), bits=4, axis=0)
    assert np.array_equal(np.asarray(grouped), np.asarray(per_element))
    # The verifier's example for axis=-2 is (4, 4): four groups of four along the last axis.
    from stejax.verify import check_estimator

    report = check_estimator("fake_quant", params={"bits": 4, "axis": -2}, dtypes=("float32",))
    assert report.ok, report.summary()


def test_load_callable_from_a_file(tmp_path, monkeypatch):
    from stejax.verify import load_callable

    (tmp_path / "helper_for_mymod.py").write_text("def offset():\n    return 1\n")
    (tmp_path / "mymod.py").write_text(
        "import helper_for_mymod\n\ndef f(x):\n    return x + helper_for_mymod.offset()\n"
    )
    assert load_callable(f"{tmp_path}/mymod.py:f")(2) == 3
    monkeypatch.chdir(tmp_path)
    assert load_callable("./mymod.py:f")(2) == 3
    assert load_callable("mymod.py:f", path=tmp_path)(5) == 6
    with pytest.raises(FileNotFoundError, match=r"nothere\.py: does not exist \(named in './nothere\.py:f'\)"):
        load_callable("./nothere.py:f")
    (tmp_path / "broken.py").write_text("def f(:\n")
    with pytest.raises(ImportError, match=r"broken\.py: not valid Python"):
        load_callable("./broken.py:f")
    with pytest.raises(AttributeError, match=r"has no attribute 'g'"):
        load_callable("./mymod.py:g")
