"""How a request target becomes a handler: the path taken without parse_url when it is bare,
and routes looked up once routed (both on every request, so both shortcuts)."""

from __future__ import annotations

import urllib.parse

import httptools
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate.network import http_routes
from tensorgate.network.http_parsing import url_path
from tensorgate.network.http_routes import route

# what a request line's target may hold (httptools refuses the rest before on_url)
TARGET_BYTES = st.binary(max_size=40).map(
    lambda b: bytes(c for c in b if 33 <= c < 127))


@settings(max_examples=500, deadline=None)
@given(tail=TARGET_BYTES, absolute=st.booleans())
def test_a_target_s_path_is_what_parse_url_gives(tail: bytes, absolute: bool) -> None:
    url = (b"http://127.0.0.1:8000/" if absolute else b"/") + tail
    try:
        expected = httptools.parse_url(url).path.decode("latin-1")
    except httptools.HttpParserInvalidURLError:
        return
    assert url_path(url) == expected


def test_queries_and_fragments_are_cut_from_the_path() -> None:
    assert url_path(b"/v2/models/m/infer?x=1") == "/v2/models/m/infer"
    assert url_path(b"/v2/health/ready#top") == "/v2/health/ready"
    assert url_path(b"/v2/models/m/infer") == "/v2/models/m/infer"


def test_a_routed_path_is_routed_alike_again_and_refusals_are_not_kept() -> None:
    http_routes._routed.clear()
    first = route("POST", "/v2/models/m/versions/3/infer")
    assert route("POST", "/v2/models/m/versions/3/infer") == first
    assert first[1] == ("m", "3")
    assert route("GET", "/v2/models/m/infer")[0] == 405  # the method is part of the key
    assert route("GET", "/v2/nothing/here")[0] == 404
    assert list(http_routes._routed) == [("POST", "/v2/models/m/versions/3/infer")]


def test_what_routing_keeps_is_bounded() -> None:
    http_routes._routed.clear()
    for n in range(3 * http_routes._ROUTED_KEPT):
        handler, args = route("POST", f"/v2/models/m{n}/infer")
        assert args == (f"m{n}", "")
        assert len(http_routes._routed) <= http_routes._ROUTED_KEPT


@settings(max_examples=300, deadline=None)
@given(name=st.text(min_size=1, max_size=20).filter(
    lambda n: "/" not in n and n.strip("/") == n and not any(
        0xD800 <= ord(c) <= 0xDFFF for c in n)))
def test_a_name_quoted_as_tritonclient_quotes_it_is_routed_as_itself(name: str) -> None:
    quoted = urllib.parse.quote(name)
    assert route("POST", f"/v2/models/{quoted}/versions/2/infer")[1] == (name, "2")
    assert route("POST", f"/v2/systemsharedmemory/region/{quoted}/register")[1] == (name,)


def test_a_segment_that_is_not_percent_encoded_utf8_is_refused_by_name() -> None:
    assert route("GET", "/v2/models/caf%E9/ready") == (
        400, "the path segment 'caf%E9' is not percent-encoded UTF-8")
    assert route("GET", "/v2/models/%ED%A0%80/ready")[0] == 400  # a surrogate's bytes
    assert route("GET", "/v2/models/100%/ready")[1] == ("100%", "")  # not an escape: kept
    assert route("GET", "/v2/models/a%2Fb/ready")[1] == ("a/b", "")  # a name's, not a split
    assert route("GET", "/v2%2Fhealth/live")[0] == 404
