"""The servers bench/compare.py measures: how each one is prepared, started and spoken to.

tensorgate and its ASGI variant run from tensorgate's own venv; the peers from their venvs
under bench/peers/.venvs/ (bench/peers/install.sh). Every one binds 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from typing import Callable

from compare_wire import BASE64_JSON, OIP_BINARY, OIP_JSON, Wire

HERE = pathlib.Path(__file__).resolve().parent
PEERS = HERE / "peers"
VENVS = pathlib.Path(os.environ.get("TENSORGATE_PEERS_DIR", PEERS / ".venvs"))
# Where no venv can be built (the GPU device: no package registry), Triton runs from an
# unpacked bundle of the nvidia-pytriton wheel (bench/peers/pack_device.sh): this folder holds
# pytriton/tritonserver/, nvidia_pytriton.libs/ and site/ (numpy<2 for the stub), and the
# stub runs on this interpreter.
TRITON_BUNDLE = os.environ.get("TENSORGATE_TRITON_BUNDLE")
WORKLOADS = {"identity": (3, 224, 224), "resnet50": (1000,)}  # output dims per model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Ports:
    """Where one server instance listens (all on 127.0.0.1)."""

    http: int
    grpc: int
    metrics: int

    @classmethod
    def free(cls) -> Ports:
        return cls(free_port(), free_port(), free_port())


@dataclass
class Server:
    """How to start one server and talk to it."""

    name: str
    wire: Wire
    infer_path: str  # with {model}
    python: pathlib.Path
    command: Callable[[Server, Ports, pathlib.Path], list[str]]
    environment: Callable[[Server, pathlib.Path], dict[str, str]] = lambda s, w: {}
    prepare: Callable[[Server, pathlib.Path, int], None] = lambda s, w, p: None
    note: str = ""
    grpc: bool = False  # speaks the protocol's gRPC on ports.grpc: measured with h2load too
    batching: str = ""
    v2_json: bool = True  # takes V2 JSON as well as its own wire (compare.py --wire json)
    package: str = ""  # whose version the report shows; must import (as a module) to run
    # a server that runs from files rather than a venv: its check (None when it can run) and
    # the version the report shows
    bundle_check: Callable[[Server], str | None] | None = None
    bundle_version: str = ""

    def installed(self) -> str | None:
        """None when the server can run here, else why not."""
        if self.bundle_check is not None:
            return self.bundle_check(self)
        if not self.python.exists():
            return f"not installed (bash bench/peers/install.sh {self.name})"
        module = self.package.replace("nvidia-pytriton", "pytriton").replace("-", "_")
        probe = subprocess.run([str(self.python), "-c", f"import {module}"], capture_output=True)
        if probe.returncode != 0:
            return f"{self.package} does not import in {self.python}"
        return None

    def version(self) -> str:
        if self.bundle_version:
            return self.bundle_version
        package = self.package
        module = package.replace("nvidia-pytriton", "pytriton").replace("-", "_")
        # the installed distribution's version, else the module's own (run from a source
        # tree, as on the GPU machine, where PYTHONPATH names src/)
        script = (f"import importlib.metadata as m\ntry: print(m.version({package!r}))\n"
                  f"except m.PackageNotFoundError: import {module}; print({module}.__version__)")
        out = subprocess.run([str(self.python), "-c", script], capture_output=True, text=True)
        return out.stdout.strip() or "?"


def _tensorgate_command(server: Server, ports: Ports, work: pathlib.Path) -> list[str]:
    return [str(server.python), "-m", "tensorgate", "serve", "--model-repository",
            str(work / "models"), "--http-port", str(ports.http), "--grpc-port",
            str(ports.grpc), "--metrics-port", str(ports.metrics)]


def _tensorgate_tritonpy_command(server: Server, ports: Ports, work: pathlib.Path) -> list[str]:
    command = _tensorgate_command(server, ports, work)
    command[command.index("--model-repository") + 1] = str(work / "tensorgate-triton-models")
    return command


def _triton_home(server: Server) -> pathlib.Path:
    if TRITON_BUNDLE:
        return pathlib.Path(TRITON_BUNDLE) / "pytriton" / "tritonserver"
    site = next((server.python.parent.parent / "lib").glob("python3*/site-packages"))
    return site / "pytriton" / "tritonserver"


def _triton_prepare(server: Server, work: pathlib.Path, threads: int) -> None:
    """A Python-backend repository and a backend folder holding the stub for the venv's
    Python, as PyTriton itself arranges them."""
    home = _triton_home(server)
    backend = work / "triton-backends" / "python"
    backend.mkdir(parents=True, exist_ok=True)
    version = subprocess.run([str(server.python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    if TRITON_BUNDLE:
        _stub_environment(server.python, work / "triton-stub-env",
                          pathlib.Path(TRITON_BUNDLE) / "site")
    for source in [home / "backends/python/libtriton_python.so",
                   home / "backends/python/triton_python_backend_utils.py",
                   home / f"python_backend_stubs/{version}/triton_python_backend_stub"]:
        link = backend / source.name
        if not link.exists():
            link.symlink_to(source)
    triton_python_repository(work / "triton-models")


def triton_python_repository(root: pathlib.Path) -> None:
    """The Python-backend repository a Triton user writes (bench/peers/triton_model.py for
    each workload): what Triton serves, and tensorgate serves unchanged."""
    on_gpu = os.environ.get("TG_BENCH_DEVICE", "cpu").startswith("cuda")
    kind = "KIND_GPU" if on_gpu else "KIND_CPU"
    for model, dims in WORKLOADS.items():
        folder = root / model
        (folder / "1").mkdir(parents=True, exist_ok=True)
        shutil.copy(PEERS / "triton_model.py", folder / "1" / "model.py")
        (folder / "config.pbtxt").write_text(textwrap.dedent(f"""\
            name: "{model}"
            backend: "python"
            max_batch_size: 64
            input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] }} ]
            output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: {list(dims)} }} ]
            dynamic_batching {{ }}
            instance_group [ {{ kind: {kind} count: 1 }} ]
            """))


def _triton_command(server: Server, ports: Ports, work: pathlib.Path) -> list[str]:
    return [str(_triton_home(server) / "bin" / "tritonserver"),
            "--model-repository", str(work / "triton-models"),
            "--backend-directory", str(work / "triton-backends"),
            "--http-address", "127.0.0.1", "--http-port", str(ports.http),
            "--grpc-address", "127.0.0.1", "--grpc-port", str(ports.grpc),
            "--metrics-address", "127.0.0.1", "--metrics-port", str(ports.metrics),
            "--log-info", "false"]


def _triton_bundle_check(server: Server) -> str | None:
    binary = _triton_home(server) / "bin" / "tritonserver"
    return None if binary.exists() else f"no {binary} (TENSORGATE_TRITON_BUNDLE)"


def _stub_environment(python: pathlib.Path, env: pathlib.Path, first: pathlib.Path) -> None:
    """A venv for the stub, whose interpreter reads the site-packages of the first python3 on
    PATH and ignores PYTHONPATH: its own .pth puts `first` (the bundle's numpy<2) ahead of
    `python`'s site-packages (torch, and a numpy 2 that would make the stub answer empty
    outputs)."""
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(env)], check=True)
    script = ("import site, sysconfig; print(sysconfig.get_paths()['purelib']); "
              "print(*site.getsitepackages(), sep='\\n')")
    own = subprocess.run([str(env / "bin" / "python3"), "-c", script], capture_output=True,
                         text=True, check=True).stdout.split()[0]
    parents = subprocess.run([str(python), "-c", script], capture_output=True, text=True,
                             check=True).stdout.split()
    lines = [str(first), *dict.fromkeys(parents)]
    (pathlib.Path(own) / "tensorgate-stub.pth").write_text("\n".join(lines) + "\n")


def _triton_environment(server: Server, work: pathlib.Path) -> dict[str, str]:
    libs = _triton_home(server).parent.parent / "nvidia_pytriton.libs"
    libdir = subprocess.run([str(server.python), "-c",
                             "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
                            capture_output=True, text=True, check=True).stdout.strip()
    # the stub imports from the environment of the first python3 on PATH
    stub_bin = work / "triton-stub-env" / "bin" if TRITON_BUNDLE else server.python.parent
    return {"LD_LIBRARY_PATH": f"{libs}:{libdir}", "PATH": f"{stub_bin}:{os.environ['PATH']}"}


def _mlserver_prepare(server: Server, work: pathlib.Path, threads: int) -> None:
    folder = work / "mlserver"
    for model in WORKLOADS:
        (folder / model).mkdir(parents=True, exist_ok=True)
        (folder / model / "model-settings.json").write_text(json.dumps({
            "name": model, "implementation": "mlserver_runtime.TorchScriptRuntime",
            "max_batch_size": 64, "max_batch_time": 0.0005}))


def _mlserver_command(server: Server, ports: Ports, work: pathlib.Path) -> list[str]:
    (work / "mlserver" / "settings.json").write_text(json.dumps({
        "host": "127.0.0.1", "http_port": ports.http, "grpc_port": ports.grpc,
        "metrics_port": ports.metrics, "debug": False}))
    return [str(server.python.parent / "mlserver"), "start", str(work / "mlserver")]


def _asgi_command(server: Server, ports: Ports, work: pathlib.Path) -> list[str]:
    return [str(server.python), str(HERE / "asgi_front.py"), str(work / "models"), str(ports.http)]


def _litserve_command(server: Server, ports: Ports, work: pathlib.Path) -> list[str]:
    return [str(server.python), str(PEERS / "litserve_app.py"), str(ports.http)]


def _fastapi_command(server: Server, ports: Ports, work: pathlib.Path) -> list[str]:
    return [str(server.python), "-m", "uvicorn", "--app-dir", str(PEERS), "fastapi_app:app",
            "--host", "127.0.0.1", "--port", str(ports.http), "--no-access-log", "--log-level", "warning"]


def servers() -> dict[str, Server]:
    venv = lambda name: VENVS / name / "bin" / "python"  # noqa: E731
    return {
        "tensorgate": Server("tensorgate", OIP_BINARY, "/v2/models/{model}/infer",
                             pathlib.Path(sys.executable), _tensorgate_command,
                             note="HTTP, binary tensor extension", grpc=True,
                             batching="dynamic batching (max delay 0)", package="tensorgate"),
        "tensorgate-tritonpy": Server(
            "tensorgate-tritonpy", OIP_BINARY, "/v2/models/{model}/infer",
            pathlib.Path(sys.executable), _tensorgate_tritonpy_command,
            prepare=lambda s, w, t: triton_python_repository(w / "tensorgate-triton-models"),
            note="tensorgate serving Triton's Python-backend repository unchanged (the same "
                 "model.py and config.pbtxt as the triton row; pb_utils API)", grpc=True,
            batching="dynamic batching (max delay 0)", package="tensorgate"),
        "tensorgate-asgi": Server("tensorgate-asgi", OIP_BINARY, "/v2/models/{model}/infer",
                                  pathlib.Path(sys.executable), _asgi_command,
                                  note="tensorgate's engine and data plane behind uvicorn "
                                       "(httptools, asyncio loop) and a raw ASGI app "
                                       "(bench/asgi_front.py): the HTTP-layer alternative",
                                  batching="dynamic batching (max delay 0)", package="uvicorn"),
        "triton": Server("triton", OIP_BINARY, "/v2/models/{model}/infer",
                         pathlib.Path(sys.executable) if TRITON_BUNDLE else venv("triton"),
                         _triton_command, _triton_environment, _triton_prepare,
                         note="tritonserver 2.51 (nvidia-pytriton 0.7.0), Python backend, "
                              "binary tensor extension", grpc=True,
                         batching="dynamic batching (max delay 0)", package="nvidia-pytriton",
                         bundle_check=_triton_bundle_check if TRITON_BUNDLE else None,
                         bundle_version="0.7.0 (unpacked bundle)" if TRITON_BUNDLE else ""),
        "mlserver": Server("mlserver", OIP_JSON, "/v2/models/{model}/infer", venv("mlserver"),
                           _mlserver_command, prepare=_mlserver_prepare,
                           note="custom runtime; V2 JSON (MLServer has no binary extension "
                                "over REST); default parallel workers",
                           batching="adaptive batching (max 64, 0.5 ms)", package="mlserver"),
        "litserve": Server("litserve", BASE64_JSON, "/predict/{model}", venv("litserve"),
                           _litserve_command,
                           note="JSON with base64 tensors (LitServe takes JSON)",
                           batching="batching (max 64, timeout 0)", package="litserve"),
        "fastapi": Server("fastapi", OIP_BINARY, "/v2/models/{model}/infer", venv("fastapi"),
                          _fastapi_command,
                          note="uvicorn[standard] (uvloop, httptools); hand-written OIP "
                               "subset, binary tensor extension",
                          batching="none", package="fastapi", v2_json=False),
    }
