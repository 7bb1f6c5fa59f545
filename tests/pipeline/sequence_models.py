"""Small real stateful models (sequence_batching) for the sequence tests."""

from __future__ import annotations

import pathlib

import torch

from tests.pipeline.repo_builder import write_config


class Accumulate(torch.nn.Module):
    """Implicit state: each request adds its input to the sequence's total; also reports how
    many rows its batch had and READY."""

    def forward(self, x: torch.Tensor, start: torch.Tensor, ready: torch.Tensor,
                total: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # On START the state's input is its initial state: the server resets it.
        total = total + x * ready
        rows = torch.full_like(x, float(x.shape[0]))
        return total, rows, total


class AccumulateInPlace(torch.nn.Module):
    """Accumulate, adding to its state input in place."""

    def forward(self, x: torch.Tensor, start: torch.Tensor, ready: torch.Tensor,
                total: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        total.add_(x * ready)
        return total, torch.full_like(x, float(x.shape[0])), total


ACCUMULATE = """
name: "{name}"
platform: "pytorch_libtorch"
max_batch_size: {max_batch}
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [1] }} ]
output [ {{ name: "TOTAL" data_type: TYPE_FP32 dims: [1] }},
         {{ name: "ROWS" data_type: TYPE_FP32 dims: [1] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START fp32_false_true: [0, 1] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY fp32_false_true: [0, 1] }} ] }}
  ]
  state [ {{ input_name: "TOTAL_IN" output_name: "TOTAL_OUT" data_type: TYPE_FP32
            dims: [1] {initial} }} ]
}}
"""


def add_accumulate(repo: pathlib.Path, name: str, strategy: str = "oldest { }",
                   idle_us: int = 5_000_000, initial: str = "", max_batch: int = 4,
                   module: torch.nn.Module | None = None) -> None:
    folder = write_config(repo, name, ACCUMULATE.format(
        name=name, strategy=strategy, idle_us=idle_us, initial=initial, max_batch=max_batch))
    torch.jit.script((module or Accumulate()).eval()).save(str(folder / "1" / "model.pt"))


class Rows(torch.nn.Module):
    """Direct strategy: each row reports its index, the batch's rows, READY and CORRID."""

    def forward(self, x: torch.Tensor, ready: torch.Tensor, corrid: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = x.shape[0]
        index = torch.arange(rows, dtype=torch.int32).view(rows, 1)
        return index, torch.full_like(index, rows), ready, corrid


ROWS = """
name: "{name}"
platform: "pytorch_libtorch"
max_batch_size: {max_batch}
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [1] }} ]
output [ {{ name: "ROW" data_type: TYPE_INT32 dims: [1] }},
         {{ name: "ROWS" data_type: TYPE_INT32 dims: [1] }},
         {{ name: "READY_SEEN" data_type: TYPE_INT32 dims: [1] }},
         {{ name: "CORRID_SEEN" data_type: TYPE_UINT64 dims: [1] }} ]
sequence_batching {{
  direct {{ max_queue_delay_microseconds: {delay_us}
            minimum_slot_utilization: {utilization} }}
  control_input [
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
  ]
}}
"""


def add_rows(repo: pathlib.Path, name: str, max_batch: int = 4, delay_us: int = 0,
             utilization: float = 0.0) -> None:
    """Direct: a batch waits up to `delay_us` while fewer than `utilization` of its slots
    have a request (none: it runs at once, as on Triton)."""
    folder = write_config(repo, name, ROWS.format(name=name, max_batch=max_batch,
                                                  delay_us=delay_us, utilization=utilization))
    torch.jit.script(Rows().eval()).save(str(folder / "1" / "model.pt"))


KEYED = '''
import numpy as np
import torch

from tensorgate import Model


class Keyed(Model):
    """Keeps each sequence's total itself, by CORRID (a string): a request of a sequence it
    never saw start fails, so a sequence that moved to another instance is caught."""

    def setup(self, context):
        self.totals = {}

    def forward(self, inputs):
        x = inputs["INPUT"]
        out = torch.zeros_like(x)
        for row in range(x.shape[0]):
            if not bool(inputs["READY"][row, 0]):
                continue
            key = inputs["CORRID"][row, 0]
            if bool(inputs["START"][row, 0]):
                self.totals[key] = 0.0
            if key not in self.totals:
                raise KeyError(f"sequence {key!r} did not start on this instance")
            self.totals[key] += float(x[row, 0])
            out[row, 0] = self.totals[key]
            if bool(inputs["END"][row, 0]):
                del self.totals[key]
        return {"TOTAL": out}
'''


def add_keyed(repo: pathlib.Path, name: str) -> None:
    folder = write_config(repo, name, f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 4
        input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [1] }} ]
        output [ {{ name: "TOTAL" data_type: TYPE_FP32 dims: [1] }} ]
        instance_group [ {{ count: 2 kind: KIND_CPU }} ]
        sequence_batching {{
          oldest {{ max_candidate_sequences: 2 max_queue_delay_microseconds: 2000 }}
          control_input [
            {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START
                                          bool_false_true: [false, true] }} ] }},
            {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END
                                        int32_false_true: [0, 1] }} ] }},
            {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY
                                          int32_false_true: [0, 1] }} ] }},
            {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID
                                           data_type: TYPE_STRING }} ] }}
          ]
        }}
        """)
    (folder / "1" / "model.py").write_text(KEYED)
