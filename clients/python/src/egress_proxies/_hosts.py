"""Leases per destination host, for the Scrapy middleware and the httpx transport.

Each host gets one lease with the host as its `target`, so the API's per-target cooldowns
apply; the lease serves every request to that host while it lives and is not banned, and is
renewed when it has less than a third of its TTL left. At most `max_leases` are held: a new
host takes the place of the least recently used idle one, or waits (within the API budget)
for one to go idle. A ban is reported on the lease that served it, for that host, and the
lease given back; the host's next request leases again, and the API then chooses another
proxy, the banned one cooling down for the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ._client import AsyncClient, Result
from ._errors import EgressError, NoMatch, NotRenewable, UnknownLease
from ._model import Lease

log = logging.getLogger("egress_proxies")

#: How long a host's request waits for a proxy when every matching one is busy or cooling
#: down, unless told otherwise: a fleet with none matching at all fails at once.
DEFAULT_NO_MATCH_WAIT = 30.0


#: How many of the leases granted are remembered (`HostLeases.granted`).
GRANTED_KEPT = 10_000
#: How many banned lease ids are remembered, so a lease is reported once.
BANNED_KEPT = 1_024


class LeaseCapReached(EgressError):
    """Every lease this keeper may hold is in use, and none went idle within the budget."""


@dataclass
class _Held:
    lease: Lease
    renew_at: float
    users: int = 0
    last_used: float = field(default_factory=time.monotonic)


def ban_result(status: int) -> Result:
    """How a ban status is reported: `429` as rate limited, anything else as banned."""
    return "rate_limited" if status == 429 else "banned"


def target_of(url: str) -> str:
    """The lease target of a URL: its host, with the port when it is not the scheme's."""
    parts = urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    host = host_of(url)
    return host if parts.port in (None, default) else f"{host}:{parts.port}"


def host_of(url: str) -> str:
    """A URL's host alone (an IPv6 address in brackets): the target the gateway leases for, so
    the one a report on a gateway session must name to move it."""
    host = (urlsplit(url).hostname or "").lower()
    return f"[{host}]" if ":" in host else host


def renew_at(lease: Lease, now: float) -> float:
    """When a lease granted or renewed at `now` is renewed: once two thirds of its TTL passed."""
    return now + lease.ttl_seconds * 2 / 3


def idle_to_evict(held: Mapping[str, _Held]) -> str | None:
    """The host whose lease makes room for another: the least recently used idle one."""
    idle = [(h.last_used, host) for host, h in held.items() if h.users == 0]
    return min(idle)[1] if idle else None


class HostLeases:
    """The leases of one crawl or one transport, one per destination host.

    `on_count` is told what happens (`leases`, `renewals`, `bans`, `released`,
    `no_match_waits`, `report_errors`), for Scrapy's stats.
    """

    def __init__(
        self,
        api: AsyncClient,
        *,
        selector: Mapping[str, str] | None = None,
        ttl: float | None = None,
        max_leases: int = 16,
        no_match_wait: float = DEFAULT_NO_MATCH_WAIT,
        on_count: Callable[[str], None] | None = None,
    ) -> None:
        if max_leases < 1:
            raise ValueError("max_leases must be at least 1")
        self._api = api
        self._selector = dict(selector or {})
        self._ttl = ttl
        self._max = max_leases
        self._no_match_wait = no_match_wait
        self._held: dict[str, _Held] = {}
        # Hosts being leased for right now: they count towards the cap.
        self._pending: set[str] = set()
        self._changed = asyncio.Condition()
        self._on_count = on_count
        # The leases granted, in order (the last GRANTED_KEPT): what a test checks is given back.
        self.granted: deque[Lease] = deque(maxlen=GRANTED_KEPT)
        # The leases reported already (the last BANNED_KEPT).
        self._banned: deque[str] = deque(maxlen=BANNED_KEPT)

    @property
    def max_leases(self) -> int:
        return self._max

    def held_ids(self) -> set[str]:
        """The ids of the leases held now."""
        return {h.lease.lease_id for h in self._held.values()}

    def _count(self, what: str) -> None:
        if self._on_count is not None:
            self._on_count(what)

    async def take(self, target: str) -> Lease:
        """A lease for a request to `target`; give it back with `done` when the request ends."""
        renew = False
        async with self._changed:
            held = await self._reserve(target)
            if held is not None:
                # Counted at once, under the lock: a lease in use is never what makes room.
                held.users += 1
                held.last_used = time.monotonic()
                if held.last_used >= held.renew_at:
                    held.renew_at, renew = float("inf"), True
        if held is None:
            return await self._leased(target)
        if renew:
            return await self._renewed(target, held)
        return held.lease

    async def _leased(self, target: str) -> Lease:
        """A new lease for `target` (reserved by [`_reserve`]), held for the host and counted
        as in use by the request that asked; the reservation ends however it went."""
        try:
            lease = await self._acquire(target)
        except BaseException:
            async with self._changed:
                self._pending.discard(target)
                self._changed.notify_all()
            raise
        async with self._changed:
            self._pending.discard(target)
            self._held[target] = _Held(lease, renew_at(lease, time.monotonic()), users=1)
            self._changed.notify_all()
        return lease

    async def done(self, target: str, lease: Lease) -> None:
        """A request that `take` served has ended."""
        async with self._changed:
            held = self._held.get(target)
            if held is not None and held.lease.lease_id == lease.lease_id:
                held.users = max(0, held.users - 1)
                held.last_used = time.monotonic()
            self._changed.notify_all()

    async def ban(self, target: str, lease: Lease, result: Result) -> None:
        """`lease`'s proxy was banned or rate limited by `target`: report it, give it back.
        The requests that were in flight on it when it was banned add nothing."""
        if lease.lease_id in self._banned:
            return
        self._banned.append(lease.lease_id)
        self._count("bans")
        log.info(
            "egress: proxy %s %s by %s; reported, leasing another",
            lease.proxy.id,
            result.replace("_", " "),
            target,
        )
        try:
            await self._api.report(lease.lease_id, result, target)
        except EgressError as e:
            self._count("report_errors")
            log.warning("egress: the report on proxy %s failed: %s", lease.proxy.id, e)
        async with self._changed:
            held = self._held.get(target)
            if held is not None and held.lease.lease_id == lease.lease_id:
                del self._held[target]
            self._changed.notify_all()
        await self._release(lease)

    async def close(self) -> None:
        """Gives every lease back."""
        async with self._changed:
            leases = [h.lease for h in self._held.values()]
            self._held.clear()
            self._changed.notify_all()
        for lease in leases:
            await self._release(lease)

    async def _reserve(self, target: str) -> _Held | None:
        """With the lock held: the host's lease, or None once a reservation to lease one is
        made. One lease per host: a request for a host being leased waits for that lease. A
        new host over the cap takes the place of the least recently used idle lease, or waits
        for one to go idle, within the time a lease takes at most."""
        deadline = time.monotonic() + self._api_budget() + self._no_match_wait
        while True:
            held = self._held.get(target)
            if held is not None:
                return held
            if target not in self._pending:
                if len(self._held) + len(self._pending) < self._max:
                    self._pending.add(target)
                    return None
                host = idle_to_evict(self._held)
                if host is not None:
                    await self._release(self._held.pop(host).lease)
                    continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise LeaseCapReached(
                    f"all {self._max} leases are in use and none went idle in time"
                )
            # asyncio's own TimeoutError: on 3.10 it is not yet the builtin one.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    def _api_budget(self) -> float:
        return self._api.timeout

    async def _acquire(self, target: str) -> Lease:
        """A new lease for `target`; when every matching proxy is busy or cooling down, tried
        again after the API's hint until `no_match_wait` has passed."""
        deadline = time.monotonic() + self._no_match_wait
        while True:
            try:
                lease = await self._api.acquire(
                    selector=self._selector, ttl=self._ttl, target=target
                )
            except NoMatch as e:
                wait = e.retry_after if e.retry_after is not None else 1.0
                if e.considered == 0 or time.monotonic() + wait > deadline:
                    raise
                self._count("no_match_waits")
                log.debug("egress: no proxy free for %s yet; trying again in %.1f s", target, wait)
                await asyncio.sleep(wait)
                continue
            self._count("leases")
            self.granted.append(lease)
            log.debug("egress: leased proxy %s for %s", lease.proxy.id, target)
            return lease

    async def _renewed(self, target: str, held: _Held) -> Lease:
        """`held`'s lease renewed (in place: its users stay counted), or, when it can no longer
        be, a new one for the host, taken as any is."""
        try:
            lease = await self._api.renew(held.lease.lease_id, self._ttl)
        except (NotRenewable, UnknownLease):
            # The proxy may no longer be leased (draining, unhealthy) or the lease is gone:
            # lease afresh, and the API chooses a proxy that can serve.
            async with self._changed:
                if self._held.get(target) is held:
                    del self._held[target]
                self._changed.notify_all()
            await self._release(held.lease)
            async with self._changed:
                again = await self._reserve(target)
                if again is not None:
                    again.users += 1
                    return again.lease
            return await self._leased(target)
        self._count("renewals")
        async with self._changed:
            held.lease, held.renew_at = lease, renew_at(lease, time.monotonic())
        return lease

    async def _release(self, lease: Lease) -> None:
        try:
            await self._api.release(lease.lease_id)
            self._count("released")
        except EgressError as e:
            # The lease ends at its TTL anyway.
            log.warning("egress: giving back the lease on proxy %s failed: %s", lease.proxy.id, e)


__all__ = ["DEFAULT_NO_MATCH_WAIT", "HostLeases", "LeaseCapReached", "target_of"]
