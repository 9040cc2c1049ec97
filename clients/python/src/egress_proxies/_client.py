"""`Client` and `AsyncClient`: the lease API's calls, as the Rust client makes them.

Each call is one `_Call` (method, path, body, the statuses it expects and how to read them),
built and read by the same functions for both clients; only the sending differs. A `429` is
sent again after its `Retry-After`, at most `MAX_RETRIES` times and within the call's timeout.
The token goes in the `Authorization` header only: never in a `repr`, a log line or an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

import httpx

from ._errors import EgressError, TransportError, Unexpected, from_answer
from ._model import Lease, ProxyView

#: The most times one call is sent again after a `429`.
MAX_RETRIES = 3
#: Each call's budget, retries included, unless the client is given another.
DEFAULT_TIMEOUT = 10.0

Result = Literal["ok", "rate_limited", "banned"]


@dataclass(frozen=True)
class _Call:
    method: str
    path: str
    read: Callable[[int, Any], Any]
    body: dict[str, Any] | None = None
    params: dict[str, str] | None = None


def _segment(s: str) -> str:
    return quote(s, safe="")


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    return float(value) if value.isdigit() else None


def _decoded(response: httpx.Response) -> Any:
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def _read(call: _Call, response: httpx.Response) -> Any:
    """The call's result, or the API's error as its type."""
    body = _decoded(response)
    try:
        return call.read(response.status_code, body)
    except _NotExpected:
        raise from_answer(response.status_code, body, _retry_after(response)) from None
    except (KeyError, TypeError, ValueError):
        # A success that does not match the API: none of the body is kept (a lease answer
        # holds the proxy's password).
        raise Unexpected(
            f"an answer of {len(response.content)} bytes that does not match the API",
            status=response.status_code,
        ) from None


class _NotExpected(Exception):
    """The status is not the call's success."""


def _expect(*statuses: int) -> Callable[[Callable[[int, Any], Any]], Callable[[int, Any], Any]]:
    def wrap(read: Callable[[int, Any], Any]) -> Callable[[int, Any], Any]:
        def checked(status: int, body: Any) -> Any:
            if status not in statuses:
                raise _NotExpected
            return read(status, body)

        return checked

    return wrap


@_expect(200)
def _read_list(_status: int, body: Any) -> list[ProxyView]:
    return [ProxyView.from_json(p) for p in body["proxies"]]


@_expect(200)
def _read_whoami(_status: int, body: Any) -> str:
    return str(body["client"])


@_expect(200, 201)
def _read_lease(status: int, body: Any) -> Lease:
    return Lease.from_json(body, resumed=status == 200)


@_expect(204)
def _read_nothing(_status: int, _body: Any) -> None:
    return None


def _list(healthy: bool | None, selector: Mapping[str, str] | None) -> _Call:
    params = {f"attr.{k}": v for k, v in (selector or {}).items()}
    if healthy is not None:
        params["healthy"] = "true" if healthy else "false"
    return _Call("GET", "/v1/proxies", _read_list, params=params)


def _acquire(
    selector: Mapping[str, str] | None, ttl: float | None, target: str | None, session: str | None
) -> _Call:
    body: dict[str, Any] = {"selector": dict(selector or {})}
    if ttl is not None:
        body["ttlSeconds"] = int(ttl)
    if target is not None:
        body["target"] = target
    if session is not None:
        body["session"] = session
    return _Call("POST", "/v1/leases", _read_lease, body=body)


def _renew(lease_id: str, ttl: float | None) -> _Call:
    body = {} if ttl is None else {"ttlSeconds": int(ttl)}
    return _Call("POST", f"/v1/leases/{_segment(lease_id)}/renew", _read_lease, body=body)


def _release(lease_id: str) -> _Call:
    return _Call("DELETE", f"/v1/leases/{_segment(lease_id)}", _read_nothing)


def _report(path: str, result: Result, target: str | None) -> _Call:
    body: dict[str, Any] = {"result": result}
    if target is not None:
        body["target"] = target
    return _Call("POST", path, _read_nothing, body=body)


class _Base:
    """What both clients hold: the base URL, the token, the budget."""

    def __init__(self, base_url: str, token: str | None, timeout: float) -> None:
        self._base = base_url.rstrip("/")
        self._token = token
        self._timeout = timeout

    @property
    def timeout(self) -> float:
        """Each call's budget, in seconds, retries included."""
        return self._timeout

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._base!r}, token={'<set>' if self._token else None})"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def _wait(self, response: httpx.Response, retries: int, started: float) -> float | None:
        """After a `429`: how long to wait before sending again, or None to give up."""
        if response.status_code != 429 or retries >= MAX_RETRIES:
            return None
        hinted = _retry_after(response)
        wait = 1.0 if hinted is None else hinted
        left = self._timeout - (time.monotonic() - started)
        return wait if wait < left else None


#: The environment variable naming a CA file to trust, when a client is given no `verify`.
CA_FILE_ENV = "EGRESS_CA_FILE"


def _verify(verify: str | bool | None) -> ssl.SSLContext | bool:
    """TLS verification: off for `False`; else the CA file given, or the one `EGRESS_CA_FILE`
    names, or the system's CAs."""
    if verify is False:
        return False
    cafile = verify if isinstance(verify, str) else os.environ.get(CA_FILE_ENV)
    return ssl.create_default_context(cafile=cafile) if cafile else True


def _transport_error(e: httpx.HTTPError) -> TransportError:
    # httpx's messages name the URL, never the headers.
    return TransportError(f"the discovery API did not answer: {type(e).__name__}: {e}")


class Client(_Base):
    """The lease API, blocking. Use it as a context manager, or call `close()`."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        verify: str | bool | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, token, timeout)
        self._http = httpx.Client(timeout=timeout, verify=_verify(verify), transport=transport)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: _Call) -> Any:
        started, retries = time.monotonic(), 0
        while True:
            try:
                response = self._http.request(
                    call.method,
                    self._base + call.path,
                    json=call.body,
                    params=call.params,
                    headers=self._headers(),
                )
            except httpx.HTTPError as e:
                raise _transport_error(e) from None
            wait = self._wait(response, retries, started)
            if wait is None:
                return _read(call, response)
            retries += 1
            time.sleep(wait)

    def list(
        self, *, healthy: bool | None = None, selector: Mapping[str, str] | None = None
    ) -> list[ProxyView]:
        """`GET /v1/proxies`: the proxies this client may see (a pool is the selector key `pool`)."""
        result: list[ProxyView] = self._send(_list(healthy, selector))
        return result

    def whoami(self) -> str:
        """`GET /v1/whoami`: the client name the token belongs to."""
        return str(self._send(_Call("GET", "/v1/whoami", _read_whoami)))

    def acquire(
        self,
        *,
        selector: Mapping[str, str] | None = None,
        ttl: float | None = None,
        target: str | None = None,
        session: str | None = None,
    ) -> Lease:
        """`POST /v1/leases`: a lease on the best proxy for `selector`, resting for `target`."""
        lease: Lease = self._send(_acquire(selector, ttl, target, session))
        return lease

    def renew(self, lease_id: str, ttl: float | None = None) -> Lease:
        lease: Lease = self._send(_renew(lease_id, ttl))
        return lease

    def release(self, lease_id: str) -> None:
        self._send(_release(lease_id))

    def report(self, lease_id: str, result: Result, target: str | None = None) -> None:
        self._send(_report(f"/v1/leases/{_segment(lease_id)}/report", result, target))

    def report_session(self, session: str, result: Result, target: str | None = None) -> None:
        self._send(_report(f"/v1/sessions/{_segment(session)}/report", result, target))

    @contextlib.contextmanager
    def lease(
        self,
        *,
        selector: Mapping[str, str] | None = None,
        ttl: float | None = None,
        target: str | None = None,
        session: str | None = None,
    ) -> Iterator[Lease]:
        """A lease for the `with` block, given back however the block ends."""
        lease = self.acquire(selector=selector, ttl=ttl, target=target, session=session)
        try:
            yield lease
        finally:
            with contextlib.suppress(EgressError):
                self.release(lease.lease_id)


class AsyncClient(_Base):
    """The lease API for asyncio. Use it as an async context manager, or await `aclose()`."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        verify: str | bool | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, token, timeout)
        self._http = httpx.AsyncClient(timeout=timeout, verify=_verify(verify), transport=transport)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: _Call) -> Any:
        started, retries = time.monotonic(), 0
        while True:
            try:
                response = await self._http.request(
                    call.method,
                    self._base + call.path,
                    json=call.body,
                    params=call.params,
                    headers=self._headers(),
                )
            except httpx.HTTPError as e:
                raise _transport_error(e) from None
            wait = self._wait(response, retries, started)
            if wait is None:
                return _read(call, response)
            retries += 1
            await asyncio.sleep(wait)

    async def list(
        self, *, healthy: bool | None = None, selector: Mapping[str, str] | None = None
    ) -> list[ProxyView]:
        result: list[ProxyView] = await self._send(_list(healthy, selector))
        return result

    async def whoami(self) -> str:
        return str(await self._send(_Call("GET", "/v1/whoami", _read_whoami)))

    async def acquire(
        self,
        *,
        selector: Mapping[str, str] | None = None,
        ttl: float | None = None,
        target: str | None = None,
        session: str | None = None,
    ) -> Lease:
        lease: Lease = await self._send(_acquire(selector, ttl, target, session))
        return lease

    async def renew(self, lease_id: str, ttl: float | None = None) -> Lease:
        lease: Lease = await self._send(_renew(lease_id, ttl))
        return lease

    async def release(self, lease_id: str) -> None:
        await self._send(_release(lease_id))

    async def report(self, lease_id: str, result: Result, target: str | None = None) -> None:
        await self._send(_report(f"/v1/leases/{_segment(lease_id)}/report", result, target))

    async def report_session(self, session: str, result: Result, target: str | None = None) -> None:
        await self._send(_report(f"/v1/sessions/{_segment(session)}/report", result, target))

    @contextlib.asynccontextmanager
    async def lease(
        self,
        *,
        selector: Mapping[str, str] | None = None,
        ttl: float | None = None,
        target: str | None = None,
        session: str | None = None,
    ) -> AsyncIterator[Lease]:
        """A lease for the `async with` block, given back however the block ends."""
        lease = await self.acquire(selector=selector, ttl=ttl, target=target, session=session)
        try:
            yield lease
        finally:
            with contextlib.suppress(EgressError):
                await self.release(lease.lease_id)


__all__ = ["DEFAULT_TIMEOUT", "MAX_RETRIES", "AsyncClient", "Client", "Result"]
