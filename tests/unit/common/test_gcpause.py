"""gcpause: cyclic GC off while a large acyclic structure is built, as it was afterwards."""
from __future__ import annotations

import gc

import pytest

from slurm_gpu.gcpause import freeze_if_large, gc_paused


@pytest.fixture()
def gc_state():
    was = gc.isenabled()
    yield
    gc.unfreeze()
    (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("enabled", [True, False])
def test_paused_inside_and_as_it_was_after_even_on_an_error(gc_state, enabled: bool) -> None:
    (gc.enable if enabled else gc.disable)()
    with pytest.raises(KeyError), gc_paused():
        assert not gc.isenabled()
        raise KeyError("x")
    assert gc.isenabled() == enabled


def test_only_a_large_result_is_frozen(gc_state) -> None:
    gc.unfreeze()
    freeze_if_large(100, 100)
    assert gc.get_freeze_count() == 0
    freeze_if_large(101, 100)
    assert gc.get_freeze_count() > 0
