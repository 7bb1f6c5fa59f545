"""Which batch sizes get a CUDA graph (pipeline/cuda_graphs.graph_batch_sizes, and a
config's `optimization { cuda { graph_spec } }`, repository/graph_config.py): pure functions
of the config, so checked here without a GPU; capture itself is test_cuda.py's."""

from __future__ import annotations

import pytest

from tensorgate.errors import ModelConfigError
from tensorgate.pipeline.cuda_graphs import graph_batch_sizes
from tensorgate.repository.model_config import parse_model_config


def _spec(max_batch: int, dims: str, batching: str = "dynamic_batching { }",
          optimization: str = ""):
    return parse_model_config(f"""
        name: "m"
        platform: "pytorch_libtorch"
        max_batch_size: {max_batch}
        input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: {dims} }} ]
        output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [1] }} ]
        {batching if max_batch else ""}
        {optimization}
        """, "m/config.pbtxt")


def _graph_spec(*sizes: int) -> str:
    specs = ", ".join(f"{{ batch_size: {size} }}" for size in sizes)
    return f"optimization {{ cuda {{ graphs: true graph_spec [ {specs} ] }} }}"


def test_sizes_up_to_eight_then_powers_of_two_the_preferred_and_the_maximum() -> None:
    assert graph_batch_sizes(_spec(0, "[4]")) == [1]
    assert graph_batch_sizes(_spec(64, "[3, 224, 224]")) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64]
    assert graph_batch_sizes(_spec(12, "[4]", "dynamic_batching { preferred_batch_size: [10] }"
                                   )) == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12]


def test_a_size_whose_static_input_passes_a_gib_gets_no_graph() -> None:
    """A graph holds its static inputs on the device while the model is loaded: a config's
    max_batch_size (an int32) must not make the server capture 2^31 rows of them."""
    huge = graph_batch_sizes(_spec(2_147_483_647, "[3, 224, 224]"))  # 602,112 bytes a row
    assert huge == [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert 1024 * 602_112 <= 1 << 30 < 2048 * 602_112
    # a row over the bound still has its batch-1 graph (its warm-up decides on capture)
    assert graph_batch_sizes(_spec(4, "[300000000]")) == [1]


def test_a_configs_graph_spec_names_the_sizes() -> None:
    """Triton's field, read as its TensorRT backend reads it: those sizes and no others
    (a batch of 1 replays the size-4 graph; above 16, eager)."""
    spec = _spec(64, "[3, 224, 224]", optimization=_graph_spec(16, 4, 16))
    assert spec.graph_sizes == (4, 16)
    assert graph_batch_sizes(spec) == [4, 16]
    assert spec.ignored == ()
    assert graph_batch_sizes(_spec(0, "[4]", optimization=_graph_spec(0))) == [1]
    assert _spec(64, "[4]", optimization="optimization { cuda { graphs: true } }"
                 ).graph_sizes == ()


@pytest.mark.parametrize("max_batch, sizes, said", [
    (64, (0,), r"graph_spec\[0\]\.batch_size is 0; it must be 1 to max_batch_size \(64\)"),
    (64, (1, 65), r"graph_spec\[1\]\.batch_size is 65; it must be 1 to max_batch_size "
                  r"\(64\)"),
    (0, (0, 1), r"graph_spec\[1\]\.batch_size is 1; a model with max_batch_size 0 takes no "
                r"batch: it must be 0"),
])
def test_a_graph_size_the_model_cannot_take_fails_its_load(max_batch: int, sizes: tuple[int, ...],
                                                           said: str) -> None:
    with pytest.raises(ModelConfigError, match=said):
        _spec(max_batch, "[4]", optimization=_graph_spec(*sizes))


def test_a_graph_size_whose_input_passes_a_gib_fails_its_load() -> None:
    with pytest.raises(ModelConfigError, match=r"graph_spec\[0\]\.batch_size is 2048: a graph "
                                               r"at that size would hold 1,233,125,376 bytes"):
        _spec(4096, "[3, 224, 224]", optimization=_graph_spec(2048))


def test_what_optimization_says_beyond_the_sizes_is_named_as_not_acted_on() -> None:
    spec = _spec(8, "[4]", optimization=(
        "optimization { priority: PRIORITY_MAX input_pinned_memory { enable: false } "
        "cuda { graphs: true busy_wait_events: true output_copy_stream: true graph_spec [ "
        "{ batch_size: 2 input { key: \"INPUT__0\" value { dim: [4] } } }, "
        "{ batch_size: 4 graph_lower_bound { batch_size: 3 } } ] } }"))
    assert spec.graph_sizes == (2, 4)
    assert spec.ignored == ("optimization.priority", "optimization.cuda.busy_wait_events",
                            "optimization.cuda.graph_spec.graph_lower_bound",
                            "optimization.cuda.graph_spec.input",
                            "optimization.cuda.output_copy_stream",
                            "optimization.input_pinned_memory")
