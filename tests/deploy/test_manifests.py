"""deploy/: the KServe and Kubernetes manifests against KServe's and Kubernetes' schemas (the
models their Python SDKs generate from them), and every command line in them and in the
Dockerfile against tensorgate's own: what a cluster would run is what the server takes, as
the image's user, on the ports the probes, services and metrics annotations name.
deploy/build_check.sh builds and runs the image itself (not in CI: it needs a container
tool and root or a daemon)."""

from __future__ import annotations

import json
import pathlib
import re
import shlex
import subprocess
import sys
from typing import Any

import pytest
import yaml

from tensorgate.cli import parse_serve
from tensorgate.network.http_routes import API_GROUP, route

DEPLOY = pathlib.Path(__file__).resolve().parents[2] / "deploy"
CHECKER = pathlib.Path(__file__).with_name("kube_schema.py")


def schema_errors(cases: list[tuple[str, str, Any]]) -> list[str | None]:
    """kube_schema.py's verdict on each (type name, where, document), in one process."""
    done = subprocess.run([sys.executable, str(CHECKER)], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout)
    assert isinstance(found, list) and len(found) == len(cases)
    return found


def _load(name: str) -> dict[str, Any]:
    document = yaml.safe_load((DEPLOY / "kserve" / name).read_text())
    assert isinstance(document, dict)
    return document


def _load_all(path: pathlib.Path) -> dict[str, dict[str, Any]]:
    """A multi-document manifest's documents by kind."""
    return {d["kind"]: d for d in yaml.safe_load_all(path.read_text())}


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments out."""
    logical, found = "", []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or not stripped and not logical:
            continue
        logical += stripped[:-1] + " " if stripped.endswith("\\") else stripped
        if not stripped.endswith("\\") and logical:
            word, _, rest = logical.partition(" ")
            found.append((word.upper(), rest.strip()))
            logical = ""
    return found


def final_stage(text: str) -> list[tuple[str, str]]:
    instructions = dockerfile_instructions(text)
    last_from = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    return instructions[last_from:]


def image_environment(stage: list[tuple[str, str]]) -> dict[str, str]:
    environment: dict[str, str] = {}
    for word, rest in stage:
        if word == "ENV":
            environment.update(item.split("=", 1) for item in shlex.split(rest))
    return environment


def image_command(stage: list[tuple[str, str]]) -> list[str]:
    """ENTRYPOINT + CMD of the final stage (exec form), the program's name left out."""
    found = {word: json.loads(rest) for word, rest in stage if word in ("ENTRYPOINT", "CMD")}
    assert found["ENTRYPOINT"] == ["tensorgate"], "the console script pyproject.toml installs"
    return list(found["ENTRYPOINT"][1:]) + list(found["CMD"])


def assert_health_route(path: str) -> None:
    """`path` is one of the protocol's health routes as tensorgate routes it."""
    handler, _ = route("GET", path)
    assert not isinstance(handler, int) and API_GROUP[handler] == "health", path


def tmp_volume(container: dict[str, Any], volumes: list[dict[str, Any]]) -> dict[str, Any]:
    """The pod volume `container` mounts at /tmp (the image's one writable path)."""
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    return {v["name"]: v for v in volumes}[mounts["/tmp"]]


DOCKERFILE = (DEPLOY / "Dockerfile").read_text()
STAGE = final_stage(DOCKERFILE)
RUNTIME = _load("servingruntime.yaml")
SERVICE = _load("inferenceservice.yaml")
SERVICE_GRPC = _load("inferenceservice-grpc.yaml")
CONTAINER = RUNTIME["spec"]["containers"][0]
PLAIN = _load_all(DEPLOY / "kubernetes" / "tensorgate.yaml")
POD = PLAIN["Deployment"]["spec"]["template"]


def _spoilt(change: Any) -> Any:
    document = _load("servingruntime.yaml")
    change(document)
    return document


SPOILT = [  # (how the checker's words must begin, a word they must hold, a spoilt copy)
    ("servingruntime.spec.containers[0]: V1Container has no field", "'imagePullPolcy'",
     _spoilt(lambda d: d["spec"]["containers"][0].update(imagePullPolcy="Always"))),
    ("servingruntime.spec.containers[0].ports[0].containerPort: int expected", "'8080'",
     _spoilt(lambda d: d["spec"]["containers"][0]["ports"][0].update(containerPort="8080"))),
    ("servingruntime.spec.supportedModelFormats[0]: V1alpha1SupportedModelFormat has no "
     "field", "'autoselect'",
     _spoilt(lambda d: d["spec"]["supportedModelFormats"][0].update(autoselect=True))),
    # Kubernetes' own required-field check (its words are its model generator's)
    ("servingruntime.spec.containers[0]: ", "name",
     _spoilt(lambda d: d["spec"]["containers"][0].pop("name"))),
]


@pytest.fixture(scope="module")
def verdicts() -> list[str | None]:
    cases = [("V1alpha1ClusterServingRuntime", "servingruntime", RUNTIME),
             ("V1beta1InferenceService", "inferenceservice", SERVICE),
             ("V1beta1InferenceService", "inferenceservice-grpc", SERVICE_GRPC),
             ("V1Deployment", "kubernetes.Deployment", PLAIN["Deployment"]),
             ("V1Service", "kubernetes.Service", PLAIN["Service"])]
    cases += [("V1alpha1ClusterServingRuntime", "servingruntime", d) for _, _, d in SPOILT]
    return schema_errors(cases)


def test_the_manifests_fit_kserves_and_kubernetes_schemas(verdicts: list[str | None]) -> None:
    assert verdicts[:5] == [None] * 5
    assert (RUNTIME["apiVersion"], RUNTIME["kind"]) == ("serving.kserve.io/v1alpha1",
                                                        "ClusterServingRuntime")
    assert set(RUNTIME["spec"]["protocolVersions"]) == {"v2", "grpc-v2"}
    assert [c["name"] for c in RUNTIME["spec"]["containers"]] == ["kserve-container"]


def test_a_misspelt_mistyped_or_missing_field_is_named(verdicts: list[str | None]) -> None:
    for (begins, word, _), verdict in zip(SPOILT, verdicts[5:], strict=True):
        assert verdict is not None and verdict.startswith(begins) and word in verdict, (
            begins, verdict)


@pytest.mark.parametrize("service", [SERVICE, SERVICE_GRPC], ids=["http", "grpc"])
def test_the_inference_services_name_the_runtime_and_a_format_it_serves(
        service: dict[str, Any]) -> None:
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == RUNTIME["metadata"]["name"]
    formats = {(f["name"], f["version"]) for f in RUNTIME["spec"]["supportedModelFormats"]}
    assert (model["modelFormat"]["name"], model["modelFormat"]["version"]) in formats
    assert model["protocolVersion"] in RUNTIME["spec"]["protocolVersions"]


def test_the_grpc_service_routes_to_the_port_tensorgate_speaks_grpc_on() -> None:
    config = parse_serve(CONTAINER["args"], image_environment(STAGE))
    ports = SERVICE_GRPC["spec"]["predictor"]["model"]["ports"]
    assert [(p["name"], p["containerPort"]) for p in ports] == [("h2c", config.grpc_port)]


def test_the_runtimes_arguments_are_what_tensorgate_serves_with_in_the_image() -> None:
    environment = {**image_environment(STAGE),
                   **{e["name"]: e["value"] for e in CONTAINER.get("env", [])}}
    config = parse_serve(CONTAINER["args"], environment)
    assert config.model_repository == (pathlib.Path("/mnt/models"),)  # KServe's storage
    assert config.host == "0.0.0.0"  # the image's TENSORGATE_HOST: the pod's address
    assert [p["containerPort"] for p in CONTAINER["ports"]] == [config.http_port] == [8080]
    assert config.grpc_port == 9000
    for probe in (CONTAINER["startupProbe"], CONTAINER["readinessProbe"],
                  CONTAINER["livenessProbe"]):
        assert probe["httpGet"]["port"] == config.http_port
        assert_health_route(probe["httpGet"]["path"])
    annotations = RUNTIME["spec"]["annotations"]
    assert int(annotations["prometheus.kserve.io/port"]) == config.metrics_port
    assert annotations["prometheus.kserve.io/path"] == "/metrics"


def test_the_runtime_runs_as_the_images_user_with_its_one_writable_path() -> None:
    security = CONTAINER["securityContext"]
    assert f"{security['runAsUser']}:{security['runAsGroup']}" == dict(STAGE)["USER"]
    assert security["runAsNonRoot"] and not security["allowPrivilegeEscalation"]
    assert security["readOnlyRootFilesystem"]  # so the image's writable path is mounted:
    assert image_environment(STAGE)["XDG_CACHE_HOME"].startswith("/tmp/")
    assert "emptyDir" in tmp_volume(CONTAINER, RUNTIME["spec"]["volumes"])


def test_the_images_default_command_serves_the_built_in_repository_on_the_default_ports() -> None:
    config = parse_serve(image_command(STAGE), image_environment(STAGE))
    assert config.model_repository == ()  # the built-in one
    assert config.host == "0.0.0.0"
    exposed = {int(port) for word, rest in STAGE if word == "EXPOSE" for port in rest.split()}
    assert exposed == {config.http_port, config.grpc_port, config.metrics_port}


def test_the_image_runs_as_an_unprivileged_user() -> None:
    user, group = dict(STAGE)["USER"].split(":")
    assert "0" not in (user, group)
    assert re.search(rf"useradd --uid {user} --gid {group}\b", DOCKERFILE)


def test_the_build_context_holds_what_the_dockerfile_copies() -> None:
    """.dockerignore is an allow-list (the context is the repository's root, .venv and the
    peers' environments included): each COPY source must be let through."""
    ignore = (DEPLOY.parent / ".dockerignore").read_text().splitlines()
    allowed = {line[1:] for line in ignore if line.startswith("!")}
    assert "*" in ignore
    copied = 0
    for word, rest in dockerfile_instructions(DOCKERFILE):
        if word == "COPY" and not rest.startswith("--from"):
            *sources, _ = rest.split()
            for source in sources:
                assert source in allowed, f"COPY {source}: left out by .dockerignore"
                assert (DEPLOY.parent / source).exists()
                copied += 1
    assert copied >= 3  # pyproject.toml, README.md (its readme), src


def test_an_argument_tensorgate_does_not_take_fails_the_runtimes_check() -> None:
    with pytest.raises(SystemExit):
        parse_serve(["serve", "--model-repositry=/mnt/models"], {})


def test_the_plain_deployment_serves_its_volume_on_the_ports_its_service_and_probes_name(
) -> None:
    container = POD["spec"]["containers"][0]
    config = parse_serve(container["args"], image_environment(STAGE))
    assert config.model_repository == (pathlib.Path("/models"),) and config.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": config.http_port, "grpc": config.grpc_port,
                     "metrics": config.metrics_port}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container[kind]["httpGet"]
        assert ports[probe["port"]] == config.http_port
        assert_health_route(probe["path"])
    service = PLAIN["Service"]["spec"]
    assert {p["targetPort"] for p in service["ports"]} == set(ports)
    labels = POD["metadata"]["labels"]
    assert service["selector"] == labels == PLAIN["Deployment"]["spec"]["selector"][
        "matchLabels"]
    assert int(POD["metadata"]["annotations"]["prometheus.io/port"]) == config.metrics_port
    # gRPC clients reach pods added later only through retired connections
    assert 0 < config.grpc_max_connection_age_ms <= 600_000
    # preStop's wait and SIGTERM's drain must end before Kubernetes kills the pod
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "/bin/sleep"  # Debian's coreutils: in the image
    assert POD["spec"]["terminationGracePeriodSeconds"] > float(command[1]) + \
        config.drain_timeout_s


def test_the_plain_deployment_runs_as_the_images_user_with_its_one_writable_path() -> None:
    pod_security = POD["spec"]["securityContext"]
    assert f"{pod_security['runAsUser']}:{pod_security['runAsGroup']}" == dict(STAGE)["USER"]
    container = POD["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"]
    assert "emptyDir" in tmp_volume(container, POD["spec"]["volumes"])
    assert next(m for m in container["volumeMounts"] if m["mountPath"] == "/models")["readOnly"]


@pytest.mark.parametrize("container", [CONTAINER, POD["spec"]["containers"][0]],
                         ids=["kserve", "kubernetes"])
def test_a_startup_probe_gives_the_loads_a_deadline(container: dict[str, Any]) -> None:
    """The server is live as soon as it listens, before its models load (server.py), so a
    liveness probe would not restart a slow load; nor would it restart a load that hangs.
    A startup probe on readiness gives the loads 5 minutes, then restarts the pod."""
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/v2/health/ready"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300


SAGEMAKER = final_stage((DEPLOY / "sagemaker" / "Dockerfile").read_text())


def test_the_sagemaker_image_serves_sagemakers_routes_on_its_port_of_every_address() -> None:
    """`docker run IMAGE serve`, as SageMaker starts it: the base image's command and
    variables, then the SageMaker image's, then what SageMaker sets in the container."""
    assert dict(SAGEMAKER)["FROM"] == "${IMAGE}"
    users = [rest for word, rest in SAGEMAKER if word == "USER"]
    assert users[-1] == dict(STAGE)["USER"]  # back to the image's unprivileged user
    environment = {**image_environment(STAGE), **image_environment(SAGEMAKER),
                   "SAGEMAKER_SAFE_PORT_RANGE": "23000-23999"}
    config = parse_serve(["serve"], environment)
    assert config.model_repository == (pathlib.Path("/opt/ml/model"),)
    assert (config.allow_sagemaker, config.sagemaker_address, config.sagemaker_port) == (
        True, "0.0.0.0", 8080)
    assert not (config.allow_http or config.allow_grpc or config.allow_metrics)
    exposed = {int(port) for word, rest in SAGEMAKER if word == "EXPOSE" for port in rest.split()}
    assert exposed == {config.sagemaker_port}
    # an inference pipeline's container is told its port
    moved = parse_serve(["serve"], {**environment, "SAGEMAKER_BIND_TO_PORT": "9090"})
    assert moved.sagemaker_port == 9090
