"""`tensorgate check`: load a model repository as `serve` would, say which models are ready
and why the others are not, and exit (no port opened).

For a deploy pipeline: a repository whose models do not all load fails there (exit 1), with
each reason on one line, instead of at the server's start in production.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import sys
from collections.abc import Sequence
from typing import TextIO

from tensorgate.builtin.repository import default_repository
from tensorgate.pipeline.engine import Engine
from tensorgate.repository.layout import ModelRepositories

__all__ = ["check_repository"]


def check_repository(paths: Sequence[pathlib.Path], models: Sequence[str] = (),
                     placement: str = "auto", auto_complete: bool = True,
                     out: TextIO = sys.stdout, config_name: str = "") -> int:
    """Load `models` (every model when empty) from the repositories at `paths` (the built-in
    one when empty), each with its configs/<config_name>.pbtxt where it has one, print a
    line a model, and return the exit status: 0 when every one is ready, 1 otherwise (none
    found included)."""
    if not logging.getLogger().handlers:  # the result is the table; warnings go to stderr
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                            format="%(levelname)s %(name)s: %(message)s")
        for handler in logging.getLogger().handlers:
            handler.addFilter(_NotTheTable())
    repositories = ModelRepositories.of(list(paths) or [default_repository()], config_name)
    entries = [{"version": "", "state": "UNAVAILABLE", "reason": "not loaded", **e}
               for e in asyncio.run(_load(repositories, list(models), placement,
                                          auto_complete))]
    if models:
        found = {e["name"] for e in entries}
        entries = [e for e in entries if e["name"] in models] + [
            {"name": name, "version": "", "state": "UNAVAILABLE",
             "reason": f"no model '{name}' in {repositories}"}
            for name in dict.fromkeys(models) if name not in found]
    width = max((len(e["state"]) for e in entries), default=0) + 2
    for entry in entries:
        name = f"{entry['name']} v{entry['version']}" if entry["version"] else entry["name"]
        reason = f": {entry['reason']}" if entry["reason"] else ""
        # (a TorchScript error's trace is many lines: indented under its model)
        print(f"{entry['state']:<{width}}{name}{reason}".replace("\n", "\n    "), file=out)
    ready = {e["name"] for e in entries if e["state"] == "READY"}
    names = {e["name"] for e in entries}
    print(f"{len(ready)} of {len(names)} model{'s' if len(names) != 1 else ''} ready "
          f"({repositories})", file=out)
    return 0 if names and ready == names else 1


class _NotTheTable(logging.Filter):
    """Drops the engine's "failed to load" lines: the table says the same."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == "tensorgate.engine"
                    and record.getMessage().split(": ", 1)[0].endswith("failed to load"))


async def _load(repositories: ModelRepositories, models: list[str], placement: str,
                auto_complete: bool) -> list[dict[str, str]]:
    engine = Engine(repositories, placement=placement, auto_complete=auto_complete)
    try:
        await engine.start(models or None)
        return engine.index()
    finally:
        await engine.shutdown()
