"""The child process of aoti_check.py: loads an AOTInductor package with its input checks on
(AOTI_RUNTIME_CHECK_INPUTS=1, set by the parent), learns the sizes its code takes in the dims
it is asked about, then prints, per try, what it said.

Run as a file, not a module of the package, so that it imports torch and nothing more.
Argument: JSON {"path", "device", "batched", "rows", "inputs": [{"name", "dtype", "shape",
"probe", "bound", "ragged", "made"}], "tries": [{"rows", "view", "made"}]} (shapes of one
row where batched; "probe": the dims of that input to learn the range and ties of, "bound":
the range only (a batch input's count); "ragged": taken flat, its elements end to end;
"made": for a batch input, {"kind", "source" (an input index), "ragged" (the source's)},
how the server makes it, which the runs that learn ties make it by; "rows": the batch the
probes use, and the requests of those runs; a try's "made": by input index, {"shape",
"values"} of a batch input the server makes for that try). It
prints one line `aoti-bounds: <JSON>`: {"ranges": per input, {"dim", "low", "high"} per
probed dim, high null where unbounded; "ties": groups of [input, dim, a, b] sized a*s + b
from one s, or how it showed that the sizes are related in a way not learned} (null where
the checks refused something else: the tries then say what), then a line `aoti-check:
<JSON>` per try, null where the package ran, else its refusal.

The probes and a try with "view" pass meta tensors: the generated checks take each input's
dtype, sizes and strides, then its device, so a meta tensor of sizes they take is refused
for its device, and nothing is computed or allocated whatever the sizes. The tries that run
give the probed dims the least size the checks took (tied ones sized from it).
"""

import itertools
import json
import math
import re
import sys
from collections.abc import Callable
from typing import Any

import torch

DIRECT_LOADER_TORCH = (2, 13)  # the torch whose C++ package loader _loaded calls itself
ANSWER = "aoti-check: "
BOUNDS = "aoti-bounds: "
# what the generated checks say when they refuse a size (torch/_inductor's cpp wrapper)
SIZE = re.compile(r"input_handles\[(\d+)\]: (dim value is too small|dim value is too large|"
                  r"unmatched dim value) at (\d+), expected(?: it)?(?: to be)?:? (?:>= |<= )?"
                  r"(\d+)")
TOO_SMALL = "dim value is too small"
# what the generated code's assert_size_stride says of an input whose size is not the one
# its symbol took from an earlier input (given==expected)
UNEQUAL = re.compile(r"expected size (\d+)==(\d+), stride (\d+)==(\d+) at dim=(\d+)")
BIG = 2**31 - 1  # past any bound an export gives a dim; a meta tensor of it holds nothing
MAX_RUNS = 2000  # of a package learning its ties: each on zeros of a few elements (ms)


def _loaded(path: str) -> Callable[[list[torch.Tensor]], Any]:
    """The package's runner, called with its inputs in order: on the torch tensorgate is
    tested with, torch's C++ loader itself, which spares importing torch._inductor (0.9 s
    of the child's 3.1 here); else the way `aoti_load_package` goes. (torch 2.11 on the GPU
    machine crashed in that loader, SIGSEGV, for every package, the CPU's too.)"""
    if tuple(int(part) for part in torch.__version__.split(".")[:2]) == DIRECT_LOADER_TORCH:
        try:
            loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, -1)
            return lambda inputs: loader.boxed_run(inputs)
        except Exception:  # another model name: the public way
            pass
    from torch._inductor import aoti_load_package
    package = aoti_load_package(path)
    return lambda inputs: package(*inputs)


def _refusal(run: Callable[[list[torch.Tensor]], Any], inputs: list[torch.Tensor]) -> str | None:
    try:
        with torch.inference_mode():
            run(inputs)
    except Exception as error:  # the refusal is the answer
        return str(error) or type(error).__name__
    return None


def _probed(run: Callable[[list[torch.Tensor]], Any], request: dict[str, Any],
            dtypes: list[torch.dtype], device: torch.device
            ) -> tuple[list[list[dict[str, Any]]], list[list[int]]] | None:
    """Per input, the range of each dim it asks about, and the least shapes the checks take
    (batch: `rows`); None where the checks refuse something other than a size."""
    items = request["inputs"]
    shapes = [([request["rows"], *item["shape"][1:]] if request["batched"] else
               list(item["shape"])) for item in items]

    def meta(index: int, shape: list[int]) -> list[torch.Tensor]:
        """Inputs before `index` as real zeros its checks took, then metas from it on."""
        return ([torch.zeros(s, dtype=t, device=device)
                 for s, t in zip(shapes[:index], dtypes[:index])]
                + [torch.empty(shape, dtype=dtypes[index], device="meta")]
                + [torch.empty(s, dtype=t, device="meta")
                   for s, t in zip(shapes[index + 1:], dtypes[index + 1:])])

    def refused_size(error: str | None, index: int) -> re.Match[str] | None:
        size = SIZE.search(error or "")
        return size if size is not None and int(size[1]) == index else None

    ranges = []
    for index, item in enumerate(items):
        least: dict[int, tuple[int, str]] = {}
        for _ in range(len(shapes[index]) + 1):  # each dim is refused once at most
            error = _refusal(run, meta(index, shapes[index]))
            size = refused_size(error, index)
            if size is None:
                break
            dim, bound = int(size[3]), int(size[4])
            shapes[index][dim] = bound
            least[dim] = (bound, size[2])
        if f"input_handles[{index}]: unmatched device type" not in (error or ""):
            return None  # a dtype, a stride, the number of inputs: the tries say what
        found = []
        for dim in [*item["probe"], *item.get("bound", ())]:
            error = _refusal(run, meta(index, [BIG if d == dim else n
                                               for d, n in enumerate(shapes[index])]))
            size = refused_size(error, index)
            if size is not None and int(size[3]) == dim:
                high: int | None = int(size[4])
            elif f"input_handles[{index}]: unmatched device type" in (error or ""):
                high = None
            else:
                return None
            low, kind = least.get(dim, (1, ""))
            if kind == TOO_SMALL and low == 2:
                low = 1  # inductor's 0/1 specialization: its code takes 1 (aoti_check.py)
            found.append({"dim": dim, "low": low, "high": high})
        ranges.append(found)
    return ranges, shapes


Sizes = list[list[int]]
Dim = tuple[int, int]  # (input, dim)


class _Unlearned(Exception):
    """The package relates its probed dims in a way not learned here; says how it showed."""


class _Ties:
    """Learns how the package's code sizes its probed dims from one another.

    The code reads a size from the first input that has it, and with the checks on holds
    the others to what it makes of it (assert_size_stride: "expected size given==expected
    ... at dim=d"). So: give each probed dim a size of its own and put the refused ones to
    what was expected until the package runs (`settled`); then move each dim that stayed as
    given until the package keeps it at two more sizes: the dims that follow it are its
    group, how each is sized from s read from how far they moved (`followers`). Last, every
    group is run at its least s and at a larger one."""

    def __init__(self, run: Callable[[list[torch.Tensor]], Any], request: dict[str, Any],
                 dtypes: list[torch.dtype], ranges: list[list[dict[str, Any]]],
                 least: Sizes, device: torch.device) -> None:
        self.run, self.dtypes, self.device, self.least = run, dtypes, device, least
        self.runs = 0  # of the package, by `settled`
        items = request["inputs"]
        self.names = [item["name"] for item in items]
        self.requests = max(request["rows"], 1)  # each run's, one row each
        # batch inputs, made for each run from the sizes of their source (ragged batching)
        self.made = {index: item["made"] for index, item in enumerate(items) if item.get("made")}
        # (input, dim) -> (least the checks take, most); range-only dims ("bound") left out
        self.probed: dict[Dim, tuple[int, int | None]] = {
            (index, found_dim["dim"]): (least[index][found_dim["dim"]], found_dim["high"])
            for index, found in enumerate(ranges) for found_dim in found
            if found_dim["dim"] in items[index]["probe"]}

    def learn(self) -> tuple[list[list[list[int]]], Sizes]:
        """Groups of [input, dim, a, b] (the dim is a*s + b; the first of a group sizes s,
        and is alone in it where it takes only some sizes, 2*s), and sizes of every input
        it ran on with each group at its least s (the tries take them); raises
        _Unlearned."""
        start = [list(shape) for shape in self.least]
        used: set[int] = set()
        for (index, dim), (size, high) in self.probed.items():
            while size in used and (high is None or size < high):
                size += 1
            start[index][dim] = size
            used.add(size)
        base = self.settled(start)
        roots: dict[Dim, tuple[int, int]] = {}  # a dim no other sizes -> its (a, b)
        follows: dict[Dim, tuple[Dim, int, int]] = {}  # -> (the root it follows, a, b)
        for root in self.probed:
            if root in follows:
                continue
            a, b, found = self.followers(base, root)
            roots[root] = (a, b)
            for member, (c, d) in found.items():
                if member in follows:
                    raise _Unlearned(f"{self.named(member)} is sized from "
                                     f"{self.named(follows[member][0])} and from "
                                     f"{self.named(root)}")
                if c <= 0:
                    raise _Unlearned(f"{self.named(member)} shrinks as {self.named(root)} "
                                     "grows")
                follows[member] = (root, c, d)
        groups = [[[*root, a, b]] + [[*member, c, d] for member, (followed, c, d)
                                     in follows.items() if followed == root]
                  for root, (a, b) in roots.items()]  # bounded_spec keeps those that count
        tried = []
        for more in (0, 7):  # each group's least s, then up to 7 more
            sizes = [list(shape) for shape in base]
            for root, (a, b) in roots.items():
                least, high = self.probed[root]
                s = -(-(least - b) // a) + more
                if high is not None:
                    s = min(s, (high - b) // a)
                sizes[root[0]][root[1]] = a * s + b
                for (index, dim), (followed, c, d) in follows.items():
                    if followed == root:
                        sizes[index][dim] = c * s + d
            error = _refusal(self.run, self.zeros(sizes))
            if error is not None:
                raise _Unlearned(f"it refused the sizes learned, {sizes}: {first_line(error)}")
            tried.append(sizes)
        for (index, dim), _ in follows.items():  # each one refused, by name, when it is off
            off = [list(shape) for shape in tried[0]]
            off[index][dim] += 1
            said = UNEQUAL.findall(_refusal(self.run, self.zeros(off)) or "")
            if not any(int(dim_) == dim and (int(given), int(expected)) ==
                       (off[index][dim], tried[0][index][dim])
                       for given, expected, _, _, dim_ in said):
                raise _Unlearned(f"{self.named((index, dim))} was not refused alone at "
                                 f"{off[index][dim]} where the others took "
                                 f"{tried[0][index][dim]}")
        return groups, tried[0]

    def named(self, dim: Dim) -> str:
        return f"dim {dim[1]} of '{self.names[dim[0]]}'"

    def zeros(self, sizes: Sizes) -> list[torch.Tensor]:
        """Zeros of `sizes`; a batch input as the server makes it for `requests` requests
        whose source input is of those sizes (zeros there indexed past the input)."""
        return [made_batch_input(self.made[index], sizes[self.made[index]["source"]],
                                 self.requests, dtype, self.device) if index in self.made
                else torch.zeros(size, dtype=dtype, device=self.device)
                for index, (size, dtype) in enumerate(zip(sizes, self.dtypes))]

    def settled(self, sizes: Sizes, put_right: frozenset[int] = frozenset()) -> Sizes:
        """`sizes` with each probed dim the package refuses put to the size it expected,
        until it runs; raises _Unlearned where it refuses something else (a size out of a
        range, a dim not probed). The refusal names no input: the one refused is an input
        not yet put right (one put right passes) whose sizes and strides are the ones it
        names; where several are (two dims of one size and shape, in different groups),
        each is tried in turn."""
        self.runs += 1
        if self.runs > MAX_RUNS:
            raise _Unlearned(f"no sizes it takes were found in {MAX_RUNS} runs")
        error = _refusal(self.run, self.zeros(sizes))
        if error is None:
            return sizes
        said = [tuple(map(int, found)) for found in UNEQUAL.findall(error)]
        unequal = [(dim, expected) for given, expected, _, _, dim in said if given != expected]

        def named(index: int) -> bool:
            strides = torch.empty(sizes[index], device="meta").stride()
            return all(dim < len(sizes[index]) and sizes[index][dim] == given
                       and strides[dim] == stride for given, _, stride, _, dim in said)
        refused = [index for index in range(len(sizes)) if index not in put_right
                   and named(index) and all((index, dim) in self.probed for dim, _ in unequal)]
        if not refused or not unequal:
            raise _Unlearned(f"it refused sizes {sizes}: {first_line(error)}")
        for index in refused:
            fixed = [list(shape) for shape in sizes]
            for dim, expected in unequal:
                fixed[index][dim] = expected
            try:
                return self.settled(fixed, put_right | {index})
            except _Unlearned as failed:
                unlearned = failed
        raise unlearned

    def followers(self, base: Sizes, moving: Dim
                  ) -> tuple[int, int, dict[Dim, tuple[int, int]]]:
        """(a, b, followers): the sizes the package keeps `moving` at are a*s + b (a dim
        its code reads as 2*s is put back from an odd size), and the probed dims that
        follow it, each with (c, d): it is c*s + d. Learned by moving it one way to sizes
        no other probed dim has until three are kept. (1, 0, {}) where its range is one
        size. Raises _Unlearned where the package keeps it at no size it is moved to (it is
        sized from a dim not probed), sizes are kept unevenly, a follower moves unevenly,
        or it cannot be moved to a size of its own the package takes with the others put
        right."""
        index, dim = moving
        least, high = self.probed[moving]
        first = base[index][dim]
        taken = {base[i][d] for i, d in self.probed if (i, d) != moving}
        refusal, put_back = None, None
        for step in (1, -1):
            kept, gaps, clean, size = [(first, base)], [], True, first
            while len(kept) < 3 and abs(size - first) < 64 + 2 * len(self.probed):
                size += step
                if size < least or (high is not None and size > high):
                    break
                if size in taken:
                    clean = False  # a size between two kept ones not tried
                    continue
                moved = [list(shape) for shape in base]
                moved[index][dim] = size
                try:
                    settled = self.settled(moved)
                except _Unlearned as error:
                    refusal = error
                    break
                if settled[index][dim] != size:
                    put_back = (size, settled[index][dim])
                    continue
                if clean:
                    gaps.append(abs(size - kept[-1][0]))
                clean = True
                kept.append((size, settled))
            if len(kept) == 1 or not gaps:
                continue
            a = gaps[0]
            sizes = [n for n, _ in kept]
            if any(gap != a for gap in gaps) or any((n - first) % a for n in sizes):
                raise _Unlearned(f"{self.named(moving)} was kept at {sizes} only")
            b = first % a
            ss = [(n - b) // a for n in sizes]
            found = {}
            for member in self.probed:
                went = [point[member[0]][member[1]] for _, point in kept]
                if member == moving or len(set(went)) == 1:
                    continue
                c, rest = divmod(went[1] - went[0], ss[1] - ss[0])
                if rest or any(w - went[0] != c * (t - ss[0]) for w, t in zip(went, ss)):
                    raise _Unlearned(f"{self.named(member)} took {went} where "
                                     f"{self.named(moving)} took {sizes}")
                found[member] = (c, went[0] - c * ss[0])
            return a, b, found
        if refusal is not None:
            raise refusal
        if put_back is not None:
            raise _Unlearned(f"{self.named(moving)} is sized from a dim not variable in the "
                             f"config: given {put_back[0]}, it expected {put_back[1]}")
        if high is not None and high == least:
            return 1, 0, {}  # one size: nothing can follow it
        raise _Unlearned(f"{self.named(moving)} could not be moved to a size no other dim has")


def made_batch_input(made: dict[str, Any], source: list[int], requests: int,
                     dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A batch input as the server makes it (pipeline/ragged.py) for `requests` requests of
    one row each whose `source` input, as the model takes it, is of that shape: a ragged
    source's elements (flat) shared out between them, else one row each. `made`: {"kind",
    "ragged"} (the source's)."""
    if made["ragged"]:
        total = source[0]
        counts = [total // requests + (1 if k < total % requests else 0)
                  for k in range(requests)]
        rows = [[count] for count in counts]
    else:
        counts = [math.prod(source[1:])] * source[0]
        rows = [list(source[1:])] * source[0]
    return batch_input_tensor(made["kind"], counts, rows, dtype, device)


def batch_input_tensor(kind: str, counts: list[int], rows: list[list[int]] | None,
                       dtype: torch.dtype | None, device: torch.device | None = None
                       ) -> torch.Tensor:
    """A batch input of `kind` for requests of `counts` elements each of its source, whose
    rows' shapes (without the batch dim) are `rows` (None: not needed, a count's kind). The
    server's batches (pipeline/ragged.py) and this child's runs make them here alike: the
    child imports torch alone, so it is the one to hold it."""
    if kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":
        return torch.zeros(max(counts), dtype=dtype, device=device)  # only its shape counts
    values: Any
    if kind == "BATCH_ELEMENT_COUNT":
        values = counts
    elif kind.startswith("BATCH_ACCUMULATED_ELEMENT_COUNT"):
        values = list(itertools.accumulate(counts))
        if kind.endswith("WITH_ZERO"):
            values = [0, *values]
    else:  # BATCH_ITEM_SHAPE(_FLATTEN): each row's shape, as a row of numbers or flat
        assert rows is not None
        value = torch.tensor(rows, dtype=dtype, device=device)
        return value.reshape(-1) if kind == "BATCH_ITEM_SHAPE_FLATTEN" else value
    return torch.tensor(values, dtype=dtype, device=device)


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "(no message)"


def _lower_followers(ranges: list[list[dict[str, Any]]], groups: list[list[list[int]]],
                     least: Sizes) -> None:
    """A dim c*s + d of a group whose root takes a size the checks refused (inductor's 0/1
    specialization, see _probed: s of 1 where they said 2) takes c*s + d of that s too."""
    def found(index: int, dim: int) -> dict[str, Any]:
        return next(item for item in ranges[index] if item["dim"] == dim)
    for (index, dim, a, b), *followers in groups:
        low, checked = divmod(found(index, dim)["low"] - b, a), divmod(least[index][dim] - b, a)
        if low[1] or checked[1] or low[0] >= checked[0]:
            continue
        for other, other_dim, c, d in followers:
            item = found(other, other_dim)
            if item["low"] == c * checked[0] + d:
                item["low"] = c * low[0] + d


def main(request: dict[str, Any]) -> None:
    device = torch.device(request["device"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    run = _loaded(request["path"])
    dtypes = [getattr(torch, item["dtype"]) for item in request["inputs"]]
    probed = _probed(run, request, dtypes, device)
    ties: Any = None
    tried = None if probed is None else probed[1]
    if probed is not None and not any(item["probe"] for item in request["inputs"]):
        ties = []  # no variable dim: nothing to learn, nothing run
    elif probed is not None:
        try:
            ties, tried = _Ties(run, request, dtypes, probed[0], probed[1], device).learn()
            _lower_followers(probed[0], ties, probed[1])
        except _Unlearned as error:
            ties = str(error)
    print(BOUNDS + json.dumps(None if probed is None else
                              {"ranges": probed[0], "ties": ties}), flush=True)
    for attempt in request["tries"]:
        inputs = []
        for index, (item, dtype) in enumerate(zip(request["inputs"], dtypes)):
            shape = list(item["shape"])
            if tried is not None and not item.get("ragged"):  # (ragged: as made for)
                for dim in item["probe"]:
                    shape[dim] = tried[index][dim]
            if request["batched"]:
                shape[0] = attempt["rows"]
            made = attempt.get("made", {}).get(str(index))
            if attempt["view"]:
                inputs.append(torch.empty(shape, dtype=dtype, device="meta"))
            elif made is not None:  # a batch input, as the server makes it
                inputs.append(torch.tensor(made["values"], dtype=dtype,
                                           device=device).reshape(made["shape"]))
            else:
                inputs.append(torch.zeros(shape, dtype=dtype, device=device))
        print(ANSWER + json.dumps(_refusal(run, inputs)), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
