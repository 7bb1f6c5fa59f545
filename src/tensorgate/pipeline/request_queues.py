"""The requests of one model version waiting for an executor, by priority level (Triton's
`priority_levels`, each with its own bounded queue and `default_queue_policy` /
`priority_queue_policy`), with their deadlines.

Queue 2i holds level i's requests in arrival order; queue 2i+1 those of them that timed out
under `timeout_action: DELAY`. Walking the queues in order is the order requests run in
(Triton's): a level's delayed requests before the next level's. The scheduler
(pipeline/scheduler.py) chooses batches from them; this module owns what waits: admission
against each level's bound, expiry, cancellation, and taking a chosen batch out.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from itertools import chain

from tensorgate.errors import DeadlineExceededError, UnavailableError
from tensorgate.pipeline.stats import ModelStatistics
from tensorgate.pipeline.work import WorkItem
from tensorgate.repository.model_config import QueuePolicy

__all__ = ["RequestQueues"]


class RequestQueues:
    """What waits to run for one model version, in the order it runs in."""

    def __init__(self, model: str, policies: tuple[QueuePolicy, ...],
                 stats: ModelStatistics) -> None:
        self._model = model
        self._policies = policies
        self._stats = stats
        self.queues: list[deque[WorkItem]] = [deque() for _ in range(2 * len(policies))]
        self.deadlines = 0  # queued items that carry a deadline

    def __iter__(self) -> Iterator[WorkItem]:
        """Every queued request, in the order they run in."""
        return chain.from_iterable(self.queues)

    def __bool__(self) -> bool:
        return any(self.queues)

    @property
    def pending(self) -> int:
        return sum(map(len, self.queues))

    def head(self) -> WorkItem | None:
        """The request that runs next: the first of the highest level that has any."""
        for queue in self.queues:
            if queue:
                return queue[0]
        return None

    def add(self, item: WorkItem) -> None:
        """Queue `item` at its level, or raise UNAVAILABLE when that level is full (of
        requests still waiting: expired and cancelled ones are cleared first)."""
        level = item.level
        bound = self._policies[level].max_queue_size
        if bound and self._level_size(level) >= bound:
            self.purge(time.monotonic_ns())
            if self._level_size(level) >= bound:
                where = f" at priority level {level + 1}" if len(self._policies) > 1 else ""
                raise UnavailableError(
                    f"Exceeds maximum queue size: model '{self._model}' already has "
                    f"{self._level_size(level)} requests queued{where} (max_queue_size "
                    f"{bound}); retry later, or raise max_queue_size or add instances")
        self.queues[2 * level].append(item)
        if item.deadline_ns:
            self.deadlines += 1

    def _level_size(self, level: int) -> int:
        return len(self.queues[2 * level]) + len(self.queues[2 * level + 1])

    def take_all(self) -> list[WorkItem]:
        """Empty the queues; what they held, in order."""
        items = list(self)
        for queue in self.queues:
            queue.clear()
        self.deadlines = 0
        return items

    def pop_head(self) -> WorkItem:
        """Take the head out (a batch of one request)."""
        item = next(queue for queue in self.queues if queue).popleft()
        self._forget_deadline(item)
        return item

    def take(self, chosen: list[WorkItem], now: int) -> None:
        """Take `chosen` out (requests of these queues), dropping the cancelled ones met on
        the way."""
        if len(chosen) == self.pending:  # all that waits (light load)
            for queue in self.queues:
                queue.clear()
            for item in chosen:
                self._forget_deadline(item)
            return
        taken = {id(item) for item in chosen}
        for index, queue in enumerate(self.queues):
            if not queue:
                continue
            rest: deque[WorkItem] = deque()
            for item in queue:
                if id(item) in taken:
                    self._forget_deadline(item)
                elif item.future.done():  # cancelled while queued: drop it now
                    self._forget_deadline(item)
                    self._stats.record_failure(now - item.enqueued_ns, "CANCELED")
                else:
                    rest.append(item)
            self.queues[index] = rest

    def earliest_deadline(self) -> int:
        """The first deadline of a queued request, 0 when none has one."""
        if not self.deadlines:
            return 0
        return min(item.deadline_ns for item in self if item.deadline_ns)

    def purge(self, now: int) -> None:
        """Drop cancelled requests; answer expired ones with DEADLINE_EXCEEDED, or move them
        behind the rest of their level where the level's policy says DELAY."""
        queues = self.queues
        for index, queue in enumerate(queues):
            if not queue:
                continue
            delay = index % 2 == 0 and self._policies[index // 2].delay_on_timeout
            keep: deque[WorkItem] = deque()
            for item in queue:
                if item.future.done():  # cancelled by its client
                    self._forget_deadline(item)
                    self._stats.record_failure(now - item.enqueued_ns, "CANCELED")
                elif item.deadline_ns and now >= item.deadline_ns:
                    self._forget_deadline(item)
                    if delay:
                        item.deadline_ns = 0
                        queues[index + 1].append(item)  # walked next, so kept there
                        continue
                    waited_ms = (now - item.enqueued_ns) / 1e6
                    self._stats.record_failure(now - item.enqueued_ns, "REJECTED")
                    item.fail(DeadlineExceededError(
                        f"request for model '{self._model}' timed out after "
                        f"{waited_ms:.1f} ms in the queue, before it ran; raise its timeout or "
                        "add instances"))
                else:
                    keep.append(item)
            queues[index] = keep

    def _forget_deadline(self, item: WorkItem) -> None:
        if item.deadline_ns:
            self.deadlines -= 1
