"""SageMaker's routes (network/sagemaker_routes.py) by themselves: what each path and method
routes to, and the binary Content-Type read from any header a client may send."""

from __future__ import annotations

import json
import pathlib

from hypothesis import given, settings
from hypothesis import strategies as st
import pytest

from tensorgate.errors import InvalidArgumentError
from tensorgate.network.http_request import HttpRequest
from tensorgate.network.sagemaker_models import _load_body
from tensorgate.network.sagemaker_routes import BINARY_CONTENT_TYPE, sagemaker_routes
from tensorgate.protocol.restricted import API_GROUPS


def test_each_path_and_method() -> None:
    routes = sagemaker_routes("resnet", "generate", "live")
    ping, arguments = routes.route("GET", "/ping")
    assert arguments == ("live",) and routes.api_group[ping] == "health"
    invocations, arguments = routes.route("POST", "/invocations")
    assert arguments == ("resnet", "generate") and routes.api_group[invocations] == "inference"
    assert routes.route("POST", "/ping") == (405, "use GET")
    assert routes.route("PUT", "/invocations") == (405, "use POST")
    assert routes.route("GET", "/models")[0] == 404
    assert routes.route("POST", "/v2/models/resnet/infer") == (
        404, "no route for /v2/models/resnet/infer: SageMaker's are GET /ping and POST "
             "/invocations")
    assert set(routes.api_group.values()) <= set(API_GROUPS)


def test_a_multi_model_endpoints_routes() -> None:
    routes = sagemaker_routes("", models_root=pathlib.Path("/opt/ml/models"))
    for method, path, arguments, group in (
            ("GET", "/models", (), "model-repository"),
            ("POST", "/models", (), "model-repository"),
            ("GET", "/models/h1", ("h1",), "model-repository"),
            ("DELETE", "/models/h1", ("h1",), "model-repository"),
            ("POST", "/models/h1/invoke", ("h1",), "inference")):
        handler, found = routes.route(method, path)
        assert found == arguments and routes.api_group[handler] == group, (method, path)
    assert routes.route("PUT", "/models") == (405, "use GET or POST")
    assert routes.route("POST", "/models/h1") == (405, "use GET or DELETE")
    assert routes.route("GET", "/models/h1/invoke") == (405, "use POST")
    assert routes.route("GET", "/models/h1/x/y")[0] == 404
    single = sagemaker_routes("m")  # one model's endpoint: the routes are not there
    assert single.route("GET", "/models")[0] == 404


def test_unknown_modes_are_refused() -> None:
    with pytest.raises(ValueError, match="inference type must be one of infer, generate, "
                                         "generate_stream, got 'predict'"):
        sagemaker_routes("m", "predict")
    with pytest.raises(ValueError, match="ping mode must be ready or live"):
        sagemaker_routes("m", "infer", "healthy")


def test_the_binary_content_type_gives_the_jsons_length() -> None:
    length = sagemaker_routes("m").json_length
    assert length({"content-type": "application/json", "content-length": "10"}) is None
    assert length({}) is None
    assert length({"content-type": f"{BINARY_CONTENT_TYPE}57", "content-length": "90"}) == 57
    # media types are not case-sensitive; the size is read as sent
    assert length({"content-type": f"{BINARY_CONTENT_TYPE.upper()}0"}) == 0
    for wrong, said in ((f"{BINARY_CONTENT_TYPE}", "must be the JSON's length"),
                        (f"{BINARY_CONTENT_TYPE}-3", "must be the JSON's length"),
                        (f"{BINARY_CONTENT_TYPE}91", "exceeds the 90-byte body"),
                        (f"x/y;{BINARY_CONTENT_TYPE}5", "must start with")):
        with pytest.raises(InvalidArgumentError, match=said):
            length({"content-type": wrong, "content-length": "90"})


@settings(max_examples=500, deadline=None)
@given(content_type=st.one_of(st.text(max_size=120), st.builds(
           lambda prefix, size: prefix + BINARY_CONTENT_TYPE + size,
           st.sampled_from(["", " ", "text/plain;"]), st.text(max_size=12))),
       content_length=st.one_of(st.none(), st.integers(0, 1 << 20).map(str)))
def test_any_content_type_is_a_length_within_the_body_or_a_named_refusal(
        content_type: str, content_length: str | None) -> None:
    headers = {"content-type": content_type}
    if content_length is not None:
        headers["content-length"] = content_length
    try:
        found = sagemaker_routes("m").json_length(headers)
    except InvalidArgumentError as error:
        assert "Content-Type" in error.message
        return
    assert found is None or (found >= 0 and (content_length is None
                                             or found <= int(content_length)))


@settings(max_examples=300, deadline=None)
@given(body=st.one_of(st.binary(max_size=200), st.builds(
    lambda value: json.dumps(value).encode(), st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["model_name", "url", "x"]), inner, max_size=3),
        max_leaves=8))))
def test_any_multi_model_load_body_is_a_name_and_url_or_a_named_refusal(body: bytes) -> None:
    request = HttpRequest(1 << 20, lambda n: None)  # type: ignore[arg-type,return-value]
    request.body, request.length = bytearray(body), len(body)
    try:
        name, url = _load_body(request)
    except InvalidArgumentError as error:
        assert error.message
        return
    assert isinstance(name, str) and isinstance(url, str) and name and url
