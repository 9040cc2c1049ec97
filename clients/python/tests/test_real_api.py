"""The client and the httpx transport against the real operator stack: the transport leases
per host, reports a ban and sends the request again through another proxy, and gives its
leases back; and the token and the proxies' passwords appear in no log record (httpx's and
httpcore's debug lines included) and no exception."""

from __future__ import annotations

import logging
import socket

import httpx
import pytest
from conftest import Site, Stack, assert_given_back

from egress_proxies import AsyncClient, Client, EgressError, errors
from egress_proxies.transport import LeasingTransport


def closed_port() -> int:
    """A port nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def test_the_transport_leases_per_host_and_moves_off_a_banned_proxy(
    stack: Stack, site: Site
) -> None:
    site.ban_first = True
    site.start()
    async with AsyncClient(stack.discovery, stack.token, verify=stack.ca) as api:
        transport = LeasingTransport(api)
        async with httpx.AsyncClient(transport=transport) as http:
            for n in range(site.pages):
                page = await http.get(site.url(n))
                assert page.status_code == 200, page.text
        leases = list(transport.leases.granted)
    # The first proxy was banned, reported and left; the second served every page after it.
    assert len(site.banned) == 1 and len(leases) == 2
    assert leases[0].proxy.view.ip in site.banned
    assert site.peers[leases[1].proxy.view.ip] == site.pages
    assert_given_back(stack, [lease.lease_id for lease in leases])


def test_no_secret_in_log_records_or_exceptions(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    with Client(stack.discovery, stack.token, verify=stack.ca) as api, api.lease(ttl=30) as lease:
        password = lease.proxy.password
        assert password
        seen.append(repr(lease))
        api.report(lease.lease_id, "ok")
        for call in (
            lambda: api.acquire(ttl=-1),
            lambda: api.acquire(session="not a name"),
            lambda: api.report_session("nobody", "banned"),
        ):
            with pytest.raises(EgressError) as e:
                call()
            seen.append(str(e.value))
    with Client(stack.discovery, "not-" + stack.token, verify=stack.ca) as stranger:
        with pytest.raises(errors.Unauthorized) as e:
            stranger.list()
        seen.append(str(e.value))
    with Client(f"http://127.0.0.1:{closed_port()}", stack.token) as lost:
        with pytest.raises(errors.TransportError) as e:
            lost.whoami()
        seen.append(str(e.value))
    text = caplog.text + "\n".join(seen)
    assert "POST" in caplog.text and "/v1/leases" in caplog.text
    assert stack.token not in text
    assert password not in text
