"""ServerConfig: the same settings from the CLI's values and TENSORGATE_* variables, and
validation that says what to change."""

from __future__ import annotations

import os
import pathlib

import pytest

from tensorgate.config import ServerConfig


def test_environment_and_overrides_build_the_same_config() -> None:
    config = ServerConfig.from_env({"TENSORGATE_HOST_POOL_BYTES": str(256 << 20),
                                    "TENSORGATE_HTTP_PORT": "9000"}, grpc_port=9001)
    assert (config.host_pool_bytes, config.http_port, config.grpc_port) == (256 << 20, 9000,
                                                                            9001)
    assert config.host == "127.0.0.1"  # bound to loopback unless told otherwise


def test_the_pool_must_hold_the_largest_request() -> None:
    with pytest.raises(ValueError, match=r"^host_pool_bytes \(1048576\) must be at least "
                                         r"max_request_bytes \(2097152\): a request of the "
                                         r"largest size allowed could never be received$"):
        ServerConfig(host_pool_bytes=1 << 20, max_request_bytes=2 << 20)


def test_unknown_setting_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"^unknown setting 'pool'; settings are: .*"
                                         r"host_pool_bytes"):
        ServerConfig.from_mapping({"pool": "1"})


def test_model_control_defaults_to_none_and_load_models_needs_explicit() -> None:
    assert ServerConfig().model_control_mode == "none"  # the load/unload API is off
    config = ServerConfig.from_env({"TENSORGATE_MODEL_CONTROL_MODE": "explicit",
                                    "TENSORGATE_LOAD_MODELS": "a, b"})
    assert config.load_models == ("a", "b")
    with pytest.raises(ValueError, match=r"^load_models \(--load-model\) needs "
                                         r"model_control_mode explicit"):
        ServerConfig(load_models=("a",))
    with pytest.raises(ValueError, match=r"^load_models '\*' \(every model\) must be the only"):
        ServerConfig(model_control_mode="explicit", load_models=("*", "a"))
    with pytest.raises(ValueError, match=r"^model_control_mode must be none, explicit or poll"):
        ServerConfig.from_mapping({"model_control_mode": "always"})


def test_model_upload_is_off_and_needs_the_explicit_model_control_mode() -> None:
    assert ServerConfig().allow_model_upload is False  # uploaded files are code it runs
    assert ServerConfig(model_control_mode="explicit", allow_model_upload=True
                        ).allow_model_upload
    for mode in ("none", "poll"):
        with pytest.raises(ValueError, match=r"^allow_model_upload \(--allow-model-upload\) "
                                             r"needs model_control_mode explicit"):
            ServerConfig(model_control_mode=mode, allow_model_upload=True)
    with pytest.raises(ValueError, match=r"^repository_poll_s must be above 0"):
        ServerConfig(model_control_mode="poll", repository_poll_s=0)


def test_cli_takes_tritons_model_control_flags() -> None:
    from tensorgate.cli import _parser
    args = vars(_parser().parse_args(
        ["serve", "--model-store", "/models", "--model-control-mode", "explicit",
         "--load-model", "a", "--load-model", "b"]))
    args.pop("command")
    config = ServerConfig.from_env({}, **args)
    assert config.model_repository == (pathlib.Path("/models"),)
    assert config.load_models == ("a", "b")


def test_model_repository_may_be_given_more_than_once(tmp_path: pathlib.Path) -> None:
    """Triton's --model-repository repeated, or os.pathsep-joined in the variable; one folder
    named twice (however written) would put every model of it in two repositories."""
    from tensorgate.cli import _parser
    args = vars(_parser().parse_args(["serve", "--model-repository", "/a",
                                      "--model-store", "/b"]))
    args.pop("command")
    assert ServerConfig.from_env({}, **args).model_repository == (
        pathlib.Path("/a"), pathlib.Path("/b"))
    from_env = ServerConfig.from_env({"TENSORGATE_MODEL_REPOSITORY": f"/a,1{os.pathsep}/b"})
    assert from_env.model_repository == (pathlib.Path("/a,1"), pathlib.Path("/b"))
    # a URI is one repository, not "s3" and "//bucket" (said not to be read, at start)
    uri = ServerConfig.from_env({"TENSORGATE_MODEL_REPOSITORY": f"s3://b/m{os.pathsep}/c"})
    assert uri.model_repository == (pathlib.Path("s3://b/m"), pathlib.Path("/c"))
    assert ServerConfig(model_repository=tmp_path).model_repository == (tmp_path,)  # one path
    assert ServerConfig().model_repository == ()
    with pytest.raises(ValueError, match=r"^model_repository names '.*models' and "
                                         r"'.*models/sub/\.\.', the same folder: every model"):
        ServerConfig(model_repository=(tmp_path / "models", tmp_path / "models" / "sub" / ".."))


def test_header_forward_patterns_are_regular_expressions() -> None:
    from tensorgate.cli import _parser
    args = vars(_parser().parse_args(["serve", "--http-header-forward-pattern", "^x-",
                                      "--grpc-header-forward-pattern", "tenant"]))
    args.pop("command")
    config = ServerConfig.from_env({}, **args)
    assert (config.http_header_forward_pattern, config.grpc_header_forward_pattern) == (
        "^x-", "tenant")
    with pytest.raises(ValueError, match=r"^grpc_header_forward_pattern is not a regular "
                                         r"expression: "):
        ServerConfig(grpc_header_forward_pattern="x-(")


def test_the_open_files_limit_is_raised_to_fit_the_connections() -> None:
    resource = pytest.importorskip("resource")
    from tensorgate.server_parts import FILES_BESIDE_CONNECTIONS, fit_open_files
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 100 + FILES_BESIDE_CONNECTIONS
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the hard open-files limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted - 50, hard))
    try:
        assert fit_open_files(100) == 100
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == wanted
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_log_level_and_cache_size_are_checked() -> None:
    with pytest.raises(ValueError, match=r"^log_level must be DEBUG, INFO, WARNING, ERROR or "
                                         r"CRITICAL, got 'LOUD'$"):
        ServerConfig(log_level="LOUD")
    with pytest.raises(ValueError, match=r"^response_cache_bytes must be 0 \(no cache\) or "
                                         r"more, got -1$"):
        ServerConfig.from_env({"TENSORGATE_RESPONSE_CACHE_BYTES": "-1"})
    assert ServerConfig(log_level="debug").log_level == "debug"


def test_each_protocol_binds_host_unless_given_its_own_address() -> None:
    config = ServerConfig(host="10.0.0.5")
    assert (config.http_address, config.grpc_address, config.metrics_address) == (
        "10.0.0.5", "10.0.0.5", "10.0.0.5")
    # the metrics follow the HTTP address unless given theirs (Triton's rule)
    config = ServerConfig(http_address="127.0.0.2", grpc_address="::1")
    assert (config.http_address, config.grpc_address, config.metrics_address) == (
        "127.0.0.2", "::1", "127.0.0.2")
    assert ServerConfig(http_address="127.0.0.2",
                        metrics_address="127.0.0.3").metrics_address == "127.0.0.3"
    with pytest.raises(ValueError, match=r"^grpc_address must be an IP address or "
                                         r"'localhost', got 'example.com'$"):
        ServerConfig(grpc_address="example.com")


def test_one_protocol_at_least_must_be_served() -> None:
    config = ServerConfig.from_env({"TENSORGATE_ALLOW_GRPC": "false"})
    assert (config.allow_http, config.allow_grpc) == (True, False)
    with pytest.raises(ValueError, match=r"^allow_http and allow_grpc are both false: the "
                                         r"server would serve nothing"):
        ServerConfig(allow_http=False, allow_grpc=False)


def test_sagemaker_settings_come_from_tritons_variables_and_are_checked() -> None:
    config = ServerConfig.from_env({"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "resnet",
                                    "SAGEMAKER_TRITON_INFERENCE_TYPE": "generate",
                                    "SAGEMAKER_TRITON_PING_MODE": "live"},
                                   allow_sagemaker=True, allow_http=False, allow_grpc=False)
    assert (config.sagemaker_model, config.sagemaker_inference_type,
            config.sagemaker_ping_mode, config.sagemaker_port) == ("resnet", "generate", "live",
                                                                   8080)
    # loopback unless told otherwise: the HTTP address's, or its own
    assert (config.sagemaker_address, ServerConfig(
        http_address="10.0.0.5", sagemaker_address="0.0.0.0").sagemaker_address) == (
        "127.0.0.1", "0.0.0.0")
    with pytest.raises(ValueError, match=r"sagemaker_inference_type \(SAGEMAKER_TRITON_"
                                         r"INFERENCE_TYPE\) must be infer, generate, "
                                         r"generate_stream, got 'predict'"):
        ServerConfig.from_env({"SAGEMAKER_TRITON_INFERENCE_TYPE": "predict"})
    with pytest.raises(ValueError, match=r"sagemaker_ping_mode .* must be ready or live"):
        ServerConfig(sagemaker_ping_mode="healthy")


def test_the_sagemaker_safe_port_range_holds_every_other_port() -> None:
    """SageMaker's SAGEMAKER_SAFE_PORT_RANGE: the ports beside 8080 must lie in it."""
    inside = dict(http_port=23000, grpc_port=23001, metrics_port=23999)
    config = ServerConfig(allow_sagemaker=True, sagemaker_safe_port_range="23000-23999",
                          **inside)
    assert config.sagemaker_port == 8080
    with pytest.raises(ValueError, match=r"^metrics_port 8002 is outside the SageMaker safe "
                                         r"port range 23000-23999 .*--allow-metrics false"):
        ServerConfig(allow_sagemaker=True, sagemaker_safe_port_range="23000-23999",
                     **{**inside, "metrics_port": 8002})
    ServerConfig(allow_sagemaker=True, sagemaker_safe_port_range="23000-23999",
                 **{**inside, "metrics_port": 8002}, allow_metrics=False)  # off: not held
    for bad in ("23000", "23999-23000", "a-b", "1-70000"):
        with pytest.raises(ValueError, match=r"sagemaker_safe_port_range must be LOW-HIGH"):
            ServerConfig(sagemaker_safe_port_range=bad)


def test_sagemaker_alone_is_something_to_serve() -> None:
    config = ServerConfig(allow_http=False, allow_grpc=False, allow_sagemaker=True)
    assert config.allow_sagemaker


def test_a_multi_model_endpoint_is_sagemakers_variable_and_not_polled() -> None:
    config = ServerConfig.from_env({"SAGEMAKER_MULTI_MODEL": "true",
                                    "TENSORGATE_SAGEMAKER_MODELS_ROOT": "/srv/models"})
    assert (config.sagemaker_multi_model, config.sagemaker_models_root) == (
        True, pathlib.Path("/srv/models"))
    assert ServerConfig().sagemaker_models_root == pathlib.Path("/opt/ml/models")
    with pytest.raises(ValueError, match=r"model_control_mode poll would follow the "
                                         r"repository instead"):
        ServerConfig(sagemaker_multi_model=True, model_control_mode="poll")


def test_a_load_is_tried_again_a_count_of_times_not_below_none() -> None:
    assert ServerConfig().model_load_retry_count == 0
    assert ServerConfig.from_env({"TENSORGATE_MODEL_LOAD_RETRY_COUNT": "2"}
                                 ).model_load_retry_count == 2
    with pytest.raises(ValueError, match=r"^model_load_retry_count must be 0 or more, got -1$"):
        ServerConfig(model_load_retry_count=-1)


def test_flood_probation_is_a_minute_by_default_and_may_be_turned_off() -> None:
    from tensorgate.cli import parse_serve
    assert ServerConfig().grpc_flood_probation_s == 60.0
    assert parse_serve(["serve", "--grpc-flood-probation-s", "0"]).grpc_flood_probation_s == 0
    assert ServerConfig.from_env({"TENSORGATE_GRPC_FLOOD_PROBATION_S": "5.5"}
                                 ).grpc_flood_probation_s == 5.5
    with pytest.raises(ValueError, match=r"^grpc_flood_probation_s must be 0 \(never\) or "
                                         r"more, got -1"):
        ServerConfig(grpc_flood_probation_s=-1)
