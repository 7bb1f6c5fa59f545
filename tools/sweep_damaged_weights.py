"""Every one-bit flip and every cut of a small torch.save file, read by load_weights and by
torch.load(map_location="cpu", weights_only=True): where the two differ, by byte.

The hypothesis test in tests/repository/test_weights.py samples this space; this walks all
of it (26,613 cases for the test's file, about 20 s). A difference where torch.load's own
answer changes from call to call (asked four more times) is counted apart: torch.load has no
answer to match there (a record whose central-directory entry says deflated while its bytes
are stored: it inflates them into whatever memory held).

    .venv/bin/python tools/sweep_damaged_weights.py [--src /tmp/tg-old/src]
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import sys
import tempfile
import warnings
from typing import Any


def outcome(read: Any) -> Any:
    try:
        return "read", {key: value.tolist() for key, value in read().items()}
    except Exception as error:  # noqa: BLE001 - which refusal, compared
        return "refused", type(error).__name__


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=pathlib.Path,
                        default=pathlib.Path(__file__).resolve().parents[1] / "src")
    args = parser.parse_args()
    sys.path.insert(0, str(args.src.resolve()))
    import torch
    from tensorgate.repository.weights import load_weights

    warnings.simplefilter("ignore")  # torch's notes on odd pickle protocols in damaged files
    cpu = torch.device("cpu")
    folder = pathlib.Path(tempfile.mkdtemp(prefix="tg-sweep-"))
    good_path = folder / "good.pt"
    torch.save({"w": torch.arange(300, dtype=torch.float32).reshape(3, 100),
                "b": torch.ones(3)}, good_path)  # the test's file
    good = good_path.read_bytes()
    path = folder / "damaged.pt"
    cases = [(at, bit) for at in range(len(good)) for bit in range(8)]
    cases += [(at, None) for at in range(len(good))]
    differ: collections.Counter[int] = collections.Counter()
    varies: collections.Counter[int] = collections.Counter()
    for at, bit in cases:
        damaged = bytearray(good[:at] if bit is None else good)
        if bit is not None:
            damaged[at] ^= 1 << bit
        path.write_bytes(damaged)
        ours = outcome(lambda: load_weights(path, cpu))
        torch_s = outcome(lambda: torch.load(path, map_location=cpu, weights_only=True))
        if ours == torch_s:
            continue
        again = {str(outcome(lambda: torch.load(path, map_location=cpu, weights_only=True)))
                 for _ in range(4)}
        (varies if len(again | {str(torch_s)}) > 1 else differ)[at] += 1
    path.unlink()
    good_path.unlink()
    folder.rmdir()
    print(f"{len(cases):,} cases of a {len(good):,}-byte file ({args.src}): "
          f"{sum(differ.values())} differ from torch.load, {sum(varies.values())} more where "
          f"torch.load's own answer varies")
    print("differ, by byte (cases):", sorted(differ.items()) or "none")
    print("torch.load varies, by byte (cases):", sorted(varies.items()) or "none")


if __name__ == "__main__":
    main()
