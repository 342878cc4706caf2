"""`stejax list` and `stejax show`: plain text for every estimator, JSON on request, every parameter shown."""

import json

import pytest
from click.testing import CliRunner

from stejax.cli import main
from stejax.estimators.catalog import CATALOG
from stejax.render import derivative_math, first_paragraph, plain_math, plain_roles


@pytest.mark.parametrize("name", list(CATALOG))
def test_plain_math_leaves_no_latex(name):
    entry = CATALOG[name]
    for text in (plain_math(entry.forward_math), plain_math(derivative_math(entry))):
        assert "\\" not in text and "{" not in text and "}" not in text, text


@pytest.mark.parametrize("name", list(CATALOG))
def test_the_summary_show_prints_has_no_sphinx_roles(name):
    text = plain_roles(first_paragraph(CATALOG[name].fn))
    assert text and not any(mark in text for mark in (":math:", ":func:", ":class:", "``", "\\")), text


def test_show_prints_the_summary_as_plain_text(tmp_path):
    result = CliRunner().invoke(main, ["show", "absmean_ternary", "--out", str(tmp_path / "t.png")], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "Ternarise weights to {-γ, 0, +γ}, BitNet b1.58's absmean quantiser." in result.output, result.output


@pytest.mark.parametrize("form", [[], ["--long"]])
def test_list_prints_plain_text_for_every_estimator(form):
    result = CliRunner().invoke(main, ["list", *form], terminal_width=400)
    assert result.exit_code == 0, result.output
    assert "\\" not in result.output
    for name in CATALOG:
        assert name in result.output


def test_list_json():
    result = CliRunner().invoke(main, ["list", "--json"])
    assert result.exit_code == 0, result.output
    records = json.loads(result.output)
    assert [r["name"] for r in records] == list(CATALOG)
    by_name = {r["name"]: r for r in records}
    fq = by_name["fake_quant"]
    assert fq["forward_latex"] == CATALOG["fake_quant"].forward_math and "\\" not in fq["forward"]
    params = {p["name"]: p for p in fq["params"]}
    assert set(params) == {"bits", "signed", "narrow_range", "axis"}
    assert params["bits"]["required"] and params["axis"]["default"] == "None" and not params["axis"]["required"]
    assert [a["name"] for a in fq["args"]] == ["scale", "zero_point"]
    family = json.loads(CliRunner().invoke(main, ["list", "--json", "--family", "uniform"]).output)
    assert {r["family"] for r in family} == {"uniform"}


def test_show_takes_the_axis_of_a_per_channel_quantiser(tmp_path):
    result = CliRunner().invoke(
        main, ["show", "fake_quant", "--param", "bits=4", "--param", "axis=0", "--out", str(tmp_path / "fq.png")]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "fq.png").exists() and "axis" in result.output


def test_the_catalog_page_lists_exactly_the_estimators_stejax_list_prints():
    # docs/estimators.md's table, one row per estimator, against `stejax list --json`: no member missing
    # (absmean_ternary once was) and no other name for one (vq_ste for vq_quantize once was).
    import re
    from pathlib import Path

    listed = CliRunner().invoke(main, ["list", "--json"])
    assert listed.exit_code == 0, listed.output
    names = [entry["name"] for entry in json.loads(listed.output)]
    page = (Path(__file__).resolve().parents[1] / "docs" / "estimators.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| \[`([^`]+)`\]\(#\1\) \| (\w+) \|", page, flags=re.MULTILINE)
    assert [name for name, _ in rows] == names
    assert {name: family for name, family in rows} == {name: CATALOG[name].family for name in names}
    assert all(f"### `{name}`" in page for name in names)
