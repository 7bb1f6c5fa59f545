"""Pipeline fixtures: a repository of small real models, and a bounded way to run coroutines."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest

from tensorgate import Engine
from tests.pipeline import repo_builder as rb

BATCHING = "dynamic_batching { max_queue_delay_microseconds: 20000 }"


def run(coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
    """Run `coro` on a fresh loop, failing the test if it takes longer than `timeout`."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


@contextlib.asynccontextmanager
async def serving(repo: pathlib.Path, models: list[str] | None = None,
                  **options: Any) -> AsyncIterator[Engine]:
    """An Engine on `repo` (Engine's `options`), started with `models` (default: all), shut
    down on the way out however the test leaves."""
    engine = Engine(repo, **options)
    await engine.start(models)
    try:
        yield engine
    finally:
        await engine.shutdown()


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("models")
    rb.add_torchscript(root, "identity", rb.Identity(), [3, 4], [3, 4], BATCHING)
    rb.add_torchscript(root, "linear", rb.linear_module(), [8], [4], BATCHING)
    rb.add_torchscript(root, "linear_unbatched", rb.linear_module(), [8], [4])
    rb.add_torchscript(root, "failing", rb.Failing(), [4], [4], BATCHING)
    rb.add_exported(root, "exported", rb.linear_module(), BATCHING)
    rb.add_python(root, "scaled", BATCHING)
    rb.add_python(root, "slow", "dynamic_batching { default_queue_policy { max_queue_size: 2 } }",
                  delay_s=0.25, max_batch=1)
    rb.add_python(root, "slow_timeout", """dynamic_batching { default_queue_policy {
                      default_timeout_microseconds: 50000 allow_timeout_override: true } }""",
                  delay_s=0.25, max_batch=1)
    rb.add_python(root, "ranked", """dynamic_batching { priority_levels: 2
                      default_priority_level: 2
                      priority_queue_policy { key: 1 value { max_queue_size: 1 } } }""",
                  delay_s=0.2, max_batch=1)
    rb.add_python(root, "delayed", """dynamic_batching { default_queue_policy {
                      timeout_action: DELAY default_timeout_microseconds: 50000
                      allow_timeout_override: true } }""", delay_s=0.2, max_batch=1)
    rb.write_config(root, "ranked_ensemble", """
        name: "ranked_ensemble"
        platform: "ensemble"
        max_batch_size: 1
        input [ { name: "RAW" data_type: TYPE_FP32 dims: [4] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [4] } ]
        ensemble_scheduling { step [ { model_name: "ranked" model_version: -1
            input_map { key: "INPUT__0" value: "RAW" }
            output_map { key: "OUTPUT__0" value: "OUT" } } ] }
        """)
    return root


@pytest.fixture(scope="session")
def builtin_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    from tensorgate.builtin.repository import write_default_repository
    return write_default_repository(tmp_path_factory.mktemp("builtin"))
