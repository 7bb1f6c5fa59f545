"""Which batch sizes get a CUDA graph (pipeline/cuda_graphs.graph_batch_sizes): a pure
function of the config, so checked here without a GPU; capture itself is test_cuda.py's."""

from __future__ import annotations

from tensorgate.pipeline.cuda_graphs import graph_batch_sizes
from tensorgate.repository.model_config import parse_model_config


def _spec(max_batch: int, dims: str, batching: str = "dynamic_batching { }"):
    return parse_model_config(f"""
        name: "m"
        platform: "pytorch_libtorch"
        max_batch_size: {max_batch}
        input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: {dims} }} ]
        output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [1] }} ]
        {batching if max_batch else ""}
        """, "m/config.pbtxt")


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
