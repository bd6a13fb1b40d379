"""The service's GC policy (service.gc_policy): frozen survivors, and the periodic thaw that reclaims cycles."""
from __future__ import annotations

import gc
import weakref

from service.gc_policy import GcPolicy


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_survivors_are_frozen_and_a_thaw_reclaims_frozen_cycles() -> None:
    policy = GcPolicy(thaw_every_s=3600)
    node = _Node()
    ref = weakref.ref(node)
    policy.install()
    try:
        assert gc.get_freeze_count() > 0  # what existed at install is frozen
        del node
        gc.collect()
        assert ref() is not None  # frozen: full collections do not walk it
        assert policy.frozen_after_full >= 1  # and that collection's survivors were frozen in turn
        assert not policy.maybe_thaw()  # not due yet
        policy.thaw_every_s = 1e-9
        assert policy.maybe_thaw()
        assert ref() is None  # the thaw collected everything once
        assert policy.thaws == 1
        assert gc.get_freeze_count() > 0  # and froze the survivors again
    finally:
        policy.uninstall()
    assert gc.get_freeze_count() == 0
    assert policy._after_collection not in gc.callbacks


def test_zero_leaves_the_collector_alone() -> None:
    policy = GcPolicy(thaw_every_s=0)
    policy.install()
    node = _Node()
    ref = weakref.ref(node)
    del node
    gc.collect()
    assert ref() is None
    assert gc.get_freeze_count() == 0
    assert not policy.maybe_thaw()
    policy.uninstall()
