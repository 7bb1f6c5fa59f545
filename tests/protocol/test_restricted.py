"""Restrictions as the command line gives them, and every API in a group: a handler or method
left out of API_GROUP could never be restricted."""

from __future__ import annotations

import inspect

import pytest

from tensorgate.network import grpc_methods, http_routes
from tensorgate.protocol.restricted import API_GROUPS, GRPC_PREFIX, parse_restrictions, refusal


def test_restrictions_name_their_header_per_api_group() -> None:
    assert parse_restrictions(" model-repository , trace:Admin-Key=s3cret ; inference:k=v") == {
        "model-repository": ("admin-key", "s3cret"), "trace": ("admin-key", "s3cret"),
        "inference": ("k", "v")}
    assert parse_restrictions("logging:k=v", GRPC_PREFIX) == {
        "logging": ("triton-grpc-protocol-k", "v")}
    assert parse_restrictions("") == {}


@pytest.mark.parametrize("text, message", [
    ("trace", "^restriction 'trace' is not API\\[,API...\\]:KEY=VALUE"),
    ("trace:=v", "an empty key or value would let every request through\\)$"),
    ("trace,,logging:k=v", "^restriction 'trace,,logging:k=v': unknown API ''; APIs are: "),
    ("trace:k=v;logging,trace:j=w", "API 'trace' is already restricted; an API may be in "
                                    "one restriction only$"),
])
def test_wrong_restrictions_are_refused_saying_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_restrictions(text)


def test_the_header_must_carry_exactly_the_value() -> None:
    needed = ("admin-key", "s3cret")
    assert refusal("trace", needed, "s3cret") is None
    for given in (None, "", "S3CRET", "s3cret ", "s3cre"):
        assert refusal("trace", needed, given) == ("the trace API is restricted: send the "
                                                   "header 'admin-key' with its value")


def test_every_http_handler_is_in_an_api_group() -> None:
    handlers = [f for f in vars(http_routes).values() if inspect.iscoroutinefunction(f)
                and list(inspect.signature(f).parameters)[:2] == ["dp", "request"]]
    assert len(handlers) >= 18
    assert all(http_routes.API_GROUP.get(h) in API_GROUPS for h in handlers)


def test_every_grpc_method_is_in_an_api_group() -> None:
    methods = {path.rsplit("/", 1)[-1] for path in grpc_methods.UNARY}
    methods |= {"ModelInfer", "ModelStreamInfer"}
    assert all(grpc_methods.API_GROUP.get(m) in API_GROUPS for m in methods)
