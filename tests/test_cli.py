"""The command line and the estimator plots, over the whole catalog.

Two toy entries, defined here, stand for catalog shapes that the rounding family
lacks: an extra positional array and a required parameter (``toy_fake_quant``),
and a rank-1 input with a codebook and a non-diagonal tangent map
(``toy_nearest_code``).
"""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner

import stejax.cli.catalog
import stejax.cli.training
from stejax.cli import main
from stejax.estimators._core import surrogate
from stejax.estimators._entry import ArgSpec, Entry, ParamSpec
from stejax.estimators.catalog import CATALOG, FAMILIES, Catalog
from stejax.plot import plot_estimator
from stejax.render import plain_math

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _fake_quant_forward(x, scale, *, bits):
    top = 2 ** (bits - 1)
    return jnp.clip(jnp.round(x / scale), -top, top - 1) * scale


def _fake_quant_derivative(x, scale, *, bits):
    top = 2 ** (bits - 1)
    r = x / scale
    return ((r >= -top) & (r <= top - 1)).astype(x.dtype)


_fake_quant = surrogate(_fake_quant_forward, _fake_quant_derivative, name="toy_fake_quant")


def toy_fake_quant(x, scale, *, bits):
    """Fake quantisation to signed ``bits``-bit integers times ``scale``.

    Second paragraph, not shown by ``show``.
    """
    if not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"toy_fake_quant: bits must be an int in [2, 8]; got {bits!r}.")
    return _fake_quant(x, scale, bits=bits)


def _nearest_code_forward(x, codebook):
    codes = codebook.reshape((1,) * (x.ndim - 1) + codebook.shape)
    distance = jnp.sum((x[..., None, :] - codes) ** 2, axis=-1)
    return jnp.take(codebook, jnp.argmin(distance, axis=-1), axis=0)


def _nearest_code_tangent(x, codebook, *, tangents):
    (t,) = tangents
    return t - jnp.mean(t, axis=-1, keepdims=True)


toy_nearest_code = surrogate(_nearest_code_forward, tangent=_nearest_code_tangent, name="toy_nearest_code")

TOYS = (
    Entry(
        name="toy_fake_quant",
        family="uniform",
        fn=toy_fake_quant,
        forward=_fake_quant_forward,
        derivative=_fake_quant_derivative,
        tangent=None,
        diff_argnums=(0,),
        boundaries=lambda *, bits: tuple(0.25 * (k + 0.5) for k in range(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)),
        params=(ParamSpec("bits", None, (3, 4), "integer bits, 2 to 8"),),
        args=(
            ArgSpec(
                "scale",
                lambda rng, shape, dtype, params: np.full((1,) * len(shape), 0.25, dtype),
                False,
                "step size, broadcast against x",
            ),
        ),
        forward_math=r"y = s \cdot \operatorname{clip}(\operatorname{round}(x/s), -2^{b-1}, 2^{b-1}-1)",
        derivative_math=r"\partial y/\partial x = \mathbb{1}[-2^{b-1} \le x/s \le 2^{b-1}-1]",
        kinks="Ties at half steps; the clip points keep derivative 1.",
        reference="a toy for the CLI tests",
    ),
    Entry(
        name="toy_nearest_code",
        family="latent",
        fn=toy_nearest_code,
        forward=_nearest_code_forward,
        derivative=None,
        tangent=_nearest_code_tangent,
        diff_argnums=(0,),
        boundaries=lambda: (),
        args=(
            ArgSpec(
                "codebook",
                lambda rng, shape, dtype, params: rng.standard_normal((4, shape[-1])).astype(dtype),
                False,
                "(K, D) code vectors",
            ),
        ),
        input_rank=1,
        example_shape=lambda: (2, 3),
        forward_math=r"y = c_{k^*},\ k^* = \operatorname{argmin}_k \|x - c_k\|",
        reference="a toy for the CLI tests",
    ),
)
TOY_CATALOG = Catalog((*CATALOG.values(), *TOYS))


@pytest.fixture
def runner():
    # A wide console, so that rich wraps long math and references less.
    return CliRunner(env={"COLUMNS": "200"})


def _flat(text):
    return " ".join(text.split())


@pytest.fixture
def toy_catalog(monkeypatch):
    monkeypatch.setattr(stejax.cli.catalog, "CATALOG", TOY_CATALOG)
    monkeypatch.setattr(stejax.cli.training, "CATALOG", TOY_CATALOG)
    return TOY_CATALOG


def _is_png(path):
    data = path.read_bytes()
    return len(data) > 1000 and data.startswith(PNG_SIGNATURE)


def test_list_shows_every_estimator(runner):
    result = runner.invoke(main, ["list"])
    assert result.exit_code == 0, result.output
    for name in CATALOG:
        assert name in result.output


@pytest.mark.parametrize("family", [f for f in FAMILIES if CATALOG.family(f)])
def test_list_family_shows_only_that_family(runner, family):
    result = runner.invoke(main, ["list", "--family", family])
    assert result.exit_code == 0, result.output
    first_words = [line.split()[0] for line in result.output.splitlines()]  # one line per estimator
    assert first_words == [e.name for e in CATALOG.family(family)]
    long = runner.invoke(main, ["list", "--long", "--family", family])
    first_cells = re.findall(r"^│ (\S+) +│", long.output, flags=re.MULTILINE)
    assert first_cells == [e.name for e in CATALOG.family(family)]


def test_list_rejects_an_unknown_family(runner):
    result = runner.invoke(main, ["list", "--family", "nope"])
    assert result.exit_code == 2
    assert "nope" in result.output


@pytest.mark.parametrize("name", list(CATALOG))
def test_show_prints_the_entry_and_writes_its_plot(runner, tmp_path, name):
    entry = CATALOG[name]
    out = tmp_path / f"{name}.png"
    result = runner.invoke(main, ["show", name, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert _is_png(out)
    output = _flat(result.output)
    assert str(out.resolve()) in result.output.replace("\n", "")
    for text in (entry.reference, entry.forward_math, entry.derivative_math, entry.kinks):
        assert _flat(text) in output


def test_show_writes_name_png_in_the_working_directory_by_default(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(main, ["show", "round_ste"])
    assert result.exit_code == 0, result.output
    assert _is_png(tmp_path / "round_ste.png")


@pytest.mark.parametrize("name", [t.name for t in TOYS])
def test_show_plots_entries_with_extra_arrays_ranks_and_tangents(runner, tmp_path, toy_catalog, name):
    out = tmp_path / "plot.png"
    result = runner.invoke(main, ["show", name, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert _is_png(out)


def test_show_prints_parameters_args_and_summary(runner, tmp_path, toy_catalog):
    result = runner.invoke(main, ["show", "toy_fake_quant", "--out", str(tmp_path / "p.png")])
    assert result.exit_code == 0, result.output
    for text in ("bits", "required", "integer bits, 2 to 8", "scale", "step size", "Fake quantisation"):
        assert text in result.output
    assert "Second paragraph" not in result.output


def test_show_with_a_param_plots_with_it(runner, tmp_path, toy_catalog):
    out = tmp_path / "bits5.png"
    result = runner.invoke(main, ["show", "toy_fake_quant", "--param", "bits=5", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert _is_png(out)


def test_show_unknown_name_exits_2_with_suggestions(runner):
    result = runner.invoke(main, ["show", "round_st"])
    assert result.exit_code == 2
    assert "no estimator named 'round_st'" in result.output
    assert "round_ste" in result.output


def test_show_unknown_name_without_close_match_lists_the_catalog(runner):
    result = runner.invoke(main, ["show", "qqqqqqqq"])
    assert result.exit_code == 2
    assert "known:" in result.output


@pytest.mark.parametrize(
    ("pair", "message"),
    [
        ("bits", "expected KEY=VALUE, got 'bits'"),
        ("=4", "expected KEY=VALUE"),
        ("levels=4", "toy_fake_quant has no parameter 'levels'; its parameters: bits"),
        ("bits=[4,", "bits: expected a Python literal"),
        ("bits=9", "toy_fake_quant: bits must be an int in \\[2, 8\\]; got 9"),
        ("bits=four", "toy_fake_quant: bits must be an int in \\[2, 8\\]; got 'four'"),
    ],
)
def test_show_bad_param_exits_2(runner, tmp_path, toy_catalog, pair, message):
    result = runner.invoke(main, ["show", "toy_fake_quant", "--param", pair, "--out", str(tmp_path / "p.png")])
    assert result.exit_code == 2
    assert re.search(message, _flat(result.output))


def test_show_param_for_an_estimator_without_params(runner, tmp_path):
    result = runner.invoke(main, ["show", "round_ste", "--param", "bits=4", "--out", str(tmp_path / "p.png")])
    assert result.exit_code == 2
    assert "round_ste has no parameter 'bits'; its parameters: none" in _flat(result.output)


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("4", 4),
        ("0.5", 0.5),
        ("(3, 5)", (3, 5)),
        ("True", True),
        ("'nearest'", "nearest"),
        ("nearest", "nearest"),
    ],
)
def test_param_values_are_python_literals(raw, value):
    assert stejax.cli.catalog._parse_params(TOYS[0], [f"bits={raw}"]) == {"bits": value}


def test_demo_writes_plots_and_summary(runner, tmp_path, monkeypatch):
    # One real entry per family and the toys keep this fast; `show` covers every entry.
    firsts = [CATALOG.family(f)[0] for f in FAMILIES if CATALOG.family(f)]
    catalog = Catalog((*firsts, *TOYS))
    monkeypatch.setattr(stejax.cli.catalog, "CATALOG", catalog)
    monkeypatch.setattr(stejax.cli.training, "CATALOG", catalog)
    # The comparison itself is tested in test_train.py; here only the catalog part.
    monkeypatch.setattr("stejax.train.compare", lambda names, **kwargs: {"summary": {}, "targets": []})
    out = tmp_path / "demo"
    result = runner.invoke(main, ["demo", "--out", str(out), "--catalog"])
    assert result.exit_code == 0, result.output
    for name in catalog:
        assert _is_png(out / "plots" / f"{name}.png")
        assert name in result.output
    summary = (out / "catalog.md").read_text(encoding="utf-8")
    for name in catalog:
        assert f"`{name}`" in summary
        assert f"(plots/{name}.png)" in summary
    # A bare | would end the Markdown cell early.
    for row in summary.splitlines()[2:]:
        assert row.count("|") == 7, row


@pytest.mark.parametrize(
    ("latex", "plain"),
    [
        (r"\partial y/\partial x = \mathbb{1}[|x| \le 1]", "∂y/∂x = 𝟙[|x| ≤ 1]"),
        (r"y = \lfloor x \rfloor", "y = ⌊x⌋"),
        (r"y = \operatorname{round}(x)\ \text{(ties to even)}", "y = round(x) (ties to even)"),
        (r"\frac{1}{\alpha} \sigma(\alpha x)", "1/α σ(αx)"),
        (r"\frac{x - a}{2}", "(x - a)/2"),
        (r"\unknowncommand{x} + 1", r"\unknowncommand{x} + 1"),
    ],
)
def test_plain_math(latex, plain):
    assert plain_math(latex) == plain


def test_plot_estimator_fills_in_default_params(tmp_path):
    path = plot_estimator(TOYS[0], tmp_path / "sub" / "fq.png")
    assert path == tmp_path / "sub" / "fq.png"
    assert _is_png(path)


def test_core_plot_and_list_import_without_matplotlib():
    # One fresh interpreter for both checks: importing stejax and stejax.plot, then running `stejax list`.
    code = (
        "import sys; import stejax, stejax.plot; "
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported by stejax or stejax.plot'; "
        "from click.testing import CliRunner; from stejax.cli import main; "
        "r = CliRunner().invoke(main, ['list']); assert r.exit_code == 0, r.output; "
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported by stejax list'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _load_script(relative):
    """Import a repository script (docs/generate.py) as a module."""
    path = Path(__file__).resolve().parents[1] / relative
    spec = importlib.util.spec_from_file_location(path.stem + "_script", path)
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_docs_page_has_a_section_and_picture_per_estimator():
    generate = _load_script("docs/generate.py")
    page = generate.render_page([*CATALOG.values(), *TOYS])
    for entry in (*CATALOG.values(), *TOYS):
        assert f"### `{entry.name}`" in page
        assert f"(img/{entry.name}.png)" in page
        assert f"(#{entry.name})" in page
    assert "| `bits` | required | `3`, `4` | integer bits, 2 to 8 |" in page
    assert "| `codebook` | no | (K, D) code vectors |" in page
    # A bare | would end a Markdown cell early.
    summary = [row for row in page.splitlines() if row.startswith("| [`")]
    assert len(summary) == len(CATALOG) + len(TOYS) and all(row.count("|") == 4 for row in summary)
    # The summary table holds words, which wrap; its formulas would not (the page was too wide at 1280 px).
    assert not any("\\partial" in row or "\\operatorname" in row for row in summary)


def test_docs_generator_writes_page_and_pictures(tmp_path, capsys):
    generate = _load_script("docs/generate.py")
    name = next(iter(CATALOG))
    assert generate.main(["--out", str(tmp_path), "--only", name]) == 0
    assert _is_png(tmp_path / "img" / f"{name}.png")
    assert f"### `{name}`" in (tmp_path / "estimators.md").read_text(encoding="utf-8")
    assert generate.main(["--out", str(tmp_path), "--only", "no_such_estimator"]) == 2
