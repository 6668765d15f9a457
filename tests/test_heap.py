"""The cycle collector around streaming loops: set aside, collected less often, restored after."""

from __future__ import annotations

import gc
import weakref

import pytest

from phrase_scorer.runtime.heap import YOUNG_THRESHOLD, steady_heap
from phrase_scorer.runtime.workers import Pipeline


class Node:
    pass


def test_inside_the_loop_old_objects_are_set_aside_and_collections_are_rarer():
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    with steady_heap():
        assert gc.get_threshold()[0] == max(YOUNG_THRESHOLD, before[0])
        assert gc.get_threshold()[1:] == before[1:]
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_garbage_made_inside_is_still_collected():
    with steady_heap():
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: only the collector frees it
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        assert gone() is None


def test_the_last_of_nested_uses_restores_the_collector():
    before = gc.get_threshold()
    with steady_heap():
        with steady_heap():
            pass
        assert gc.get_threshold()[0] == max(YOUNG_THRESHOLD, before[0]) and gc.get_freeze_count() > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_a_failing_pipeline_restores_the_collector():
    before = gc.get_threshold()
    seen = []

    def produce(put):
        for i in range(3):
            put(i)

    def work(item):
        seen.append((gc.get_threshold()[0], gc.get_freeze_count() > 0))
        if item == 1:
            raise ValueError("bad item")
        return item

    with pytest.raises(ValueError, match="bad item"):
        Pipeline().run(produce, work, lambda item: None)
    assert seen and all(threshold == max(YOUNG_THRESHOLD, before[0]) and frozen for threshold, frozen in seen)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
