"""bench/compare_report.py: figures and goals come from the raw numbers, and re-rendering
rewrites only its own block of RESULTS.md."""

from __future__ import annotations

import json
import pathlib
import re
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))

import compare_report  # noqa: E402


def _sequential(p50_us: float, spread: float, n: int = 400) -> dict:
    rng = np.random.default_rng(0)
    return {"us": (p50_us + spread * rng.standard_normal(n)).clip(1).tolist(),
            "client_cpu_us": 100.0}


def _levels(qps: dict[int, float]) -> list[list[dict]]:
    return [[{"connections": c, "qps": q, "p50_us": 1000.0, "p90_us": 1500.0, "p99_us": 2000.0,
              "max_us": 3000.0, "requests": int(q), "bad": 0, "errors": 0,
              "client_cpu_share": 0.5} for c, q in qps.items()]]


def _server(identity_p50: float, resnet_p50: float, qps: float, rss: float, startup: float) -> dict:
    return {"version": "1", "wire": "binary", "note": "", "batching": "",
            "startup_s": [startup, startup * 1.1, startup * 0.9],
            "memory": [{"rss_mb": rss, "pss_mb": rss * 0.9, "processes": 1}],
            "workloads": {
                "identity": {"sequential": [_sequential(identity_p50, 5)],
                             "concurrent": _levels({1: qps / 2, 16: qps})},
                "resnet50": {"sequential": [_sequential(resnet_p50, 100)],
                             "concurrent": _levels({1: 10.0, 16: 14.0})}}}


@pytest.fixture()
def result() -> dict:
    return {"date": "2026-11-30 12:00", "threads": 1, "wrk": True,
            "machine": {"cpu": "test cpu", "cores": 2, "python": "3.11", "torch": "2.13",
                        "kernel": "x", "memory_gb": 24},
            "plan": {"rounds": 1, "counts": {}, "warmup": {}, "levels": {},
                     "seconds": {"identity": 5.0, "resnet50": 10.0}, "startups": 3},
            "floor": {"workloads": {"identity": {"sequential": [_sequential(10, 1)]},
                                    "resnet50": {"sequential": [_sequential(70_000, 100)]}}},
            "servers": {"tensorgate": _server(310, 70_200, 3000, 500, 1.5),
                        "triton": _server(810, 70_300, 1200, 1000, 4.0)}}


def test_summary_percentiles_and_medians(result: dict) -> None:
    s = compare_report.summarize(result)
    identity = s["tensorgate"]["workloads"]["identity"]
    assert identity["n"] == 400
    assert identity["p50_us"] == pytest.approx(310, abs=1)
    assert identity["p50_us"] < identity["p90_us"] < identity["p99_us"] <= identity["max_us"]
    assert identity["max_qps"] == 3000
    assert s["tensorgate"]["startup_s"] == 1.5  # the median of three
    assert s["triton"]["rss_mb"] == 1000


def test_goals_are_computed_from_the_run(result: dict) -> None:
    goals = "\n".join(compare_report.goals(compare_report.summarize(result)))
    # overhead over the floor: (310 - 10) / (810 - 10) = 0.375, give or take the sampling
    assert re.search(r"over the floor, tensorgate / Triton: 0\.3[78] \(goal ≤ 0\.5\) — met", goals)
    assert "RSS, tensorgate / Triton: 0.50 (goal ≤ 0.6) — met" in goals
    assert "start-up, tensorgate / Triton: 0.38 (goal ≤ 0.75) — met" in goals
    assert "identity max QPS, tensorgate / Triton: 2.50 (goal ≥ 2.0) — met" in goals
    result["servers"]["tensorgate"]["memory"][0]["rss_mb"] = 700
    goals = "\n".join(compare_report.goals(compare_report.summarize(result)))
    assert "RSS, tensorgate / Triton: 0.70 (goal ≤ 0.6) — missed" in goals


def test_goals_need_both_servers(result: dict) -> None:
    del result["servers"]["triton"]
    assert compare_report.goals(compare_report.summarize(result)) == [
        "Goals need tensorgate and Triton in the same run."]


def test_render_replaces_only_its_block(result: dict, tmp_path: pathlib.Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    raw = tmp_path / "compare.json"
    raw.write_text(json.dumps(result))
    results_md = tmp_path / "RESULTS.md"
    results_md.write_text("# Results\n\nkept above\n")
    compare_report.render(raw, results_md, with_plots=False)
    first = results_md.read_text()
    assert first.startswith("# Results\n\nkept above\n")
    assert first.count(compare_report.BEGIN) == 1
    assert "| tensorgate | 0.31" in first and "| tensorgate | 70." in first  # P50s in ms
    results_md.write_text(first + "\nkept below\n")
    result["servers"]["tensorgate"]["startup_s"] = [9.0]
    raw.write_text(json.dumps(result))
    compare_report.render(raw, results_md, with_plots=False)
    second = results_md.read_text()
    assert second.count(compare_report.BEGIN) == 1 and second.endswith("kept below\n")
    assert "| 9.00 |" in second
    assert "Goals" in capsys.readouterr().out


def test_memory_table_shows_the_peak_and_the_idle_wait_and_reads_older_runs(result: dict) -> None:
    result["servers"]["tensorgate"]["memory"] = [
        {"rss_mb": 500.0, "pss_mb": 450.0, "peak_rss_mb": 900.0, "processes": 1, "settled_s": 2.5},
        {"rss_mb": 520.0, "pss_mb": 470.0, "peak_rss_mb": 1100.0, "processes": 1, "settled_s": 9.0}]
    lines = compare_report.memory_table(compare_report.summarize(result))
    assert "| tensorgate | 510 | 460 | 1,000 | 1 | 9.0 |" in lines
    assert "| triton | 1,000 | 900 | – | 1 | – |" in lines  # a run from before peaks were read


def test_a_gpu_run_has_its_own_goals_and_its_own_block(result: dict, tmp_path: pathlib.Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    result.update(device="cuda", client="socket")
    result["machine"].update(gpu="NVIDIA H200", cuda="13.0")
    tg = result["servers"]["tensorgate"]["workloads"]["resnet50"]
    tg["sequential"] = [_sequential(2_300, 50)]
    tg["concurrent"] = _levels({1: 430.0, 16: 1_800.0})
    goals = "\n".join(compare_report.cuda_goals(compare_report.summarize(result)))
    assert "resnet50 P50 ms, sequential over HTTP: 2.30 (goal ≤ 2.6) — met" in goals
    assert "resnet50 P99 ms, sequential over HTTP: 2.4" in goals and "(goal ≤ 3) — met" in goals
    assert "resnet50 QPS at 16 connections: 1,800.00 (goal ≥ 2000) — missed" in goals
    assert "resnet50 P50, tensorgate / Triton (no goal set): 0.03" in goals

    text, block = _render_beside_the_cpu_block(result, tmp_path)
    assert compare_report.markers(result)[0] == "<!-- compare-cuda:begin -->"
    assert "NVIDIA H200 (CUDA 13.0)" in block and "socket client" in block
    assert "| socket client CPU (max) |" in block and "wrk CPU" not in block
    assert "Goals (issue 5, on the GPU):" in capsys.readouterr().out


def test_grpc_points_get_their_own_table(result: dict) -> None:
    result["servers"]["tensorgate"]["workloads"]["identity"]["grpc"] = _levels({1: 900.0, 16: 1100.0})
    text = compare_report.report(result)
    table = text.split("| identity over gRPC: QPS / P99 ms at N connections | N=1 | N=16 "
                       "| h2load CPU (max) | bad answers |", 1)[1].split("\n\n", 1)[0]
    assert "| tensorgate | 900 / 2.00 | 1,100 / 2.00 | 50% | 0 |" in table
    assert "triton" not in table  # no gRPC points for it in this run
    assert "resnet50 over gRPC" not in text


def test_own_view_shows_per_request_and_per_batch_times_and_reads_older_runs(result: dict) -> None:
    result["servers"]["tensorgate"]["tensorgate"] = {
        "resnet50": {"copied_bytes_per_request": 0.0,
                     "stage_us": {"queue": 10.0, "compute_infer": 300_000.0},
                     "batch_stage_us": {"compute_infer": 150_000.0}, "mean_batch_rows": 4.0},
        "identity": {"copied_bytes_per_request": 12.0, "stage_us": {"queue": 1.0}},
        "copies_by_reason": {"batch": 2_000_000, "receive": 30_000_000, "device": 0}}
    text = compare_report.report(result)
    assert ("- resnet50: 0 bytes copied per request; per request: queue 10.0 µs, compute_infer "
            "300,000.0 µs; per batch run (4.00 rows on average): compute_infer 150,000.0 µs") in text
    assert "- identity: 12 bytes copied per request; per request: queue 1.0 µs\n" in text
    assert "by reason (every model, HTTP and gRPC): receive 30.0 MB, batch 2.0 MB\n" in text


def test_a_json_run_has_its_own_block_and_no_goals(result: dict, tmp_path: pathlib.Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    result["wire"] = "json"
    _, block = _render_beside_the_cpu_block(result, tmp_path)
    assert compare_report.markers(result)[0] == "<!-- compare-json:begin -->"
    assert "## Side by side with peers (bench/compare.py --wire json)" in block
    assert "`.venv/bin/python bench/compare.py --render-only --wire json`" in block
    assert "| tensorgate | 0.31" in block and "Goals" not in capsys.readouterr().out


def _render_beside_the_cpu_block(result: dict, tmp_path: pathlib.Path) -> tuple[str, str]:
    """Render `result` into a RESULTS.md that holds the CPU table: (the whole file, the
    result's own block); the CPU table is left as it was, and the block appears once."""
    raw = tmp_path / "compare-other.json"
    raw.write_text(json.dumps(result))
    results_md = tmp_path / "RESULTS.md"
    cpu_block = f"{compare_report.BEGIN}\nthe CPU table\n{compare_report.END}"
    results_md.write_text(f"# Results\n\n{cpu_block}\n")
    compare_report.render(raw, results_md, with_plots=False)
    text = results_md.read_text()
    begin, end = compare_report.markers(result)
    assert cpu_block in text and text.count(begin) == 1
    return text, text.split(begin, 1)[1].split(end, 1)[0]


def test_goals_by_round_show_a_slow_round_the_pooled_goals_fold_in(result: dict) -> None:
    """Two rounds, tensorgate's first slow: the pooled goal says little of it, the per-round
    table shows each round's ratios; one round has no such table."""
    assert compare_report.goals_by_round(result) == []
    tg = result["servers"]["tensorgate"]["workloads"]
    tr = result["servers"]["triton"]["workloads"]
    tg["identity"]["sequential"] = [_sequential(610, 5), _sequential(310, 5)]
    tr["identity"]["sequential"] = [_sequential(810, 5), _sequential(810, 5)]
    tg["resnet50"]["sequential"] = [_sequential(91_000, 100), _sequential(70_200, 100)]
    tr["resnet50"]["sequential"] *= 2
    tg["identity"]["concurrent"] = _levels({16: 1800}) + _levels({16: 3000})
    tr["identity"]["concurrent"] = _levels({16: 1200}) * 2
    lines = compare_report.goals_by_round(result)
    rows = [line for line in lines if re.match(r"\| \d ", line)]
    # (610 - 10) / (810 - 10) = 0.75 and (310 - 10) / 800 = 0.375; resnet50's P99 against
    # the floor's (one floor run, pooled: 70,000 + 2.33 σ of 100); max QPS 1.5 and 2.5
    assert re.fullmatch(r"\| 1 \| 0\.75 \| 1\.30 \| 1\.50 \|", rows[0]), rows
    assert re.fullmatch(r"\| 2 \| 0\.3[78] \| 1\.00 \| 2\.50 \|", rows[1]), rows
    assert "\n".join(lines) in compare_report.report(result)


def test_bad_answers_of_a_points_warm_up_are_counted_and_the_warm_up_is_said(
        result: dict) -> None:
    """A wrong answer counts whenever it came; the header names the warm-up only for runs
    that had one (older runs' plans have no warm_share)."""
    point = result["servers"]["triton"]["workloads"]["identity"]["concurrent"][0][1]
    point["warmup"] = {"seconds": 1.0, "qps": 500.0, "p50_us": 900.0, "p99_us": 9000.0,
                       "max_us": 12_000.0, "requests": 500, "bad": 3, "errors": 1}
    text = compare_report.report(result)
    table = text.split("| identity: QPS / P99 ms at N connections", 1)[1].split("\n\n", 1)[0]
    rows = {line.split(" | ")[0]: line for line in table.splitlines()}
    assert rows["| triton"].endswith("| 4 |") and rows["| tensorgate"].endswith("| 0 |"), table
    assert "warm-up" not in text.split("\n", 1)[0]
    result["plan"]["warm_share"] = 1 / 3
    assert ("each after an unmeasured warm-up of 33% of its length (≥ 1 s) at its "
            "connections." in compare_report.report(result).split("\n", 1)[0])


def test_the_network_floor_is_a_row_and_a_ratio_beside_the_goal_and_older_runs_lack_it(
        result: dict) -> None:
    """A run that measured the bare answerer (bench/network_floor.py) shows it in the
    sequential and seed tables, with no ratios against Triton and not among the servers,
    and gives each server's identity P50 over it, tensorgate's over Triton's, beside the
    goal, pooled and per round; a run without it renders as before."""
    before = compare_report.report(result)
    assert "network floor" not in before
    result["network_floor"] = {"workloads": {
        "identity": {"sequential": [_sequential(210, 1)]},
        "resnet50": {"sequential": [_sequential(160, 1)]}}}
    text = compare_report.report(result)
    assert re.search(r"^\| network floor \| identity \| 400 \| 210 \|", text, re.M), text
    assert re.search(r"^\| network floor \| 0\.210 \| [0-9.]+ \| – \| – \| – \| – "
                     r"\| – \| – \| – \| – \| – \|", text, re.M), text
    assert "- network floor" not in text  # not listed as a server
    # tensorgate over the floor (310 - 10) and over the network floor (310 - 210)
    assert re.search(r"^\| tensorgate \| identity \| 400 \| .* \| (299|30\d) \| (99|10\d) "
                     r"\| 100 \|$", text, re.M), text
    # over the network floor: (310 - 210) / (810 - 210) = 0.167; over the floor, unchanged
    assert re.search(r"identity P50 over the network floor .*, tensorgate / Triton \(no goal "
                     r"set\): 0\.1[67]$", text, re.M), text
    assert re.search(r"over the floor, tensorgate / Triton: 0\.3[78] \(goal ≤ 0\.5\)", text)
    tg = result["servers"]["tensorgate"]["workloads"]["identity"]
    tr = result["servers"]["triton"]["workloads"]["identity"]
    tg["sequential"] = [_sequential(610, 5), _sequential(310, 5)]
    tr["sequential"] *= 2
    result["network_floor"]["workloads"]["identity"]["sequential"] = [
        _sequential(410, 1), _sequential(210, 1)]
    rows = [line for line in compare_report.goals_by_round(result) if re.match(r"\| \d ", line)]
    # round 1: (610 - 410) / (810 - 410) = 0.5; round 2: (310 - 210) / (810 - 210) = 0.17
    assert re.fullmatch(r"\| 1 \| .* \| 0\.50 \| 410 \|", rows[0]), rows
    assert re.fullmatch(r"\| 2 \| .* \| 0\.1[67] \| 210 \|", rows[1]), rows


def test_the_paired_floor_is_a_column_a_goal_line_and_a_round_column_older_runs_lack(
        result: dict) -> None:
    """Where a server's resnet50 run called the floor after each request (compare.PAIRED),
    its P99 over that floor's is a seed-table column, a goal line beside the pooled floor's,
    and a per-round column; a run without it renders as before."""
    before = compare_report.report(result)
    assert "paired" not in before
    tg = result["servers"]["tensorgate"]["workloads"]["resnet50"]
    tr = result["servers"]["triton"]["workloads"]["resnet50"]
    # the floor measured apart read fast minutes (70,000); the paired floors, slower ones
    tg["sequential"][0]["paired_us"] = _sequential(91_000, 100)["us"]
    tr["sequential"][0]["paired_us"] = _sequential(70_000, 100)["us"]
    tg["sequential"][0]["us"] = _sequential(91_200, 100)["us"]
    text = compare_report.report(result)
    rows = {line.split(" | ")[0]: line for line in
            text.split("| resnet50, batch 1 |", 1)[1].split("\n\n", 1)[0].splitlines()}
    # tensorgate: 91,200 + 2.33 σ over 70,000 + 2.33 σ and over 91,000 + 2.33 σ
    assert rows["| tensorgate"].endswith("| 1.30× | 1.00× |"), rows
    assert rows["| triton"].endswith("| 1.00× | 1.00× |"), rows
    assert rows["| floor"].endswith("| 1.00× | – |"), rows
    assert re.search(r"resnet50 P99, tensorgate / floor: 1\.30 \(goal ≤ 1\.1\) — missed", text)
    assert re.search(r"resnet50 P99, tensorgate / the floor called after each of its "
                     r"requests \(the paired floor.*\): 1\.00 \(goal ≤ 1\.1\) — met", text)
    tg["sequential"] *= 2
    tr["sequential"] *= 2
    for name in ("tensorgate", "triton"):
        result["servers"][name]["workloads"]["identity"]["sequential"] *= 2
    lines = compare_report.goals_by_round(result)
    assert "resnet50 P99, tensorgate / paired floor |" in lines[2]
    rows = [line for line in lines if re.match(r"\| \d ", line)]
    assert all(re.fullmatch(r"\| \d \| [0-9.]+ \| 1\.30 \| [0-9.]+ \| 1\.00 \|", row)
               for row in rows), rows


def test_interleaved_identity_is_a_table_and_a_goal_line_and_a_failure_is_said(
        result: dict) -> None:
    """The run's interleaved identity requests (compare.interleaved) give their own table
    and the identity goal read from them beside the pooled one; a run whose interleaving
    failed says so; a run without it renders as before."""
    before = compare_report.report(result)
    assert "interleaved" not in before.lower()
    result["interleaved"] = {"identity": {
        "tensorgate": _sequential(700, 5)["us"], "triton": _sequential(1900, 5)["us"],
        "network floor": _sequential(600, 5)["us"], "floor": _sequential(20, 1)["us"]}}
    text = compare_report.report(result)
    assert re.search(r"^\| tensorgate \| 400 \| 70\d \| .* \| 68\d \| (9\d|10\d) \|$", text,
                     re.M), text
    assert re.search(r"^\| floor \| 400 \| 20 \| .* \| – \| – \|$", text, re.M), text
    # (700 - 20) / (1900 - 20) = 0.36; over the network floor (700 - 600) / (1900 - 600) = 0.08
    assert re.search(r"tensorgate / Triton, their requests interleaved .*: 0\.3[67] \(goal "
                     r"≤ 0\.5\) — met", text), text
    assert re.search(r"Interleaved, identity P50 over the network floor, tensorgate / Triton "
                     r"\(no goal set\): 0\.0[78]", text), text
    # the pooled goal, from the rounds, is unchanged beside it
    assert re.search(r"over the floor, tensorgate / Triton: 0\.3[78] \(goal ≤ 0\.5\)", text)
    del result["interleaved"]
    result["interleaved_error"] = "triton exited with -11"
    assert "Interleaved identity requests: failed (triton exited with -11)." in \
        compare_report.report(result)
