"""An httpx transport that sends each request through a leased egress proxy, for scripts that
are not Scrapy: leases per destination host as the Scrapy middleware does.

```python
async with AsyncClient(API, TOKEN) as api:
    async with httpx.AsyncClient(transport=LeasingTransport(api, selector={"geo": "eu"})) as http:
        page = await http.get("http://example.com/")
```

A ban status (403 and 429 unless told otherwise) or a failure to reach the site through the
proxy is reported for the host on the lease that served it, the lease is given back, and the
request is sent again through another proxy, up to `max_retries` times, when its body can be
sent again (not a stream). Closing the httpx client gives every lease back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import httpx

from ._client import AsyncClient, Result
from ._hosts import DEFAULT_NO_MATCH_WAIT, HostLeases, ban_result, target_of
from ._model import Lease

#: A failure that means the proxy could not serve: it did not answer, or could not connect.
_PROXY_FAILURES = (httpx.ConnectError, httpx.ConnectTimeout)


class LeasingTransport(httpx.AsyncBaseTransport):
    """Sends each request through the proxy leased for its host (`api` leases them)."""

    def __init__(
        self,
        api: AsyncClient,
        *,
        selector: Mapping[str, str] | None = None,
        ttl: float | None = None,
        max_leases: int = 16,
        ban_statuses: Iterable[int] = (403, 429),
        max_retries: int = 3,
        no_match_wait: float = DEFAULT_NO_MATCH_WAIT,
    ) -> None:
        self.leases = HostLeases(
            api, selector=selector, ttl=ttl, max_leases=max_leases, no_match_wait=no_match_wait
        )
        self._ban_statuses = frozenset(ban_statuses)
        self._max_retries = max_retries
        # One connection pool per leased proxy, by lease id.
        self._through: dict[str, httpx.AsyncHTTPTransport] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        target = target_of(str(request.url))
        replayable = isinstance(request.stream, httpx.ByteStream)
        attempt = 0
        while True:
            lease = await self.leases.take(target)
            last = attempt >= self._max_retries or not replayable
            try:
                response = await self._pool(lease).handle_async_request(request)
            except _PROXY_FAILURES:
                await self._dropped(target, lease, "banned")
                if last:
                    raise
                attempt += 1
                continue
            await self.leases.done(target, lease)
            if response.status_code not in self._ban_statuses:
                return response
            await self._dropped(target, lease, ban_result(response.status_code))
            if last:
                return response
            await response.aclose()
            attempt += 1

    async def aclose(self) -> None:
        await self.leases.close()
        pools, self._through = list(self._through.values()), {}
        for pool in pools:
            await pool.aclose()

    def _pool(self, lease: Lease) -> httpx.AsyncHTTPTransport:
        pool = self._through.get(lease.lease_id)
        if pool is None:
            self._forget_unheld()
            pool = httpx.AsyncHTTPTransport(proxy=lease.proxy.proxy_url, trust_env=False)
            self._through[lease.lease_id] = pool
        return pool

    def _forget_unheld(self) -> None:
        """Bounds the pools: past twice the lease cap, those of leases no longer held are
        dropped (their connections close as the garbage collector takes them; a request still
        on one finishes first)."""
        if len(self._through) < 2 * self.leases.max_leases:
            return
        held = self.leases.held_ids()
        self._through = {k: v for k, v in self._through.items() if k in held}

    async def _dropped(self, target: str, lease: Lease, result: Result) -> None:
        """Reports `lease`'s proxy for `target` and gives the lease back."""
        await self.leases.done(target, lease)
        await self.leases.ban(target, lease, result)


__all__ = ["LeasingTransport"]
