"""The sequence slots of a stateful model's instances (`max_candidate_sequences` each, or
the direct strategy's batch rows): which are free, lowest first, so that a direct batch stays
as short as the sequences running allow.

Free slots are those handed back (a heap) and those never handed out (from a counter up),
so that memory follows the slots in use, not the count a config names: a list of every slot
made max_candidate_sequences 30,000,000 cost 1.2 GB and 2.3 s at load, and 2^31 - 1 may be
asked.
"""

from __future__ import annotations

import heapq

__all__ = ["SequenceSlots"]


class SequenceSlots:
    """`per_instance` slots on each of `instances` instances."""

    def __init__(self, per_instance: int, instances: int) -> None:
        self._per_instance = per_instance
        self._returned: list[list[int]] = [[] for _ in range(instances)]
        self._fresh = [0] * instances

    def free(self, instance: int) -> int:
        return len(self._returned[instance]) + self._per_instance - self._fresh[instance]

    def take(self) -> tuple[int, int] | None:
        """(instance, slot): the lowest free slot of the instance with the most free; None
        when every slot is taken."""
        best = max(range(len(self._fresh)), key=self.free)
        if not self.free(best):
            return None
        returned = self._returned[best]
        if returned:  # each lower than any never handed out
            return best, heapq.heappop(returned)
        self._fresh[best] += 1
        return best, self._fresh[best] - 1

    def give_back(self, instance: int, slot: int) -> None:
        heapq.heappush(self._returned[instance], slot)
