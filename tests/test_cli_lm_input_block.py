"""`stejax lm train --input-block`: checked against the architecture before training; `auto` (the default) picks
the block llama.cpp quantises the GGUF export's product inputs with; the run says when its GGUF file will not
compute what the model computes, and how to make it."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from stejax.cli import main
from stejax.cli.lm import _with_input_block
from stejax.lm import CONFIGS, LMConfig, check_input_block, llamacpp_input_blocks

DEFAULT = LMConfig(context=64, width=64, depth=2, heads=2, hidden=160, norms="llama")  # `lm train`'s defaults


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_a_block_that_does_not_divide_the_width_is_refused_before_training(tmp_path, monkeypatch):
    import stejax.lm

    def no_corpus(*args, **kwargs):
        raise AssertionError("the corpus was read: the block was not checked first")

    monkeypatch.setattr(stejax.lm, "build_corpus", no_corpus)
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["lm", "train", "--preset", "w1.58a8", "--input-block", "256", "--out", str(out)])
    assert result.exit_code == 2, result.output
    message = _one_line(result.output)
    assert "Invalid value for --input-block: input blocks of 256 do not fit this model" in message
    assert "inputs of 64 values (width: q, k, v, o, gate, up) and 160 (hidden: down)" in message
    assert "32 would fit (256 needs a width and hidden width that are multiples of 256)" in message
    assert "Traceback" not in result.output and not out.exists()


def test_auto_is_the_default_and_picks_32_at_width_64(tmp_path, monkeypatch):
    import stejax.lm

    seen = []

    def stop(model, config):
        seen.append(config)
        raise click.ClickException("stopped before training")

    monkeypatch.setattr(stejax.lm, "Transformer", lambda config, rngs: None)  # no model is built
    monkeypatch.setattr(stejax.lm, "quantize_lm", stop)
    monkeypatch.setattr(stejax.lm, "build_corpus", lambda corpus: None)
    args = ["lm", "train", "--preset", "w1.58a8", "--out", str(tmp_path / "run"), "--width", "64"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and "stopped before training" in result.output, result.output
    (config,) = seen
    assert config.name == "w1.58a8" and config.input_block == 32


@pytest.mark.parametrize(
    ("preset", "model", "block"),
    [
        ("w1.58a8", DEFAULT, 32),  # width 64: every ternary tensor is Q4_0
        ("w8a8", DEFAULT, 32),  # Q8_0
        ("w4a8", DEFAULT, 32),  # Q4_0
        ("w1.58a8", LMConfig(width=256, heads=2, hidden=512, norms="llama"), 256),  # every tensor TQ2_0
        ("float", DEFAULT, None),  # no quantised input
        ("w4a4", DEFAULT, None),  # 4-bit inputs: no GGUF form
        ("w8a8", LMConfig(width=64, heads=2, hidden=160, norms="subln"), None),  # SubLN: no GGUF form
    ],
)
def test_auto_picks_what_the_gguf_export_picks(preset, model, block):
    config, notes = _with_input_block(CONFIGS[preset], "auto", model)
    assert config.input_block == block
    if preset in ("w4a4",) or model.norms == "subln":
        (note,) = notes
        assert note.startswith("no GGUF export for llama.cpp:"), note
    else:
        assert notes == []  # llama.cpp quantises every input as the model does


def test_mixed_ternary_types_take_32_and_say_to_export_them_as_q4_0():
    model = LMConfig(width=256, heads=2, hidden=160, norms="llama")  # q..up rows of 256: TQ2_0; down: Q4_0
    assert llamacpp_input_blocks(model, "w1.58a8") == (32, 256)
    assert llamacpp_input_blocks(model, "w1.58a8", ternary="Q4_0") == (32,)
    config, (note,) = _with_input_block(CONFIGS["w1.58a8"], "auto", model)
    assert config.input_block == 32
    assert "export with --ternary Q4_0 for a file that computes exactly what this model computes" in note


def test_per_token_inputs_say_the_gguf_file_will_not_match():
    config, (note,) = _with_input_block(CONFIGS["w8a8"], "token", DEFAULT)
    assert config.input_block is None
    assert note == (
        "a GGUF export of this run will not match llama.cpp exactly: llama.cpp quantises the quantised products' "
        "inputs per block of 32, and this run uses one scale per token; to match, train with --input-block auto."
    )


@pytest.mark.parametrize(
    ("preset", "block", "message"),
    [
        ("float", "256", "--preset float has no quantised inputs; input blocks are llama.cpp's scales of 8-bit inputs"),
        ("float", "32", "--preset float has no quantised inputs"),
        ("w4a4", "32", "--preset w4a4 has 4-bit inputs; input blocks are llama.cpp's scales of 8-bit inputs"),
    ],
)
def test_an_explicit_block_without_8_bit_inputs_is_refused_naming_the_preset(preset, block, message, tmp_path):
    # Refused for what the configuration is, before the architecture is looked at: a float model has no
    # quantised linears whose input widths a block could fail to divide.
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["lm", "train", "--preset", preset, "--input-block", block, "--out", str(out)])
    assert result.exit_code == 2, result.output
    text = _one_line(result.output)
    assert f"Invalid value for --input-block: {message}" in text, text
    assert "taken by w8a8, w4a8, w2a8, w1.58a8, w4a8_no_ste. Leave --input-block at auto." in text
    assert "quantised linears take inputs" not in text and not out.exists()


def test_an_explicit_block_with_integer_products_is_refused():
    with pytest.raises(click.BadParameter, match=r"integer products \(--product int8\) scale their inputs per token; "):
        _with_input_block(CONFIGS["w8a8"].with_product("int8"), "32", DEFAULT)


def test_check_input_block_names_both_widths_and_what_fits():
    check_input_block(DEFAULT, 32)
    check_input_block(DEFAULT, None)
    with pytest.raises(ValueError, match=r"inputs of 48 values .* and 160 .*; no llama.cpp block \(32 or 256\) fits"):
        check_input_block(LMConfig(width=48, heads=2, hidden=160), 32)


def test_lm_export_of_a_per_token_run_says_it_will_not_match_llamacpp(tmp_path):
    import json

    from flax import nnx

    from stejax.lm import Transformer
    from stejax.lm._train import save_checkpoint

    arch = LMConfig(context=16, width=32, depth=1, heads=2, hidden=64, norms="llama")
    run = tmp_path / "run"
    run.mkdir()
    save_checkpoint(Transformer(arch, rngs=nnx.Rngs(params=0)), run / "params.safetensors")
    for block, noted in ((None, True), (32, False)):
        record = {"model": arch.to_dict(), "config": "w8a8", "input_block": block}
        (run / "config.json").write_text(json.dumps(record), encoding="utf-8")
        result = CliRunner().invoke(main, ["lm", "export", str(run), "--out", str(tmp_path / f"artifact-{block}")])
        assert result.exit_code == 0, result.output
        text = _one_line(result.output)
        assert ("note: a GGUF export of this run will not match llama.cpp exactly" in text) == noted, text
        if noted:
            assert "this run uses one scale per token; to match, train with --input-block auto." in text


def test_auto_leaves_integer_products_per_token_and_says_so():
    config, (note,) = _with_input_block(CONFIGS["w8a8"].with_product("int8"), "auto", DEFAULT)
    assert config.input_block is None and config.product == "int8"
    assert note == (
        "--product int8 scales the quantised products' inputs per token (integer products take no input blocks), "
        "so a GGUF export of this run will not match llama.cpp exactly, which quantises them per block of 32; to "
        "match, train with --product fake-quant."
    )
    _, (note,) = _with_input_block(CONFIGS["w8a8"].with_product("int8"), "token", DEFAULT)
    assert note.endswith("to match, train with --product fake-quant and --input-block auto."), note


def test_lm_train_with_integer_products_says_what_auto_did_once(tmp_path, monkeypatch):
    import types

    import stejax.lm

    def stop(*args, **kwargs):
        raise click.ClickException("stopped before training")

    corpus = types.SimpleNamespace(
        source="a test corpus", describe=lambda: {}, data=dict.fromkeys(("train", "validation"))
    )
    monkeypatch.setattr(stejax.lm, "build_corpus", lambda corpus_dir: corpus)
    monkeypatch.setattr(stejax.lm, "train_lm", stop)
    args = ["lm", "train", "--preset", "w8a8", "--product", "int8", "--out", str(tmp_path / "run"), "--steps", "1"]
    result = CliRunner(env={"COLUMNS": "1000"}).invoke(main, args)
    assert result.exit_code == 1 and "stopped before training" in result.output, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and notes[0].startswith(
        "note: --product int8 scales the quantised products' inputs per token"
    )
    assert "per block of 32; to match, train with --product fake-quant." in notes[0]
    assert "--input-block auto" not in result.output  # it was in use already


def test_a_refused_configuration_is_named_as_the_user_names_it(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["lm", "train", "--preset", "w4a8", "--product", "int8", "--out", str(out)])
    assert result.exit_code == 2, result.output
    text = _one_line(result.output)
    assert "Invalid value for --product: configuration 'w4a8': integer products take int8 per-channel" in text, text
    assert "LMQuant" not in text and not out.exists()
    for change in (lambda: CONFIGS["w8a8"].with_input_block(64), lambda: CONFIGS["w4a4"].with_input_block(32)):
        with pytest.raises(ValueError, match=r"^configuration 'w[48]a[48]': input"):
            change()
