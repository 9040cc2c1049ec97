"""HostLeases against a scripted API: one lease per host however many requests ask at once, the
cap on leases held (a new host waits for an idle lease, which makes room), renewal, a ban, and
every lease given back at close."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from egress_proxies import Lease, errors
from egress_proxies._hosts import HostLeases, LeaseCapReached


class ScriptedApi:
    """The calls HostLeases makes, recorded; each acquire grants a new lease on a new proxy."""

    timeout = 2.0

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.granted = 0

    async def acquire(self, **kwargs: Any) -> Lease:
        self.calls.append(("acquire", kwargs["target"]))
        self.granted += 1
        n = self.granted
        proxy = {"id": f"p{n}", "ip": f"10.0.0.{n}", "port": 3128, "password": "pw"}
        return Lease.from_json(
            {"leaseID": f"L{n}", "proxy": proxy, "ttlSeconds": kwargs.get("ttl") or 300},
            resumed=False,
        )

    async def renew(self, lease_id: str, ttl: float | None = None) -> Lease:
        self.calls.append(("renew", lease_id))
        raise errors.UnknownLease("gone", status=404, code="unknown_lease")

    async def release(self, lease_id: str) -> None:
        self.calls.append(("release", lease_id))

    async def report(self, lease_id: str, result: str, target: str | None = None) -> None:
        self.calls.append(("report", (lease_id, result, target)))


def keeper(api: ScriptedApi, **kwargs: Any) -> HostLeases:
    return HostLeases(api, **kwargs)  # type: ignore[arg-type]


async def test_one_lease_serves_a_host_however_many_ask_at_once() -> None:
    api = ScriptedApi()
    leases = keeper(api)
    got = await asyncio.gather(*(leases.take("a.example") for _ in range(10)))
    assert {lease.lease_id for lease in got} == {"L1"}
    assert api.calls == [("acquire", "a.example")]


async def test_a_new_host_over_the_cap_waits_for_an_idle_lease_and_takes_its_place() -> None:
    api = ScriptedApi()
    leases = keeper(api, max_leases=1)
    first = await leases.take("a.example")
    # Two requests for a new host wait; the first to go on leases, the other shares it.
    waiting = asyncio.gather(leases.take("b.example"), leases.take("b.example"))
    await leases.done("a.example", first)
    assert [lease.lease_id for lease in await waiting] == ["L2", "L2"]
    assert api.calls == [("acquire", "a.example"), ("release", "L1"), ("acquire", "b.example")]
    assert leases.held_ids() == {"L2"}


async def test_over_the_cap_with_nothing_going_idle_is_an_error_in_time() -> None:
    api = ScriptedApi()
    api.timeout = 0.05
    leases = keeper(api, max_leases=1, no_match_wait=0)
    await leases.take("a.example")
    with pytest.raises(LeaseCapReached):
        await leases.take("b.example")


async def test_a_lease_past_its_renewal_that_cannot_be_renewed_is_replaced() -> None:
    api = ScriptedApi()
    leases = keeper(api)
    first = await leases.take("a.example")
    await leases.done("a.example", first)
    # Make it due at once.
    leases._held["a.example"].renew_at = 0.0
    again = await leases.take("a.example")
    assert again.lease_id == "L2"
    assert ("renew", "L1") in api.calls and ("release", "L1") in api.calls


async def test_a_ban_is_reported_for_the_host_and_the_next_request_leases_again() -> None:
    api = ScriptedApi()
    leases = keeper(api)
    lease = await leases.take("a.example")
    await leases.done("a.example", lease)
    await leases.ban("a.example", lease, "rate_limited")
    assert ("report", ("L1", "rate_limited", "a.example")) in api.calls
    assert ("release", "L1") in api.calls
    assert (await leases.take("a.example")).lease_id == "L2"
    await leases.close()
    assert api.calls[-1] == ("release", "L2")
    assert leases.held_ids() == set()


async def test_a_lease_is_reported_once_however_many_requests_saw_the_ban() -> None:
    api = ScriptedApi()
    leases = keeper(api)
    lease = await leases.take("a.example")
    await asyncio.gather(*(leases.ban("a.example", lease, "banned") for _ in range(5)))
    assert [c for c in api.calls if c[0] == "report"] == [("report", ("L1", "banned", "a.example"))]


class SlowRenewals(ScriptedApi):
    """Renewals that wait for the test, then keep the lease."""

    def __init__(self) -> None:
        super().__init__()
        self.go_on = asyncio.Event()

    async def renew(self, lease_id: str, ttl: float | None = None) -> Lease:
        self.calls.append(("renew", lease_id))
        await self.go_on.wait()
        proxy = {"id": "p1", "ip": "10.0.0.1", "port": 3128}
        return Lease.from_json(
            {"leaseID": lease_id, "proxy": proxy, "ttlSeconds": 300}, resumed=False
        )


async def test_a_lease_being_renewed_is_in_use_and_never_makes_room() -> None:
    api = SlowRenewals()
    leases = keeper(api, max_leases=1)
    first = await leases.take("a.example")
    await leases.done("a.example", first)
    leases._held["a.example"].renew_at = 0.0
    renewing = asyncio.ensure_future(leases.take("a.example"))
    for _ in range(1000):
        if ("renew", "L1") in api.calls:
            break
        await asyncio.sleep(0)
    assert ("renew", "L1") in api.calls
    # Another host waits: the lease being renewed is in use, not idle.
    other = asyncio.ensure_future(leases.take("b.example"))
    api.go_on.set()
    assert (await renewing).lease_id == "L1"
    assert ("release", "L1") not in api.calls, "released while it was being renewed"
    await leases.done("a.example", first)
    assert (await other).lease_id == "L2"
    assert api.calls.index(("release", "L1")) < api.calls.index(("acquire", "b.example"))
