"""What Triton's checksum agent adds to a model's load: the time to check one file of each
size by each algorithm (repository/checksum_agent.verify_checksums, as the loader calls it),
best of --rounds, from the page cache (a file just written: a cold disk adds its own read).

    .venv/bin/python bench/checksum_bench.py [--sizes-mb 10,100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "src"))

from tensorgate.repository.checksum_agent import (ALGORITHMS, FileChecksum,  # noqa: E402
                                                  verify_checksums)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="10,100")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{'size MB':>8} {'algorithm':>9} {'best s':>8} {'MB/s':>7}")
    with tempfile.TemporaryDirectory() as folder:
        directory = pathlib.Path(folder)
        for size in (int(s) for s in args.sizes_mb.split(",")):
            data = os.urandom(size * 1_000_000)
            (directory / "model.bin").write_bytes(data)
            for name in (a.lower() for a in ALGORITHMS):
                checksum = FileChecksum(name, "model.bin", hashlib.new(name, data).hexdigest())
                times = []
                for _ in range(args.rounds):
                    started = time.perf_counter()
                    verify_checksums(directory, (checksum,))
                    times.append(time.perf_counter() - started)
                best = min(times)
                print(f"{size:>8} {name.upper():>9} {best:>8.3f} {size / best:>7.0f}")


if __name__ == "__main__":
    main()
