"""Render bench/compare.py's raw JSON: the seed's table, the goals, plots and RESULTS.md's block.

Everything here reads the JSON only, so a report can be re-rendered (or restyled) without
measuring again:  .venv/bin/python bench/compare.py --render-only [--json FILE]
"""

from __future__ import annotations

import json
import pathlib
import statistics
from typing import Any

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
BEGIN, END = "<!-- compare:begin -->", "<!-- compare:end -->"


def markers(result: dict[str, Any]) -> tuple[str, str]:
    """RESULTS.md keeps one block per device and wire: a GPU run or a JSON run never
    overwrites the CPU table."""
    block = "-".join(part for part in (result.get("device", "cpu"), result.get("wire"))
                     if part not in ("cpu", "native", None))
    if not block:
        return BEGIN, END
    return f"<!-- compare-{block}:begin -->", f"<!-- compare-{block}:end -->"


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Per server (and the floor) and workload: latency percentiles over all rounds, median
    QPS per concurrency, max QPS, median start-up and memory."""
    out: dict[str, Any] = {}
    for name, record in _sources(result):
        row: dict[str, Any] = {"workloads": {}}
        for model, entry in record.get("workloads", {}).items():
            samples = np.concatenate([np.asarray(p["us"]) for p in entry["sequential"]]) \
                if entry["sequential"] else np.empty(0)
            w: dict[str, Any] = {"n": int(samples.size)}
            if samples.size:
                for q in (50, 90, 99):
                    w[f"p{q}_us"] = float(np.percentile(samples, q))
                w["max_us"] = float(samples.max())
            paired = [p["paired_us"] for p in entry["sequential"] if "paired_us" in p]
            if paired:  # the floor called after each of this server's requests (compare.PAIRED)
                both = np.concatenate([np.asarray(p) for p in paired])
                w["paired_p99_us"] = float(np.percentile(both, 99))
            cpu = [p["client_cpu_us"] for p in entry["sequential"] if "client_cpu_us" in p]
            if cpu:
                w["client_cpu_us"] = statistics.mean(cpu)
            w["levels"] = _levels(entry.get("concurrent", []))
            if w["levels"]:
                w["max_qps"] = max(v["qps"] for v in w["levels"].values())
            if entry.get("grpc"):
                w["grpc_levels"] = _levels(entry["grpc"])
            row["workloads"][model] = w
        if record.get("startup_s"):
            row["startup_s"] = statistics.median(record["startup_s"])
        if record.get("memory"):
            row["rss_mb"] = statistics.median(m["rss_mb"] for m in record["memory"])
            row["pss_mb"] = statistics.median(m["pss_mb"] for m in record["memory"])
            row["processes"] = max(m["processes"] for m in record["memory"])
            if all("peak_rss_mb" in m for m in record["memory"]):  # runs before 2026-11-30
                row["peak_rss_mb"] = statistics.median(m["peak_rss_mb"] for m in record["memory"])
                row["settled_s"] = max(m["settled_s"] for m in record["memory"])
        for key in ("version", "wire", "note", "batching", "errors", "tensorgate"):
            if key in record:
                row[key] = record[key]
        out[name] = row
    return out


NETWORK_FLOOR = "network floor"
_FLOORS = ("floor", NETWORK_FLOOR)


def _sources(result: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The floor, the network floor where the run measured one (runs before 2026-12-06 did
    not), and the servers: each name and its record."""
    network = [(NETWORK_FLOOR, result["network_floor"])] if "network_floor" in result else []
    return [("floor", result["floor"]), *network, *result["servers"].items()]


def _levels(runs: list[list[dict[str, Any]]]) -> dict[int, dict[str, float]]:
    """Points of several rounds, by connections: median QPS, P99 and client CPU; bad
    answers summed, the unmeasured warm-up's among them (a wrong answer counts whenever)."""
    found: dict[int, dict[str, list[float]]] = {}
    for run in runs:
        for point in run:
            level = found.setdefault(point["connections"],
                                     {"qps": [], "p99_us": [], "cpu": [], "bad": []})
            level["qps"].append(point["qps"])
            level["p99_us"].append(point["p99_us"])
            level["cpu"].append(point["client_cpu_share"])
            warm = point.get("warmup") or {}  # runs before warm-ups have none
            level["bad"].append(point["bad"] + point["errors"]
                                + warm.get("bad", 0) + warm.get("errors", 0))
    return {c: {"qps": statistics.median(v["qps"]), "p99_us": statistics.median(v["p99_us"]),
                "client_cpu_share": statistics.median(v["cpu"]), "bad": sum(v["bad"])}
            for c, v in sorted(found.items())}


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}×" if a is not None and b else "–"


def _get(s: dict[str, Any], name: str, model: str, key: str) -> float | None:
    value = s.get(name, {}).get("workloads", {}).get(model, {}).get(key)
    return None if value is None else float(value)


def seed_table(s: dict[str, Any], model: str) -> list[str]:
    """The seed's columns for one workload, with ratios against Triton and the floor (and
    the paired floor, where the run called it after each of the servers' requests)."""
    paired = any(_get(s, name, model, "paired_p99_us") for name in s)
    lines = [f"| {model}, batch 1 | P50 ms | P99 ms | RSS MB | PSS MB | start-up s | max QPS "
             f"| P50 / Triton | P99 / Triton | RSS / Triton | start-up / Triton | QPS / Triton "
             f"| P99 / floor |" + (" P99 / paired floor |" if paired else ""),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
             + ("---:|" if paired else "")]
    floor_p99 = _get(s, "floor", model, "p99_us")
    for name, row in s.items():
        p50, p99 = _get(s, name, model, "p50_us"), _get(s, name, model, "p99_us")
        qps = _get(s, name, model, "max_qps")
        if p50 is None:
            continue
        cells = [f"{p50 / 1e3:.3f}", f"{p99 / 1e3:.3f}" if p99 else "–",
                 f"{row['rss_mb']:.0f}" if "rss_mb" in row else "–",
                 f"{row['pss_mb']:.0f}" if "pss_mb" in row else "–",
                 f"{row['startup_s']:.2f}" if "startup_s" in row else "–",
                 f"{qps:,.0f}" if qps else "–"]
        if "triton" in s and name not in _FLOORS:
            cells += [_ratio(p50, _get(s, "triton", model, "p50_us")),
                      _ratio(p99, _get(s, "triton", model, "p99_us")),
                      _ratio(row.get("rss_mb"), s["triton"].get("rss_mb")),
                      _ratio(row.get("startup_s"), s["triton"].get("startup_s")),
                      _ratio(qps, _get(s, "triton", model, "max_qps"))]
        else:
            cells += ["–"] * 5
        cells.append(_ratio(p99, floor_p99) if name != NETWORK_FLOOR else "–")
        if paired:
            cells.append(_ratio(p99, _get(s, name, model, "paired_p99_us")))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def concurrency_table(s: dict[str, Any], model: str, key: str = "levels",
                      what: str = "", client: str = "wrk") -> list[str]:
    """QPS / P99 per connection count: HTTP (`levels`) or gRPC with h2load (`grpc_levels`)."""
    levels = sorted({c for row in s.values()
                     for c in row["workloads"].get(model, {}).get(key, {})}, key=int)
    if not levels:
        return []
    lines = [f"| {model}{what}: QPS / P99 ms at N connections | " +
             " | ".join(f"N={c}" for c in levels) + f" | {client} CPU (max) | bad answers |",
             "|---|" + "---:|" * (len(levels) + 2)]
    for name, row in s.items():
        w = row["workloads"].get(model, {}).get(key, {})
        if not w:
            continue
        cells = [f"{w[c]['qps']:,.0f} / {w[c]['p99_us'] / 1e3:.2f}" if c in w else "–"
                 for c in levels]
        cpu = max(v["client_cpu_share"] for v in w.values())
        bad = sum(v["bad"] for v in w.values())
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {cpu:.0%} | {bad} |")
    return lines


def memory_table(s: dict[str, Any]) -> list[str]:
    """Memory of each server's whole process tree, read once it had been idle for 2 s after
    the last load; the peak is each process's VmHWM, summed (shared pages count per process,
    as in RSS)."""
    lines = ["| memory, whole process tree | RSS after load MB | PSS MB | peak RSS MB "
             "| processes | idle wait s |", "|---|---:|---:|---:|---:|---:|"]
    for name, row in s.items():
        if "rss_mb" not in row:
            continue
        peak = f"{row['peak_rss_mb']:,.0f}" if "peak_rss_mb" in row else "–"
        wait = f"{row['settled_s']:.1f}" if "settled_s" in row else "–"
        lines.append(f"| {name} | {row['rss_mb']:,.0f} | {row['pss_mb']:,.0f} | {peak} "
                     f"| {row['processes']} | {wait} |")
    return lines


def sequential_table(s: dict[str, Any]) -> list[str]:
    """Each sequential run's percentiles, and a server's P50 over the floor's (and over the
    network floor's, where the run has one: the server's own work)."""
    network = NETWORK_FLOOR in s
    lines = ["| sequential, batch 1 | workload | n | P50 µs | P90 µs | P99 µs | max µs "
             "| over floor P50 µs |" + (" over network floor P50 µs |" if network else "")
             + " client CPU µs/req |",
             "|---|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if network else "") + "---:|"]
    for name, row in s.items():
        for model, w in row["workloads"].items():
            if "p50_us" not in w:
                continue
            over = [_get(s, floor, model, "p50_us")
                    for floor in (_FLOORS if network else _FLOORS[:1])]
            cells = ["–" if name in _FLOORS or p50 is None else f"{w['p50_us'] - p50:,.0f}"
                     for p50 in over]
            cpu = f"{w['client_cpu_us']:.0f}" if "client_cpu_us" in w else "–"
            lines.append(f"| {name} | {model} | {w['n']} | {w['p50_us']:,.0f} | {w['p90_us']:,.0f} "
                         f"| {w['p99_us']:,.0f} | {w['max_us']:,.0f} | "
                         + " | ".join(cells) + f" | {cpu} |")
    return lines


def _goal_line(text: str, value: float | None, limit: float, at_most: bool = True) -> str:
    if value is None:
        return f"- {text}: not measured"
    met = value <= limit if at_most else value >= limit
    return (f"- {text}: {value:,.2f} (goal {'≤' if at_most else '≥'} {limit}) — "
            f"{'met' if met else 'missed'}")


def cuda_goals(s: dict[str, Any]) -> list[str]:
    """Issue 5's goals on the H200: resnet50 end to end over HTTP, batch 1."""
    if "tensorgate" not in s:
        return ["Goals need tensorgate in the run."]
    p50, p99 = (_get(s, "tensorgate", "resnet50", key) for key in ("p50_us", "p99_us"))
    qps16 = s["tensorgate"]["workloads"].get("resnet50", {}).get("levels", {}).get(16, {})
    checks = [_goal_line("resnet50 P50 ms, sequential over HTTP",
                         None if p50 is None else p50 / 1e3, 2.6),
              _goal_line("resnet50 P99 ms, sequential over HTTP",
                         None if p99 is None else p99 / 1e3, 3),
              _goal_line("resnet50 QPS at 16 connections", qps16.get("qps"), 2000,
                         at_most=False)]
    if "triton" in s:
        for key, text in (("p50_us", "P50"), ("max_qps", "max QPS")):
            ratio = _ratio_value(_get(s, "tensorgate", "resnet50", key),
                                 _get(s, "triton", "resnet50", key))
            if ratio is not None:
                checks.append(f"- resnet50 {text}, tensorgate / Triton (no goal set): {ratio:.2f}")
    return checks


def goals(s: dict[str, Any], interleaved: dict[str, list[float]] | None = None) -> list[str]:
    """The issue's goals for this machine, each computed from this run's numbers
    (`interleaved`: the run's identity latencies with both servers running, by name)."""
    if "tensorgate" not in s or "triton" not in s:
        return ["Goals need tensorgate and Triton in the same run."]
    tg, tr = s["tensorgate"], s["triton"]
    checks: list[str] = []

    def add(text: str, value: float | None, limit: float, at_most: bool = True) -> None:
        checks.append(_goal_line(text, value, limit, at_most))

    overhead, resnet_p99, identity_qps, resnet_paired = _moving_goals(s)
    add("identity P50 overhead over the floor, tensorgate / Triton", overhead, 0.5)
    if interleaved is not None:
        add("identity P50 overhead over the floor, tensorgate / Triton, their requests "
            "interleaved with each other's and the floors' (the same seconds; the goal's "
            "limit)", interleaved_overhead(interleaved, "floor"), 0.5)
    network = _network_overhead(s)
    if network is not None:
        checks.append(f"- identity P50 over the {NETWORK_FLOOR} (its request and answer "
                      f"bytes through loopback to a bare answerer), tensorgate / Triton (no "
                      f"goal set): {network:.2f}")
    add("resnet50 P99, tensorgate / floor", resnet_p99, 1.1)
    if resnet_paired is not None:
        add("resnet50 P99, tensorgate / the floor called after each of its requests (the "
            "paired floor: the same seconds, on a machine whose speed swings; the goal's "
            "limit)", resnet_paired, 1.1)
    add("RSS, tensorgate / Triton", _ratio_value(tg.get("rss_mb"), tr.get("rss_mb")), 0.6)
    # Triton's tree shares libraries between its processes, which RSS counts once per
    # process; PSS splits shared pages, so this is the stricter comparison (no goal of its own)
    pss = _ratio_value(tg.get("pss_mb"), tr.get("pss_mb"))
    checks.append(f"- PSS, tensorgate / Triton (shared pages split; no goal set): "
                  f"{pss:.2f}" if pss is not None else "- PSS: not measured")
    peak = _ratio_value(tg.get("peak_rss_mb"), tr.get("peak_rss_mb"))
    if peak is not None:  # the burst itself, before tensorgate hands its heap back
        checks.append(f"- peak RSS, tensorgate / Triton (no goal set): {peak:.2f}")
    add("start-up, tensorgate / Triton", _ratio_value(tg.get("startup_s"), tr.get("startup_s")), 0.75)
    add("identity max QPS, tensorgate / Triton", identity_qps, 2.0, at_most=False)
    return checks


def _moving_goals(s: dict[str, Any]
                  ) -> tuple[float | None, float | None, float | None, float | None]:
    """The goals that move with the machine's moment, from a summary: identity's P50
    overhead over the floor and its max QPS against Triton's, resnet50's P99 against the
    floor's, and against the floor's called after each of tensorgate's requests (None in
    runs before 2026-12-06)."""
    return (_identity_ratio(s, _get(s, "floor", "identity", "p50_us") or 0.0),
            _ratio_value(_get(s, "tensorgate", "resnet50", "p99_us"),
                         _get(s, "floor", "resnet50", "p99_us")),
            _ratio_value(_get(s, "tensorgate", "identity", "max_qps"),
                         _get(s, "triton", "identity", "max_qps")),
            _ratio_value(_get(s, "tensorgate", "resnet50", "p99_us"),
                         _get(s, "tensorgate", "resnet50", "paired_p99_us")))


def interleaved_overhead(found: dict[str, list[float]], floor: str) -> float | None:
    """tensorgate's identity P50 over `floor`'s (the floor or the network floor), over
    Triton's, from interleaved latencies (compare.interleaved)."""
    if floor not in found or "tensorgate" not in found or "triton" not in found:
        return None
    p50 = {name: float(np.percentile(us, 50)) for name, us in found.items()}
    return _overhead_ratio(p50["tensorgate"], p50["triton"], p50[floor])


def interleaved_table(result: dict[str, Any]) -> list[str]:
    """The identity requests of the run's end, both servers running and every request's
    turn rotated among them, the network floor and the floor (compare.interleaved)."""
    found = result.get("interleaved", {}).get("identity")
    if not found:
        error = result.get("interleaved_error")
        return [f"Interleaved identity requests: failed ({error})."] if error else []
    p50 = {name: float(np.percentile(us, 50)) for name, us in found.items()}
    lines = ["| identity, interleaved (both servers running, one request each in turn) | n "
             "| P50 µs | P90 µs | P99 µs | over floor P50 µs | over network floor P50 µs |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, us in found.items():
        q50, q90, q99 = np.percentile(us, [50, 90, 99])
        over = ["–" if name in _FLOORS or floor not in p50 else f"{q50 - p50[floor]:,.0f}"
                for floor in _FLOORS]
        lines.append(f"| {name} | {len(us)} | {q50:,.0f} | {q90:,.0f} | {q99:,.0f} | "
                     + " | ".join(over) + " |")
    network = interleaved_overhead(found, NETWORK_FLOOR)
    if network is not None:
        lines += ["", f"Interleaved, identity P50 over the {NETWORK_FLOOR}, tensorgate / "
                      f"Triton (no goal set): {network:.2f}"]
    return lines


def _network_overhead(s: dict[str, Any]) -> float | None:
    """Identity's P50 less the network floor's, tensorgate's over Triton's: each server's
    own work, without the kernel's copies of the bytes (None without a network floor)."""
    network = _get(s, NETWORK_FLOOR, "identity", "p50_us")
    return None if network is None else _identity_ratio(s, network)


def _identity_ratio(s: dict[str, Any], floor_p50: float) -> float | None:
    """From a summary: `_overhead_ratio` of identity's P50s (a server without one counts
    as 0)."""
    return _overhead_ratio(_get(s, "tensorgate", "identity", "p50_us") or 0.0,
                           _get(s, "triton", "identity", "p50_us") or 0.0, floor_p50)


def _overhead_ratio(tensorgate_p50: float, triton_p50: float, floor_p50: float
                    ) -> float | None:
    """tensorgate's P50 over a floor's, over Triton's (None where Triton's is not over it)."""
    over = triton_p50 - floor_p50
    return (tensorgate_p50 - floor_p50) / over if over > 0 else None


def goals_by_round(result: dict[str, Any]) -> list[str]:
    """The goals that vary with the machine's moment, per round: the goals above pool every
    round's samples, so a slow minute in one round (one server's, in the alternating order)
    is folded into a P99 or a P50 unseen; here it shows. Empty for a run of one round."""
    servers = result["servers"]
    if "tensorgate" not in servers or "triton" not in servers:
        return []
    rounds = min(len(servers[name]["workloads"].get("identity", {}).get("sequential", []))
                 for name in ("tensorgate", "triton"))
    if rounds < 2:
        return []
    network = "network_floor" in result
    paired = any("paired_us" in part for part in
                 servers["tensorgate"]["workloads"].get("resnet50", {}).get("sequential", []))
    lines = ["Per round (the goals above pool the rounds; a slow minute in one shows here):", "",
             "| round | identity P50 overhead, tensorgate / Triton | resnet50 P99, tensorgate "
             "/ floor | identity max QPS, tensorgate / Triton |"
             + (" resnet50 P99, tensorgate / paired floor |" if paired else "")
             + (f" identity P50 over the {NETWORK_FLOOR}, tensorgate / Triton | network "
                "floor's identity P50 µs |" if network else ""),
             "|---:|---:|---:|---:|" + ("---:|" if paired else "")
             + ("---:|---:|" if network else "")]
    for index in range(rounds):
        one = summarize(_one_round(result, index))
        values = list(_moving_goals(one))
        if not paired:
            values.pop()
        if network:
            values.append(_network_overhead(one))
        cells = [f"{v:.2f}" if v is not None else "–" for v in values]
        if network:
            floor_p50 = _get(one, NETWORK_FLOOR, "identity", "p50_us")
            cells.append(f"{floor_p50:,.0f}" if floor_p50 is not None else "–")
        lines.append(f"| {index + 1} | " + " | ".join(cells) + " |")
    return lines


def _one_round(result: dict[str, Any], index: int) -> dict[str, Any]:
    """`result` as if it had measured round `index` alone: each workload's rounds of
    sequential and concurrent points cut to that one (a record with fewer rounds, as a floor
    measured once, keeps all of its own)."""
    def cut(runs: list[Any]) -> list[Any]:
        return runs[index:index + 1] if index < len(runs) else runs

    def record(entry: dict[str, Any]) -> dict[str, Any]:
        return {**entry, "workloads": {
            model: {key: cut(value) if key in ("sequential", "concurrent", "grpc") else value
                    for key, value in workload.items()}
            for model, workload in entry.get("workloads", {}).items()}}

    network = ({"network_floor": record(result["network_floor"])}
               if "network_floor" in result else {})
    return {**result, "floor": record(result["floor"]), **network,
            "servers": {name: record(entry) for name, entry in result["servers"].items()}}


def _ratio_value(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def report(result: dict[str, Any]) -> str:
    s = summarize(result)
    m = result["machine"]
    plan = result["plan"]
    device = result.get("device", "cpu")
    client = {"wrk": "wrk", "socket": "the socket client (compare_wire.socket_load)"}.get(
        result.get("client") or ("wrk" if result.get("wrk") else ""), "no load generator")
    where = (f"{m['gpu']} (CUDA {m.get('cuda')}), every model on the GPU, host with "
             if device == "cuda" else "")
    lines = [f"Measured {result['date']} on {where}{m['cores']} cores ({m['cpu']}), "
             f"{m['memory_gb']} GiB, Python {m['python']}, torch {m['torch']} with "
             f"{result['threads']} intra-op thread(s) for every server; {plan['rounds']} "
             f"round(s) in alternating order; load from {client}, "
             f"{plan['seconds']['identity']:g} s per identity point, "
             f"{plan['seconds']['resnet50']:g} s or more per resnet50 point"
             + (f", each after an unmeasured warm-up of {plan['warm_share']:.0%} of its "
                f"length (≥ 1 s) at its connections" if plan.get("warm_share") else "")
             + ". Command: "
             f"`{result.get('command', '.venv/bin/python bench/compare.py')}`.", ""]
    for model in ("resnet50", "identity"):
        lines += seed_table(s, model) + [""]
    lines += memory_table(s) + [""]
    lines += sequential_table(s) + [""]
    for model in ("identity", "resnet50"):
        table = concurrency_table(s, model, client="socket client" if result.get("client")
                                  == "socket" else "wrk")
        if table:
            lines += table + [""]
    for model in ("identity", "resnet50"):
        table = concurrency_table(s, model, "grpc_levels", " over gRPC", "h2load")
        if table:
            lines += table + [""]
    if result.get("wire", "native") != "native":
        lines += [f"Every server here speaks {result['wire'].upper()} (bench/compare.py --wire "
                  f"{result['wire']}); issue 5's goals are for each server's fastest form.", ""]
    elif device == "cuda":
        lines += ["Goals (issue 5, on the GPU):", *cuda_goals(s), ""]
    else:
        table = interleaved_table(result)
        if table:
            lines += table + [""]
        found = result.get("interleaved", {}).get("identity")
        lines += ["Goals (issue 5, this machine):", *goals(s, found), ""]
        by_round = goals_by_round(result)
        if by_round:
            lines += by_round + [""]
    tg = s.get("tensorgate", {}).get("tensorgate")
    if tg:
        lines.append("tensorgate's own view (metrics and statistics, cumulative over its run; "
                     "per request as Triton counts it, so a request in a batch is charged "
                     "the whole batch's compute):")
        for model, d in ((m, tg[m]) for m in ("identity", "resnet50") if m in tg):
            stages = ", ".join(f"{k} {v:,.1f} µs" for k, v in d["stage_us"].items())
            copied = d["copied_bytes_per_request"]
            amount = f"{copied:,.0f}" if copied is not None else "?"
            line = f"- {model}: {amount} bytes copied per request; per request: {stages}"
            if "batch_stage_us" in d:  # results from before 2026-11-30 lack it
                runs = ", ".join(f"{k} {v:,.1f} µs" for k, v in d["batch_stage_us"].items())
                line += f"; per batch run ({d['mean_batch_rows']:.2f} rows on average): {runs}"
            lines.append(line)
        reasons = tg.get("copies_by_reason")
        if reasons:
            lines.append("- bytes copied in the whole run, by reason (every model, HTTP and gRPC): "
                         + ", ".join(f"{k} {v / 1e6:,.1f} MB" for k, v in
                                     sorted(reasons.items(), key=lambda kv: -kv[1]) if v))
        lines.append("")
    lines.append("Servers:")
    for name, row in s.items():
        if name in _FLOORS:
            continue
        lines.append(f"- {name} {row.get('version', '')}: {row.get('note', '')}; "
                     f"{row.get('batching', '')}; {row.get('processes', '?')} process(es)")
        for error in row.get("errors", []):
            lines.append(f"  - error: {error}")
    return "\n".join(lines) + "\n"


def plots(result: dict[str, Any], prefix: pathlib.Path) -> list[pathlib.Path]:
    """A latency CDF and a QPS-vs-connections plot (PNG); [] when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib): no plots")
        return []
    s = summarize(result)
    sources = _sources(result)

    def cdf(axis: Any, model: str) -> None:
        for name, record in sources:
            parts = record.get("workloads", {}).get(model, {}).get("sequential", [])
            if parts:
                samples = np.sort(np.concatenate([np.asarray(p["us"]) for p in parts])) / 1e3
                axis.plot(samples, np.arange(1, samples.size + 1) / samples.size, label=name)
        axis.set_xscale("log")
        axis.set(xlabel="latency, ms (log)", ylabel="fraction of requests",
                 title=f"{model}: sequential batch-1 latency CDF")

    def qps(axis: Any, model: str) -> None:
        for name, row in s.items():
            levels = row["workloads"].get(model, {}).get("levels", {})
            if levels:
                xs = sorted(levels, key=int)
                axis.plot(xs, [levels[c]["qps"] for c in xs], marker="o", label=name)
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set(xlabel="concurrent connections", ylabel="requests per second (log)",
                 title=f"{model}: throughput vs concurrency")

    paths = []
    for suffix, draw in (("-latency-cdf.png", cdf), ("-qps.png", qps)):
        figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        for axis, model in zip(axes, ("identity", "resnet50")):
            draw(axis, model)
            axis.grid(True, which="both", alpha=0.3)
            if axis.lines:
                axis.legend()
        figure.tight_layout()
        paths.append(prefix.with_name(prefix.name + suffix))
        figure.savefig(paths[-1], dpi=110)
        plt.close(figure)
    return paths


def render(path: pathlib.Path, results_md: pathlib.Path | None = HERE / "RESULTS.md",
           with_plots: bool = True) -> str:
    """Print the report of the JSON at `path`, draw its plots beside it, and replace the
    block between the compare markers in `results_md` (appended when it has none)."""
    result = json.loads(path.read_text())
    text = report(result)
    print(text)
    pngs = plots(result, path.with_suffix("")) if with_plots else []
    for png in pngs:
        print(f"plot: {png}")
    if results_md is not None:
        current = results_md.read_text() if results_md.exists() else ""
        base = results_md.parent
        links = "".join(f"![{p.stem}]({_relative(p, base)})\n" for p in pngs)
        begin, end = markers(result)
        options = "".join(f" --{key} {result[key]}" for key, plain in
                          (("device", "cpu"), ("wire", "native"))
                          if result.get(key, plain) != plain)
        where = " on the GPU" if result.get("device", "cpu") != "cpu" else ""
        title = f"Side by side with peers{where} (bench/compare.py{options})"
        block = (f"{begin}\n## {title}\n\n{text}\n{links}"
                 f"Raw numbers: `{_relative(path, base)}` (re-render without measuring: "
                 f"`.venv/bin/python bench/compare.py --render-only{options}`).\n{end}")
        if begin in current and end in current:
            head, rest = current.split(begin, 1)
            current = head + block + rest.split(end, 1)[1]
        else:
            current = current.rstrip() + "\n\n" + block + "\n"
        results_md.write_text(current)
    return text


def _relative(path: pathlib.Path, base: pathlib.Path) -> str:
    path = path.resolve()
    return str(path.relative_to(base.resolve())) if path.is_relative_to(base.resolve()) else str(path)
