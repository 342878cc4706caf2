"""The spiking peer group of ``stejax bench --suite peers``: Spyx's training step beside stejax.snn's."""

import importlib.util

import pytest

from stejax.bench._peers_snn import snn_peer_groups


@pytest.mark.skipif(importlib.util.find_spec("spyx") is None, reason="the peers extra (spyx) is not installed")
def test_spyx_and_stejax_steps_are_timed_side_by_side():
    groups, notes = snn_peer_groups(repeats=2, warmup=1, quick=True)
    (group,) = groups  # quick: T = 8 only
    assert set(group["variants"]) == {"stejax", "spyx"}
    ratio = group["ratios"]["stejax/spyx"]
    assert ratio["n"] == 2 and ratio["p50"] > 0
    assert group["info"]["T"] == 8 and "superspike" in group["info"]["spike function"]
    for variant in group["variants"].values():
        assert variant["compiles_timed"] == 0  # the timed calls reuse the compiled step
    assert {"name", "baseline", "variants", "ratios", "info"} <= set(group)  # the bench report's group schema


def test_the_group_is_skipped_with_a_note_without_spyx(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "spyx" else real(name, *a))
    groups, notes = snn_peer_groups(repeats=1, warmup=1, quick=True)
    assert groups == [] and "Spyx not installed" in notes[0] and "stejax[peers]" in notes[0]
