"""The spiking peer group of ``stejax bench --suite peers``: Spyx's training step beside stejax.snn's.

The group itself (its variants, ratio and T) is checked on the peers suite's quick run in tests/test_bench.py.
"""

import importlib.util

from stejax.bench._peers_snn import snn_peer_groups


def test_the_group_is_skipped_with_a_note_without_spyx(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "spyx" else real(name, *a))
    groups, notes = snn_peer_groups(repeats=1, warmup=1, quick=True)
    assert groups == [] and "Spyx not installed" in notes[0] and "stejax[peers]" in notes[0]
