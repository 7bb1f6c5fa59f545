"""The response cache (`response_cache { enable: true }`): a request answered before is
answered again without running the model — same bytes, shape, datatype and outputs asked —
with Triton's statistics (a hit is a success, not an inference); the cache stays in its byte
bound, least recently used out first, and owns its bytes."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch

from tensorgate import Engine, InferenceRequest, TensorView
from tensorgate.errors import InvalidArgumentError
from tensorgate.pipeline.response_cache import ResponseCache
from tensorgate.tensor.copies import CopyLedger
from tests.pipeline import repo_builder as rb
from tests.pipeline.conftest import run


@pytest.fixture(scope="module")
def cached_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("cached")
    rb.add_python(root, "cached", "dynamic_batching { }", extra="response_cache { enable: true }")
    rb.add_python(root, "uncached", "dynamic_batching { }")
    return root


def _request(model: str, values: list[float], **kw) -> InferenceRequest:
    tensor = torch.tensor([values], dtype=torch.float32)
    return InferenceRequest(model, {"INPUT__0": TensorView.from_torch(tensor, name="INPUT__0")},
                            **kw)


def test_a_repeated_request_is_answered_without_running_the_model(
        cached_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(cached_repo, response_cache_bytes=1 << 20)
        await engine.start()
        first = await engine.infer(_request("cached", [1, 2, 3, 4]))
        again = await engine.infer(_request("cached", [1, 2, 3, 4]))
        other = await engine.infer(_request("cached", [1, 2, 3, 5]))
        for result, values in ((first, [3, 5, 7, 9]), (again, [3, 5, 7, 9]),
                               (other, [3, 5, 7, 11])):
            assert result.outputs["OUTPUT__0"].torch().tolist() == [values]
        assert again.ledger.bytes == 0  # a hit copies nothing: views of the cache's bytes
        assert first.ledger.bytes >= 16  # the miss paid for the cache's copy
        stats = engine.statistics("cached")[0]
        assert (stats["inference_count"], stats["execution_count"]) == (2, 2)
        inference = stats["inference_stats"]
        assert inference["success"]["count"] == 3
        assert (inference["cache_hit"]["count"], inference["cache_miss"]["count"]) == (1, 2)
        await engine.infer(_request("uncached", [1, 2, 3, 4]))
        await engine.infer(_request("uncached", [1, 2, 3, 4]))
        assert engine.statistics("uncached")[0]["execution_count"] == 2  # not enabled: runs
        cache = engine.cache_statistics()
        assert cache is not None and (cache.entries, cache.hits) == (2, 1)
        with pytest.raises(InvalidArgumentError, match="model 'cached' has no input 'x'"):
            await engine.infer(InferenceRequest("cached", {"x": TensorView.from_torch(
                torch.zeros(1, 4), name="x")}))
        await engine.shutdown()
    run(scenario())


def test_a_reloaded_model_is_not_answered_with_what_it_computed_before(
        tmp_path: pathlib.Path) -> None:
    rb.add_python(tmp_path, "cached", "dynamic_batching { }",
                  extra="response_cache { enable: true }")

    async def scenario() -> None:
        engine = Engine(tmp_path, response_cache_bytes=1 << 20)
        await engine.start()
        before = await engine.infer(_request("cached", [1, 2, 3, 4]))
        torch.save({"scale": torch.tensor(3.0)}, tmp_path / "cached" / "1" / "scale.pt")
        await engine.load("cached")  # the same version, new weights
        after = await engine.infer(_request("cached", [1, 2, 3, 4]))
        assert before.outputs["OUTPUT__0"].torch().tolist() == [[3, 5, 7, 9]]
        assert after.outputs["OUTPUT__0"].torch().tolist() == [[4, 7, 10, 13]]
        await engine.shutdown()
    run(scenario())


def test_without_a_server_cache_the_model_runs_every_request(cached_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(cached_repo)
        await engine.start(["cached"])
        for _ in range(2):
            await engine.infer(_request("cached", [1, 2, 3, 4]))
        assert engine.statistics("cached")[0]["execution_count"] == 2
        assert engine.cache_statistics() is None
        await engine.shutdown()
    run(scenario())


def _view(values: np.ndarray, name: str = "t") -> TensorView:
    return TensorView.from_numpy(values, name=name)


def test_keys_tell_apart_what_changes_an_answer() -> None:
    key = ResponseCache.key
    base = key("m", 1, {"a": _view(np.zeros(4, np.float32))}, None)
    assert base == key("m", 1, {"a": _view(np.zeros(4, np.float32))}, None)
    assert len({base,
                key("m", 2, {"a": _view(np.zeros(4, np.float32))}, None),
                key("n", 1, {"a": _view(np.zeros(4, np.float32))}, None),
                key("m", 1, {"b": _view(np.zeros(4, np.float32))}, None),
                key("m", 1, {"a": _view(np.zeros((2, 2), np.float32))}, None),  # same bytes
                key("m", 1, {"a": _view(np.zeros(4, np.int32))}, None),  # same bytes
                key("m", 1, {"a": _view(np.ones(4, np.float32))}, None),
                key("m", 1, {"a": _view(np.zeros(4, np.float32))}, ["y"])}) == 8
    assert key("m", 1, {"a": _view(np.zeros(1)), "b": _view(np.ones(1))}, ["y", "z"]) == \
        key("m", 1, {"b": _view(np.ones(1)), "a": _view(np.zeros(1))}, ["z", "y"])


def test_the_cache_keeps_its_bound_least_recently_used_out_first() -> None:
    cache = ResponseCache(3 * (256 + 400))  # room for three 400-byte answers
    ledger = CopyLedger()
    source = np.arange(100, dtype=np.float32)
    for index in range(3):
        cache.put(bytes([index]), {"y": _view(source + index)}, ledger)
    assert ledger.bytes == 1200  # each answer copied once into the cache
    assert cache.get(bytes([0])) is not None  # 0 is now the most recently used
    cache.put(bytes([3]), {"y": _view(source)}, ledger)  # evicts 1, the least recently used
    assert cache.get(bytes([1])) is None
    assert all(cache.get(bytes([i])) is not None for i in (0, 2, 3))
    statistics = cache.statistics()
    assert (statistics.entries, statistics.evictions, statistics.bytes) == (3, 1, 3 * 656)
    cache.put(b"huge", {"y": _view(np.zeros(1000, np.float32))}, ledger)  # larger than all
    assert cache.get(b"huge") is None and cache.statistics().entries == 3


def test_a_lookup_is_the_key_and_the_get_and_both_are_timed() -> None:
    """What Triton's nv_cache_lookup_duration and nv_cache_insertion_duration add up."""
    cache = ResponseCache(1 << 20)
    inputs = {"a": _view(np.zeros(4, np.float32))}
    key, found = cache.lookup("m", 1, inputs, None, None)
    assert key == ResponseCache.key("m", 1, inputs, None) and found is None
    assert cache.statistics().insertion_ns == 0 < cache.statistics().lookup_ns
    cache.put(key, {"y": _view(np.ones(4, np.float32))}, CopyLedger())
    again, found = cache.lookup("m", 1, inputs, None, None)
    assert again == key and found is not None and np.array_equal(found["y"].numpy(),
                                                                  np.ones(4, np.float32))
    statistics = cache.statistics()
    assert (statistics.hits, statistics.misses) == (1, 1) and statistics.insertion_ns > 0


def test_cached_answers_own_their_bytes() -> None:
    cache = ResponseCache(1 << 20)
    source = np.arange(4, dtype=np.float32)
    cache.put(b"k", {"y": _view(source)}, CopyLedger())
    source[:] = -1  # the model's buffer is reused: the cached answer does not change
    outputs = cache.get(b"k")
    assert outputs is not None and outputs["y"].numpy().tolist() == [0, 1, 2, 3]
    outputs["y"] = _view(np.zeros(1))  # a caller replacing an entry changes only its dict
    assert cache.get(b"k")["y"].numpy().tolist() == [0, 1, 2, 3]
