"""Triton's --model-load-thread-count: at most that many of the models a start loads load at
once (the others wait, counted as loading), 4 by default as in Triton; with 0, every model
starts loading at once. Python models that note when their setup ran show which."""

from __future__ import annotations

import pathlib

import pytest

from tensorgate.cli import parse_serve
from tests.pipeline import repo_builder as rb
from tests.pipeline.conftest import run, serving

_NOTING = '''
import pathlib
import time

from tensorgate import Model


class Noting(Model):
    """Notes when its setup began and ended (0.3 s apart) in the repository's setups.txt."""

    def setup(self, context):
        began = time.monotonic()
        time.sleep(0.3)
        with (pathlib.Path(context.directory).parents[1] / "setups.txt").open("a") as out:
            out.write(f"{context.name} {began} {time.monotonic()}\\n")

    def forward(self, batch):
        return {"OUTPUT__0": batch["INPUT__0"]}
'''


def _repository(root: pathlib.Path, count: int) -> pathlib.Path:
    for i in range(count):
        rb.add_python(root, f"noting{i}", max_batch=4)
        (root / f"noting{i}" / "1" / "model.py").write_text(_NOTING)
    return root


def _most_at_once(root: pathlib.Path) -> int:
    """The most setups that ran at one moment."""
    spans = [tuple(map(float, line.split()[1:]))
             for line in (root / "setups.txt").read_text().splitlines()]
    return max(sum(began <= moment < ended for began, ended in spans)
               for moment, _ in spans)


@pytest.mark.parametrize("threads, most", [(1, 1), (2, 2), (0, 5)])
def test_a_start_loads_at_most_that_many_models_at_once(tmp_path: pathlib.Path, threads: int,
                                                        most: int) -> None:
    root = _repository(tmp_path / "models", 5)

    async def scenario() -> None:
        async with serving(root, placement="none", load_threads=threads) as engine:
            assert all(engine.is_ready(f"noting{i}") for i in range(5))
    run(scenario())
    assert _most_at_once(root) == most


def test_by_default_four_load_at_once_as_in_triton(tmp_path: pathlib.Path) -> None:
    root = _repository(tmp_path / "models", 5)
    assert parse_serve(["serve"], {}).model_load_thread_count == 4

    async def scenario() -> None:
        async with serving(root, placement="none") as engine:
            assert all(engine.is_ready(f"noting{i}") for i in range(5))
    run(scenario())
    assert _most_at_once(root) == 4


def test_the_flag_is_the_engines_bound() -> None:
    config = parse_serve(["serve", "--model-load-thread-count", "3"], {})
    assert config.model_load_thread_count == 3
    with pytest.raises(ValueError, match="model_load_thread_count must be 0"):
        parse_serve(["serve", "--model-load-thread-count", "-1"], {})
