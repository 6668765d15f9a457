"""The background batch maker: order kept, errors handed over, the thread stopped on close."""

from __future__ import annotations

import itertools

import pytest

from phrase_scorer.training.prefetch import Prefetcher


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_results_come_in_order(depth):
    with Prefetcher(iter(range(50)), lambda x: x * x, depth) as made:
        assert list(made) == [x * x for x in range(50)]


@pytest.mark.parametrize("depth", [0, 2])
def test_an_error_in_make_is_raised_in_the_consumer_after_the_items_before_it(depth):
    def make(x):
        if x == 3:
            raise ValueError("bad item 3")
        return x

    with Prefetcher(iter(range(10)), make, depth) as made:
        assert [next(made) for _ in range(3)] == [0, 1, 2]
        with pytest.raises(ValueError, match="bad item 3"):
            next(made)


def test_closing_stops_the_thread_of_an_endless_source():
    made = Prefetcher(itertools.count(), lambda x: x, 2)
    assert [next(made) for _ in range(5)] == [0, 1, 2, 3, 4]
    made.close()
    assert not made._thread.is_alive()
