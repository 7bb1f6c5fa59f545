"""The rate limiter's counting, turns and priorities, driven as schedulers drive it."""

from __future__ import annotations

import pytest

from tensorgate.pipeline.rate_limiter import RateLimiter, parse_resource_counts
from tensorgate.repository.model_config import parse_model_config


class Instance:
    """What a scheduler does with its claim: run when it may, else wait and try again when
    woken; `finish` ends its execution."""

    def __init__(self, limiter: RateLimiter, name: str, needs: list[tuple[str, int, bool]],
                 runs: list[str], device: int = -1, priority: int = 1) -> None:
        claim = limiter.claim(name, needs, device, priority)
        assert claim is not None
        self.claim = claim
        self.name = name
        self.runs = runs
        self.queued = 0

    def submit(self, count: int = 1) -> None:
        self.queued += count
        self.try_run()

    def try_run(self) -> None:
        if not self.queued:
            return
        if self.claim.may_run():
            self.claim.take()
            self.queued -= 1
            self.runs.append(self.name)
        else:
            self.claim.wait(self.try_run)

    def finish(self) -> None:
        self.claim.give_back()
        self.try_run()
        self.claim.offer()


def test_resources_default_to_the_most_one_instance_needs() -> None:
    runs: list[str] = []
    limiter = RateLimiter()
    a = Instance(limiter, "a", [("R1", 4, False), ("R2", 4, False)], runs)
    b = Instance(limiter, "b", [("R2", 5, False)], runs)
    c = Instance(limiter, "c", [("R1", 1, False)], runs)
    a.submit()
    b.submit()  # R2: 4 of 5 in use by a
    c.submit()  # R1: 4 of 4 in use by a
    assert runs == ["a"]
    a.finish()  # b then c, in the order they came
    assert runs == ["a", "b", "c"]
    b.finish()
    c.finish()
    a.submit()
    assert runs[-1] == "a"


def test_a_resource_is_per_device_unless_global() -> None:
    runs: list[str] = []
    limiter = RateLimiter()
    gpu0 = Instance(limiter, "gpu0", [("mem", 1, False)], runs, device=0)
    gpu1 = Instance(limiter, "gpu1", [("mem", 1, False)], runs, device=1)
    gpu0.submit()
    gpu1.submit()
    assert runs == ["gpu0", "gpu1"]  # one "mem" on each device
    shared = RateLimiter()
    runs.clear()
    first = Instance(shared, "first", [("link", 1, True)], runs, device=0)
    second = Instance(shared, "second", [("link", 1, True)], runs, device=1)
    first.submit()
    second.submit()
    assert runs == ["first"]  # one "link" for the whole server
    first.finish()
    assert runs == ["first", "second"]


def test_given_counts_override_and_one_that_could_never_run_is_refused() -> None:
    runs: list[str] = []
    limiter = RateLimiter(parse_resource_counts(["R:2", "R:1:1"]))
    a = Instance(limiter, "a", [("R", 1, False)], runs, device=0)
    b = Instance(limiter, "b", [("R", 1, False)], runs, device=0)
    a.submit()
    b.submit()
    assert runs == ["a", "b"]  # two copies on device 0 (and the CPU)
    with pytest.raises(ValueError, match=r"^big needs 2 of rate limiter resource 'R' "
                                         r"\(GPU 1\), but --rate-limit-resource gives 1"):
        limiter.claim("big", [("R", 2, False)], 1, 1)


def test_priority_2_gets_half_the_turns_of_priority_1() -> None:
    runs: list[str] = []
    limiter = RateLimiter()
    holder = Instance(limiter, "holder", [("R", 1, False)], runs)
    fast = Instance(limiter, "p1", [("R", 1, False)], runs, priority=1)
    slow = Instance(limiter, "p2", [("R", 1, False)], runs, priority=2)
    holder.submit()
    fast.submit(100)
    slow.submit(100)
    last = holder
    for _ in range(90):  # each execution ends and hands the resource on
        running = runs[-1]
        last = {"holder": holder, "p1": fast, "p2": slow}[running]
        last.finish()
    counted = runs[1:]
    assert abs(counted.count("p1") - 2 * counted.count("p2")) <= 2, counted


def test_a_large_claim_is_not_starved_by_small_ones() -> None:
    runs: list[str] = []
    limiter = RateLimiter()
    big = Instance(limiter, "big", [("R", 4, False)], runs)
    small = [Instance(limiter, f"s{i}", [("R", 1, False)], runs) for i in range(3)]
    small[0].submit(5)
    big.submit()  # needs all four: waits for s0
    small[1].submit(5)  # would fit beside s0, but big waits first for the same resource
    assert runs == ["s0"]
    small[0].finish()
    assert runs == ["s0", "big"]
    big.finish()
    assert runs[2:] == ["s1", "s0"]  # the small ones go on, s1 first: it had no turn yet


def test_a_released_claim_frees_what_it_held_and_recounts() -> None:
    runs: list[str] = []
    limiter = RateLimiter()
    a = Instance(limiter, "a", [("R", 3, False)], runs)
    b = Instance(limiter, "b", [("R", 1, False)], runs)
    a.submit()
    b.submit()
    assert runs == ["a"]  # three copies, all a's
    limiter.release(a.claim)  # its model unloaded while it ran: b runs
    assert runs == ["a", "b"]
    b.submit()  # one copy is left (only b needs it): b's next waits for b
    assert runs == ["a", "b"]
    b.finish()
    assert runs == ["a", "b", "b"]


def test_resource_counts_are_tritons_form() -> None:
    assert parse_resource_counts(["R1:10", "R2:5:0", "R2:8:1"]) == {
        ("R1", None): 10, ("R2", 0): 5, ("R2", 1): 8}
    for bad in ("R1", "R1:x", ":3", "R1:3:0:1", "R1:-1"):
        with pytest.raises(ValueError, match=r"^rate limit resource '"):
            parse_resource_counts([bad])
    with pytest.raises(ValueError, match=r"is given twice$"):
        parse_resource_counts(["R:1", "R:2"])


def test_the_config_says_each_groups_resources_and_priority() -> None:
    spec = parse_model_config("""
        name: "m"
        platform: "pytorch_libtorch"
        input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [4] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [4] } ]
        instance_group [ { count: 2 kind: KIND_CPU rate_limiter {
            resources [ { name: "R1" count: 4 }, { name: "R2" global: true count: 1 } ]
            priority: 2 } },
          { count: 1 kind: KIND_CPU } ]
        """, "m")
    first, second = spec.instance_groups
    assert first.resources == (("R1", 4, False), ("R2", 1, True)) and first.priority == 2
    assert second.resources == () and second.priority == 1
