"""Real Scrapy crawls of a local site through the operator's real tinyproxies: every page
collected; a proxy the site bans reported and cooled down for the site while the crawl goes on
through the others; no matching proxy ending the crawl with a clear error; a crawl closed
midway giving every lease back; the token and the proxies' passwords in none of Scrapy's log
or stats; the gateway mode."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import Site, Stack, assert_given_back

from egress_proxies import Client, errors

#: A crawl that takes longer has hung: the tests' one guard against waiting forever.
CRAWL_BUDGET = 180


def crawl(tmp: Path, stack: Stack, site: Site, **settings: Any) -> dict[str, Any]:
    """Runs one crawl of `site` through `stack`, its log at DEBUG in `tmp/crawl.log`."""
    config = {
        "settings": {
            "DOWNLOADER_MIDDLEWARES": {"egress_proxies.scrapy.EgressProxyMiddleware": 600},
            "EGRESS_API_URL": stack.discovery,
            "EGRESS_TOKEN_FILE": str(stack.token_file),
            "EGRESS_CA_FILE": stack.ca,
            "ROBOTSTXT_OBEY": False,
            "TELNETCONSOLE_ENABLED": False,
            "LOG_LEVEL": "DEBUG",
            "LOG_FILE": str(tmp / "crawl.log"),
            "CONCURRENT_REQUESTS": 8,
            "DOWNLOAD_TIMEOUT": 20,
            **settings,
        },
        "start": [site.url(0)],
    }
    (tmp / "config.json").write_text(json.dumps(config))
    subprocess.run(
        [sys.executable, str(Path(__file__).with_name("crawl.py")), "config.json", "out.json"],
        cwd=tmp,
        timeout=CRAWL_BUDGET,
        check=True,
    )
    out: dict[str, Any] = json.loads((tmp / "out.json").read_text())
    return out


def test_a_crawl_collects_every_page_through_leased_proxies(
    tmp_path: Path, stack: Stack, site: Site
) -> None:
    site.ports = 3
    site.start()
    out = crawl(tmp_path, stack, site)
    assert set(out["pages"]) == site.urls()
    assert out["reason"] == "finished"
    # One lease per host: three ports, three targets.
    assert out["stats"]["egress/leases"] == 3
    assert out["stats"].get("egress/bans", 0) == 0
    # Every request went through a proxy: the site saw only proxies' loopback addresses.
    assert site.peers and "127.0.0.1" not in site.peers
    assert_given_back(stack, out["leases"])


def test_a_banned_proxy_is_reported_cooled_down_and_the_crawl_goes_on(
    tmp_path: Path, stack: Stack, site: Site
) -> None:
    site.ban_first = True
    site.start()
    selector = {"geo": "eu"}
    out = crawl(tmp_path, stack, site, EGRESS_SELECTOR=selector)
    assert set(out["pages"]) == site.urls()
    assert out["stats"]["egress/bans"] >= 1
    assert out["stats"]["egress/leases"] >= 2
    # The retry middleware never saw the ban: it was handled, and sent again, here.
    assert "retry/count" not in out["stats"]
    assert_given_back(stack, out["leases"])
    # The banned proxy cools down for the site: every lease for it now goes elsewhere, and
    # once the others are full the refusal counts it as cooling down.
    (banned,) = site.banned
    held = []
    with Client(stack.discovery, stack.token, verify=stack.ca) as api:
        try:
            with pytest.raises(errors.NoMatch) as refused:
                for _ in range(10):
                    held.append(api.acquire(selector=selector, target=site.targets()[0], ttl=30))
            assert refused.value.in_cooldown >= 1
            assert held and all(lease.proxy.view.ip != banned for lease in held)
        finally:
            for lease in held:
                api.release(lease.lease_id)


def test_the_ban_statuses_are_the_settings_and_a_request_banned_everywhere_gives_up(
    tmp_path: Path, stack: Stack, site: Site
) -> None:
    site.ban_every = True
    site.ban_status = 503
    site.start()
    out = crawl(tmp_path, stack, site, EGRESS_BAN_STATUSES=[503], EGRESS_MAX_RETRIES=1)
    # Reported on the first proxy and on the one it was sent again through, then given up:
    # the 503 goes to the spider (Scrapy's error middleware keeps it from parse), and Scrapy's
    # retry middleware, which retries a 503 by default, leaves it alone.
    stats = out["stats"]
    assert (stats["egress/bans"], stats["egress/retries"], stats["egress/retries_exhausted"]) == (
        2,
        1,
        1,
    )
    assert "retry/count" not in stats
    assert out["pages"] == []
    assert len(site.banned) == 2
    assert_given_back(stack, out["leases"])


def test_a_request_that_times_out_through_a_proxy_is_reported_and_sent_through_another(
    tmp_path: Path, stack: Stack, site: Site
) -> None:
    # The site never answers the first proxy it sees: the download times out (an exception,
    # not an answer), which is reported on that proxy's lease for the site.
    site.ban_first = True
    site.hang = True
    site.start()
    out = crawl(tmp_path, stack, site, DOWNLOAD_TIMEOUT=5)
    assert set(out["pages"]) == site.urls()
    stats = out["stats"]
    assert (stats["egress/proxy_failures"], stats["egress/bans"], stats["egress/retries"]) == (
        1,
        1,
        1,
    )
    assert "retry/count" not in stats
    (hung,) = site.banned
    assert site.peers[hung] == 1
    assert_given_back(stack, out["leases"])


def test_no_matching_proxy_ends_the_crawl_with_a_clear_error(
    tmp_path: Path, stack: Stack, site: Site
) -> None:
    site.start()
    out = crawl(tmp_path, stack, site, EGRESS_SELECTOR={"geo": "nowhere"})
    assert out["reason"] == "egress_no_match"
    assert out["pages"] == []
    assert out["stats"]["egress/no_match"] >= 1
    log = (tmp_path / "crawl.log").read_text()
    assert "ERROR: egress: no proxy to lease for 127.0.0.1" in log
    assert "{'geo': 'nowhere'}" in log
    assert not site.peers


def test_a_crawl_closed_midway_gives_every_lease_back(
    tmp_path: Path, stack: Stack, site: Site
) -> None:
    site.pages, site.ports = 60, 3
    site.start()
    out = crawl(tmp_path, stack, site, CLOSESPIDER_PAGECOUNT=5)
    assert out["reason"] == "closespider_pagecount"
    assert len(out["pages"]) < site.pages
    assert_given_back(stack, out["leases"])


def test_without_the_asyncio_reactor_the_crawl_does_not_start_and_says_why(
    tmp_path: Path, stack: Stack, site: Site
) -> None:
    site.start()
    out = crawl(
        tmp_path, stack, site, TWISTED_REACTOR="twisted.internet.selectreactor.SelectReactor"
    )
    assert out["pages"] == [] and not site.peers
    log = (tmp_path / "crawl.log").read_text()
    assert "egress_proxies.scrapy needs Twisted's asyncio reactor" in log


def test_the_token_and_passwords_are_in_no_log_line_or_stat(
    tmp_path: Path, stack: Stack, site: Site
) -> None:
    site.ban_first = True
    site.start()
    out = crawl(tmp_path, stack, site, LOG_LEVEL="DEBUG", STATS_DUMP=True)
    log = (tmp_path / "crawl.log").read_text()
    # The log holds Scrapy's own debug lines and its stats dump, bans included.
    assert "Dumping Scrapy stats" in log and "egress/bans" in log and "DEBUG: Crawled (" in log
    secrets = [stack.token, *out["passwords"]]
    assert len(secrets) >= 3 and all(secrets)
    for secret in secrets:
        assert secret not in log
        assert secret not in json.dumps(out["stats"])


def test_gateway_mode_routes_through_the_gateway_in_sessions(
    tmp_path: Path, stack: Stack, site: Site
) -> None:
    site.ban_first = True
    site.ports = 2
    site.start()
    out = crawl(tmp_path, stack, site, EGRESS_GATEWAY_URL=stack.gateway, EGRESS_LEASE_TTL=5)
    assert set(out["pages"]) == site.urls()
    assert out["stats"]["egress/bans"] >= 1
    # The gateway leased, not the middleware.
    assert out["leases"] == []
    assert "127.0.0.1" not in site.peers
    log = (tmp_path / "crawl.log").read_text()
    assert stack.token not in log


def test_in_gateway_mode_a_ban_only_the_crawl_sees_moves_its_session(
    tmp_path: Path, stack: Stack, site: Site
) -> None:
    # A 200 page the hook calls a ban: the gateway sees nothing wrong, so only the
    # middleware's report, on the request's own session and for the host the gateway leased
    # for, moves the session off the banned proxy.
    site.ban_first = True
    site.ban_status = 200
    site.start()
    out = crawl(
        tmp_path,
        stack,
        site,
        EGRESS_GATEWAY_URL=stack.gateway,
        EGRESS_LEASE_TTL=5,
        EGRESS_RESPONSE_IS_BAN="crawl.is_captcha",
    )
    assert set(out["pages"]) == site.urls()
    assert "egress/reports_unmatched" not in out["stats"]
    # The one report moved the session: the page was sent again once, through another proxy,
    # and the banned proxy was never asked again.
    assert (out["stats"]["egress/bans"], out["stats"]["egress/retries"]) == (1, 1)
    (banned,) = site.banned
    assert site.peers[banned] == 1
