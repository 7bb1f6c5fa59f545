"""Triton's rate limiter (`--rate-limit execution_count`): a model instance runs a batch only
while it holds the resources its instance group's `rate_limiter` names, across all models.

What it is for: models that must not all run at once (memory they allocate while running,
a device shared by big models). Resources are counted per device unless the config says
`global: true`; how many of each there are is the most any loaded instance asks for (each
can run alone), or what `--rate-limit-resource NAME:COUNT[:DEVICE]` says. An instance that
cannot run waits; when resources come back, the waiting instances are offered them in turn
by stride scheduling on their `priority` (a weight: priority 2 gets half the turns of 1),
and one that still does not fit holds back later ones that want the same resources, so a
large claim is not starved by small ones.

Everything runs on the event loop (schedulers call it from there): no locks.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping

__all__ = ["Claim", "RateLimiter", "parse_resource_counts"]

Key = tuple[str, int | None]  # a resource on a device (-1: the CPU), or global (None)
_NOT_WAITING = float("inf")  # a claim not waiting comes after every one that is, turn for turn


def parse_resource_counts(given: Iterable[str]) -> dict[Key, int]:
    """`NAME:COUNT[:DEVICE]` (Triton's --rate-limit-resource) → counts by (name, device);
    device None: every device, and the resource where it is global."""
    counts: dict[Key, int] = {}
    for text in given:
        parts = text.split(":")
        if len(parts) not in (2, 3) or not parts[0] or not all(
                part.isdecimal() for part in parts[1:]):
            raise ValueError(f"rate limit resource '{text}' is not NAME:COUNT or "
                             "NAME:COUNT:DEVICE (a GPU's index)")
        key = (parts[0], int(parts[2]) if len(parts) == 3 else None)
        if key in counts:
            raise ValueError(f"rate limit resource '{text}' is given twice")
        counts[key] = int(parts[1])
    return counts


class Claim:
    """One model instance's resources while it executes, and its place in the turns."""

    __slots__ = ("limiter", "label", "needs", "priority", "turn", "since", "_wake")

    def __init__(self, limiter: RateLimiter, label: str, needs: tuple[tuple[Key, int], ...],
                 priority: int) -> None:
        self.limiter = limiter
        self.label = label  # the model and instance, for errors
        self.needs = needs
        self.priority = priority
        self.turn = 0  # stride scheduling's pass: lower runs first
        self.since = _NOT_WAITING  # when it began to wait, for ties of turn
        self._wake: Callable[[], None] | None = None

    def place(self) -> tuple[int, float]:
        """Its place in line: by turn, then by how long it has waited."""
        return self.turn, self.since

    def may_run(self) -> bool:
        """Whether it could take its resources now (taking them is `take`)."""
        return self.limiter.may_run(self)

    def take(self) -> None:
        self.limiter.take(self)

    def give_back(self) -> None:
        """Its execution is over: its resources are free. Its own scheduler tries to run
        its next batch (yielding to earlier turns), then `offer`s the rest to the others."""
        self.limiter.give_back(self)

    def offer(self) -> None:
        self.limiter.offer()

    def wait(self, wake: Callable[[], None]) -> None:
        """Call `wake` (once) when its resources may be free; `wake` tries again."""
        if self._wake is None:
            self._wake = wake
            self.limiter.waiting.append(self)
            if self.since == _NOT_WAITING:
                self.since = next(self.limiter.arrivals)

    def woken(self) -> Callable[[], None] | None:
        wake, self._wake = self._wake, None
        return wake


class RateLimiter:
    """The server's resources and the model instances that claim them."""

    def __init__(self, counts: Mapping[Key, int] | None = None) -> None:
        """`counts`: what --rate-limit-resource gives (parse_resource_counts)."""
        self._given = dict(counts or {})
        self._claims: list[Claim] = []
        self._available: dict[Key, int] = {}
        self._in_use: dict[Key, int] = {}
        self._held: set[Claim] = set()
        self.waiting: list[Claim] = []
        self.arrivals = itertools.count()
        self._turn = 0  # the pass of the last claim to run: newcomers start there

    def claim(self, label: str, resources: Iterable[tuple[str, int, bool]], device: int,
              priority: int) -> Claim | None:
        """Register an instance on `device` (-1: the CPU) that needs `resources` (name,
        count, global) to run; None when it needs none. ValueError when a count given by
        --rate-limit-resource is below what it needs: it could never run."""
        needs = tuple(((name, None if is_global else device), count)
                      for name, count, is_global in resources if count > 0)
        if not needs:
            return None
        for key, count in needs:
            given = self._given_count(key)
            if given is not None and given < count:
                where = "global" if key[1] is None else (
                    "the CPU" if key[1] < 0 else f"GPU {key[1]}")
                raise ValueError(f"{label} needs {count} of rate limiter resource "
                                 f"'{key[0]}' ({where}), but --rate-limit-resource gives "
                                 f"{given}: it could never run")
        claim = Claim(self, label, needs, max(priority, 1))
        claim.turn = self._turn
        self._claims.append(claim)
        self._recount()
        return claim

    def release(self, claim: Claim) -> None:
        """The instance is gone (its model unloaded): forget it and what it held."""
        if claim in self._held:
            self.give_back(claim)
            self.offer()
        if claim in self.waiting:
            self.waiting.remove(claim)
            claim.woken()
        self._claims.remove(claim)
        self._recount()

    def _given_count(self, key: Key) -> int | None:
        return self._given.get(key, self._given.get((key[0], None)))

    def _recount(self) -> None:
        """Each resource's copies: the count given, else the most one instance needs."""
        available: dict[Key, int] = {}
        for claim in self._claims:
            for key, count in claim.needs:
                given = self._given_count(key)
                available[key] = given if given is not None else max(
                    available.get(key, 0), count)
        self._available = available

    def may_run(self, claim: Claim) -> bool:
        if claim in self._held:
            return False  # an instance runs one batch at a time
        # (a released claim's resources may be gone: it runs no more)
        if any(self._in_use.get(key, 0) + count > self._available.get(key, 0)
               for key, count in claim.needs):
            return False
        # one waiting for the same resources ahead of it in line goes first
        keys = {key for key, _ in claim.needs}
        place = claim.place()
        return not any(other is not claim and other.place() < place
                       and keys.intersection(key for key, _ in other.needs)
                       for other in self.waiting)

    def take(self, claim: Claim) -> None:
        for key, count in claim.needs:
            self._in_use[key] = self._in_use.get(key, 0) + count
        self._held.add(claim)
        if claim in self.waiting:
            self.waiting.remove(claim)
            claim.woken()
        claim.since = _NOT_WAITING
        self._turn = max(self._turn, claim.turn)
        claim.turn += claim.priority

    def give_back(self, claim: Claim) -> None:
        if claim not in self._held:
            return
        self._held.discard(claim)
        for key, count in claim.needs:
            self._in_use[key] -= count

    def offer(self) -> None:
        """Wake the waiting that may run now, in turn; a wake-up may take the resources, or
        find nothing left to run (its requests went elsewhere) and wait no more."""
        for waiting in sorted(self.waiting, key=Claim.place):
            if waiting not in self.waiting or not self.may_run(waiting):
                continue
            self.waiting.remove(waiting)
            wake = waiting.woken()
            if wake is not None:
                wake()
