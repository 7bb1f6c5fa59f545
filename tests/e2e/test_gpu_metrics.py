"""Triton's GPU metrics on the metrics port: none without NVML; with it (the GPU device,
bench/gpu_check.sh), one sample per GPU, checked against what the CUDA runtime reports."""

from __future__ import annotations

import pathlib
import re
import time

import pytest
import torch

from tests.e2e.conftest import scrape, start_server, stop_server, value
from tests.test_gpu_metrics import nvml_present


@pytest.mark.skipif(nvml_present(), reason="this machine has NVML")
def test_a_server_without_nvml_serves_no_gpu_metrics(e2e_repo: pathlib.Path,
                                                     tmp_path: pathlib.Path) -> None:
    server = start_server(e2e_repo, tmp_path / "server.log", "--allow-gpu-metrics", "true")
    try:
        text = scrape(server)
        assert "nv_inference_request_success" in text and "nv_gpu" not in text
    finally:
        assert stop_server(server) == 0, server.log.read_text()


@pytest.mark.cuda
@pytest.mark.skipif(not (torch.cuda.is_available() and nvml_present()),
                    reason="needs a CUDA device and NVML")
def test_the_servers_gpu_metrics_match_the_device(e2e_repo: pathlib.Path,
                                                  tmp_path: pathlib.Path) -> None:
    server = start_server(e2e_repo, tmp_path / "server.log", "--metrics-interval-ms", "200")
    try:
        first = scrape(server)
        uuids = re.findall(r'^nv_gpu_memory_total_bytes\{gpu_uuid="(GPU-[^"]+)"\}', first, re.M)
        assert uuids, first
        # the device's total memory as the CUDA runtime reports it is one NVML reports
        total = torch.cuda.mem_get_info(0)[1]
        totals = [value(first, "nv_gpu_memory_total_bytes", gpu_uuid=u) for u in uuids]
        assert any(abs(t - total) <= 0.02 * total for t in totals), (total, totals)
        for uuid in uuids:
            assert 0 <= value(first, "nv_gpu_utilization", gpu_uuid=uuid) <= 1
            assert 0 < value(first, "nv_gpu_memory_used_bytes", gpu_uuid=uuid) <= total * 1.1
        time.sleep(0.6)  # a few samples later: energy only grows
        later = scrape(server)
        for uuid in uuids:
            before = value(first, "nv_energy_consumption", -1.0, gpu_uuid=uuid)
            if before >= 0:
                assert value(later, "nv_energy_consumption", gpu_uuid=uuid) >= before
        assert "GPU metrics (nv_gpu_*) from NVML for GPU-" in server.log.read_text()
    finally:
        assert stop_server(server) == 0, server.log.read_text()
