"""The clients against a scripted API (httpx's MockTransport): each call's request, each error
code's type, the 429 retry, the lease context, and that the token and a lease's password
appear in no repr and no error."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from egress_proxies import AsyncClient, Client, errors

TOKEN = "tok-python-sentinel"
PASSWORD = "proxy-pass-sentinel"

LEASE = {
    "leaseID": "L1",
    "proxy": {
        "id": "ns/eu-1",
        "ip": "10.0.0.7",
        "port": 3128,
        "phase": "Ready",
        "healthy": True,
        "latencyMillis": 12,
        "activeLeases": 1,
        "maxLeases": 5,
        "attributes": {"geo": "eu"},
        "username": "u1",
        "password": PASSWORD,
        "url": f"http://u1:{PASSWORD}@10.0.0.7:3128",
    },
    "expiresAt": "2026-12-07T10:00:00Z",
    "ttlSeconds": 300,
}

Handler = Callable[[httpx.Request], httpx.Response]


def client(handler: Handler) -> Client:
    return Client("http://api.test", TOKEN, transport=httpx.MockTransport(handler))


def error(status: int, code: str, **more: Any) -> httpx.Response:
    return httpx.Response(status, json={"error": code, "message": f"the {code} message", **more})


def test_acquire_sends_the_request_and_reads_the_lease() -> None:
    seen: list[httpx.Request] = []

    def handler(r: httpx.Request) -> httpx.Response:
        seen.append(r)
        return httpx.Response(201, json=LEASE)

    lease = client(handler).acquire(
        selector={"geo": "eu"}, ttl=60, target="example.com", session="s1"
    )
    assert (seen[0].method, seen[0].url.path) == ("POST", "/v1/leases")
    assert seen[0].headers["authorization"] == f"Bearer {TOKEN}"
    assert json.loads(seen[0].content) == {
        "selector": {"geo": "eu"},
        "ttlSeconds": 60,
        "target": "example.com",
        "session": "s1",
    }
    assert (lease.lease_id, lease.proxy.id, lease.resumed) == ("L1", "ns/eu-1", False)
    assert lease.proxy.proxy_url == f"http://u1:{PASSWORD}@10.0.0.7:3128"
    assert PASSWORD not in repr(lease), repr(lease)


@pytest.mark.parametrize(
    ("answer", "kind", "check"),
    [
        (error(401, "unauthorized"), errors.Unauthorized, None),
        (error(400, "invalid_ttl"), errors.InvalidRequest, ("field", "ttl")),
        (error(400, "invalid_session"), errors.InvalidRequest, ("field", "session")),
        (error(400, "invalid_target"), errors.InvalidRequest, ("field", "target")),
        (error(400, "invalid_body"), errors.InvalidRequest, ("field", "body")),
        (
            error(409, "no_match", considered=3, atCapacity=2, inCooldown=1),
            errors.NoMatch,
            ("at_capacity", 2),
        ),
        (error(409, "too_many_sessions"), errors.TooManySessions, None),
        (error(409, "not_renewable"), errors.NotRenewable, None),
        (error(404, "unknown_lease"), errors.UnknownLease, None),
        (error(404, "unknown_session"), errors.UnknownSession, None),
        (error(404, "not_found"), errors.NotFound, None),
        (error(503, "store_unavailable"), errors.Unavailable, ("code", "store_unavailable")),
        (error(500, "internal"), errors.ServerError, None),
        (httpx.Response(502, text="<html>bad gateway</html>"), errors.Unexpected, ("status", 502)),
    ],
)
def test_each_error_code_is_its_type(
    answer: httpx.Response, kind: type, check: tuple[str, Any] | None
) -> None:
    with pytest.raises(kind) as raised:
        client(lambda _r: answer).acquire()
    if check is not None:
        assert getattr(raised.value, check[0]) == check[1]
    assert TOKEN not in str(raised.value) and TOKEN not in repr(raised.value)


def test_a_429_is_sent_again_after_its_retry_after_then_given_up() -> None:
    answers = [
        httpx.Response(
            429, headers={"Retry-After": "0"}, json={"error": "rate_limited", "message": "m"}
        )
    ]
    calls = []

    def handler(r: httpx.Request) -> httpx.Response:
        calls.append(r)
        return answers.pop(0) if answers else httpx.Response(201, json=LEASE)

    assert client(handler).acquire().lease_id == "L1"
    assert len(calls) == 2
    always = httpx.Response(
        429, headers={"Retry-After": "0"}, json={"error": "rate_limited", "message": "m"}
    )
    counted: list[int] = []

    def refusing(_r: httpx.Request) -> httpx.Response:
        counted.append(1)
        return always

    with pytest.raises(errors.RateLimited):
        client(refusing).acquire()
    assert len(counted) == 4, "the first call and three more"


def test_the_lease_context_gives_the_lease_back_however_the_block_ends() -> None:
    released: list[str] = []

    def handler(r: httpx.Request) -> httpx.Response:
        if r.method == "DELETE":
            released.append(r.url.path)
            return httpx.Response(204)
        return httpx.Response(201, json=LEASE)

    api = client(handler)
    with pytest.raises(RuntimeError), api.lease(target="example.com"):
        raise RuntimeError("the crawl failed")
    assert released == ["/v1/leases/L1"]


def test_reports_name_the_lease_or_the_session() -> None:
    seen: list[tuple[str, Any]] = []

    def handler(r: httpx.Request) -> httpx.Response:
        seen.append((r.url.raw_path.decode(), json.loads(r.content)))
        return httpx.Response(204)

    api = client(handler)
    api.report("L1", "banned", "example.com")
    api.report_session("login 7", "rate_limited")
    assert seen == [
        ("/v1/leases/L1/report", {"result": "banned", "target": "example.com"}),
        ("/v1/sessions/login%207/report", {"result": "rate_limited"}),
    ]


def test_no_answer_is_a_transport_error_without_the_token() -> None:
    def handler(_r: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    with pytest.raises(errors.TransportError) as raised:
        client(handler).list()
    assert TOKEN not in str(raised.value)
    assert TOKEN not in repr(client(handler))


async def test_the_async_client_does_the_same() -> None:
    def handler(r: httpx.Request) -> httpx.Response:
        if r.url.path == "/v1/proxies":
            return httpx.Response(200, json={"count": 1, "proxies": [LEASE["proxy"]]})
        if r.method == "DELETE":
            return httpx.Response(204)
        return httpx.Response(201, json=LEASE)

    async with AsyncClient("http://api.test", TOKEN, transport=httpx.MockTransport(handler)) as api:
        proxies = await api.list(selector={"pool": "blue"}, healthy=True)
        assert [p.id for p in proxies] == ["ns/eu-1"]
        async with api.lease(target="example.com") as lease:
            assert lease.proxy.username == "u1"
