"""Restricted APIs (Triton's `--http-restricted-api` / `--grpc-restricted-protocol`): a group
of APIs served only to requests that carry a header with a given value — so that, say, any
client may infer but only an operator's tooling may load models, change log or trace
settings, or register shared memory.

A restriction is written `API[,API...]:KEY=VALUE`, several joined by ";". Over HTTP the header
is KEY; over gRPC it is the metadata `triton-grpc-protocol-KEY`, as in Triton, so clients
and proxies set up for Triton work unchanged. An API is in at most one restriction.
"""

from __future__ import annotations

import hmac

__all__ = ["API_GROUPS", "GRPC_PREFIX", "Restrictions", "parse_restrictions", "refusal"]

API_GROUPS = ("health", "metadata", "inference", "shared-memory", "model-config",
              "model-repository", "statistics", "trace", "logging")
GRPC_PREFIX = "triton-grpc-protocol-"

# API group → (header name, lower case; the value it must carry)
Restrictions = dict[str, tuple[str, str]]


def parse_restrictions(text: str, header_prefix: str = "") -> Restrictions:
    """`API[,API...]:KEY=VALUE[;...]` → the header each restricted API group needs. Raises
    ValueError saying what is wrong."""
    found: Restrictions = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        apis, colon, rule = part.partition(":")
        key, equals, value = rule.partition("=")
        key = key.strip().lower()
        if not colon or not equals or not key or not value:
            raise ValueError(f"restriction '{part}' is not API[,API...]:KEY=VALUE (an empty "
                             "key or value would let every request through)")
        for api in (a.strip() for a in apis.split(",")):
            if api not in API_GROUPS:
                raise ValueError(f"restriction '{part}': unknown API '{api}'; APIs are: "
                                 f"{', '.join(API_GROUPS)}")
            if api in found:
                raise ValueError(f"restriction '{part}': API '{api}' is already restricted; "
                                 "an API may be in one restriction only")
            found[api] = (header_prefix + key, value)
    return found


def refusal(group: str, needed: tuple[str, str], given: str | None) -> str | None:
    """Why a request to an API of `group` is refused, or None when its header (`given`: the
    value it carries, None without one) lets it through."""
    header, value = needed
    if given is not None and hmac.compare_digest(given.encode(), value.encode()):
        return None
    return f"the {group} API is restricted: send the header '{header}' with its value"
