"""Sequence slots (pipeline/sequence_slots.py): the lowest free slot of the instance with
the most free; a slot given back is taken before any never handed out; none when all are
taken; and a config's huge slot count costs nothing until slots are used."""

from __future__ import annotations

from tensorgate.pipeline.sequence_slots import SequenceSlots


def test_slots_spread_over_instances_lowest_first() -> None:
    slots = SequenceSlots(2, 2)
    taken = [slots.take() for _ in range(4)]
    assert None not in taken
    assert sorted(t for t in taken if t is not None) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert taken[0] is not None and taken[1] is not None and taken[0][0] != taken[1][0]
    assert slots.take() is None
    slots.give_back(1, 1)
    slots.give_back(1, 0)
    assert slots.free(1) == 2 and slots.free(0) == 0
    assert [slots.take(), slots.take(), slots.take()] == [(1, 0), (1, 1), None]


def test_a_returned_slot_goes_before_fresh_ones() -> None:
    slots = SequenceSlots(2**31 - 1, 1)  # as a config may ask: nothing made per slot
    assert [slots.take() for _ in range(3)] == [(0, 0), (0, 1), (0, 2)]
    slots.give_back(0, 1)
    assert slots.take() == (0, 1)
    assert slots.take() == (0, 3)
    assert slots.free(0) == 2**31 - 1 - 4
