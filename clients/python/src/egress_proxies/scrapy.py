"""A Scrapy downloader middleware that sends each request through a leased egress proxy.

```python
DOWNLOADER_MIDDLEWARES = {"egress_proxies.scrapy.EgressProxyMiddleware": 600}
EGRESS_API_URL = "https://127.0.0.1:8090"
EGRESS_TOKEN_FILE = "target/egress-dev/discovery-token"
EGRESS_CA_FILE = "target/egress-dev/ca.pem"
```

Priority 600 puts it after Scrapy's retry middleware (550) and before its proxy middleware
(750): it sets each request's proxy before Scrapy's proxy middleware turns the URL's
credentials into a `Proxy-Authorization` header, and it sees each answer before the retry
middleware, so a ban status is handled here (reported, and the request sent again through
another proxy) and not retried a second time by `RETRY_HTTP_CODES`.

Settings (docs/clients/python.md has the full table): `EGRESS_API_URL`, `EGRESS_TOKEN` or
`EGRESS_TOKEN_FILE`, `EGRESS_CA_FILE`, `EGRESS_SELECTOR`, `EGRESS_LEASE_TTL`,
`EGRESS_BAN_STATUSES` (403 and 429), `EGRESS_RESPONSE_IS_BAN`, `EGRESS_MAX_RETRIES`,
`EGRESS_MAX_LEASES`, `EGRESS_NO_MATCH_WAIT`, `EGRESS_API_TIMEOUT`, `EGRESS_GATEWAY_URL`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from scrapy import Request, Spider, signals
from scrapy.crawler import Crawler
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from scrapy.settings import BaseSettings
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import load_object

from ._client import DEFAULT_TIMEOUT, AsyncClient, Result
from ._errors import EgressError, NoMatch, UnknownSession
from ._hosts import DEFAULT_NO_MATCH_WAIT, HostLeases, ban_result, host_of, target_of
from ._model import Lease

log = logging.getLogger("egress_proxies")

#: The answers that mean the site refused the proxy, unless `EGRESS_BAN_STATUSES` says others.
DEFAULT_BAN_STATUSES = (403, 429)
#: How many times a request is sent again through another proxy after a ban or a failure.
DEFAULT_MAX_RETRIES = 3
#: The request meta keys this middleware keeps its own state in.
META_LEASE = "egress_lease"
META_RETRIES = "egress_retries"
META_SESSION = "egress_session"
#: The reason a crawl closes with when no proxy could be leased.
NO_MATCH_REASON = "egress_no_match"

BanHook = Callable[[Response, Request], bool]


class NoProxyAvailable(IgnoreRequest):
    """No proxy could be leased for the request: the API's answer says why."""


def _require_asyncio() -> None:
    from scrapy.utils.reactor import is_asyncio_reactor_installed

    if not is_asyncio_reactor_installed():
        raise RuntimeError(
            "egress_proxies.scrapy needs Twisted's asyncio reactor: set TWISTED_REACTOR = "
            '"twisted.internet.asyncioreactor.AsyncioSelectorReactor" (the default since Scrapy 2.13)'
        )


def _token(settings: BaseSettings) -> str:
    token = settings.get("EGRESS_TOKEN")
    path = settings.get("EGRESS_TOKEN_FILE")
    if token and path:
        raise ValueError("set EGRESS_TOKEN or EGRESS_TOKEN_FILE, not both")
    if path:
        # The first line of the file, as the operator writes its token files.
        lines = Path(path).read_text().split()
        token = lines[0] if lines else ""
    if not token:
        raise ValueError(
            "EGRESS_TOKEN or EGRESS_TOKEN_FILE is needed: the lease API asks for a token"
        )
    return str(token)


def _ban_hook(settings: BaseSettings) -> BanHook | None:
    hook = settings.get("EGRESS_RESPONSE_IS_BAN")
    if hook is None:
        return None
    loaded: BanHook = load_object(hook) if isinstance(hook, str) else hook
    return loaded


def session_name(prefix: str, slot: str) -> str:
    """The gateway session of one download slot: the crawl's prefix and a digest of the slot,
    within the API's 64 characters of `[A-Za-z0-9_-]`."""
    return f"{prefix}-{hashlib.sha256(slot.encode()).hexdigest()[:24]}"


class EgressProxyMiddleware:
    """Leases a proxy per destination host and sends the host's requests through it; reports
    bans and failures on the proxy that served them and sends the request again through
    another; gives every lease back when the spider closes."""

    def __init__(self, crawler: Crawler) -> None:
        _require_asyncio()
        s = crawler.settings
        url = s.get("EGRESS_API_URL")
        if not url:
            raise ValueError("EGRESS_API_URL is needed: the operator's discovery API")
        self._crawler = crawler
        self._stats = crawler.stats
        self._token = _token(s)
        self._api = AsyncClient(
            url,
            self._token,
            timeout=s.getfloat("EGRESS_API_TIMEOUT", DEFAULT_TIMEOUT),
            verify=s.get("EGRESS_CA_FILE") or None,
        )
        self._selector: dict[str, str] = dict(s.getdict("EGRESS_SELECTOR"))
        self._leases = HostLeases(
            self._api,
            selector=self._selector,
            ttl=s.getfloat("EGRESS_LEASE_TTL") or None,
            max_leases=s.getint("EGRESS_MAX_LEASES", 16),
            no_match_wait=s.getfloat("EGRESS_NO_MATCH_WAIT", DEFAULT_NO_MATCH_WAIT),
            on_count=self._inc,
        )
        self._ban_statuses = frozenset(
            int(x) for x in s.getlist("EGRESS_BAN_STATUSES", list(DEFAULT_BAN_STATUSES))
        )
        self._is_ban = _ban_hook(s)
        self._max_retries = s.getint("EGRESS_MAX_RETRIES", DEFAULT_MAX_RETRIES)
        self._gateway = s.get("EGRESS_GATEWAY_URL") or None
        self._session_prefix = secrets.token_hex(4)
        self._lease_ttl = s.getint("EGRESS_LEASE_TTL")
        self._close_on_no_match = s.getbool("EGRESS_CLOSE_ON_NO_MATCH", True)
        self._closing: asyncio.Future[None] | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> EgressProxyMiddleware:
        mw = cls(crawler)
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        return mw

    # --- the downloader middleware's methods --------------------------------------------

    async def process_request(self, request: Request, spider: Spider | None = None) -> None:
        target = target_of(request.url)
        if self._gateway is not None:
            session = self._session_of(request)
            request.meta[META_SESSION] = session
            request.meta["proxy"] = self._gateway_url(session)
            return
        try:
            lease = await self._leases.take(target)
        except NoMatch as e:
            self._inc("no_match")
            self._no_match(target, e)
            raise NoProxyAvailable(f"no proxy to lease for {target}: {e}") from None
        except EgressError as e:
            self._inc("api_errors")
            raise NoProxyAvailable(f"no proxy leased for {target}: {e}") from None
        request.meta[META_LEASE] = lease
        request.meta["proxy"] = lease.proxy.proxy_url

    async def process_response(
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Request | Response:
        lease = await self._ended(request)
        not_ours = lease is None and self._gateway is None
        if not_ours or not self._banned(request, response):
            return response
        await self._report(request, lease, ban_result(response.status))
        return self._again(request, f"answered {response.status}") or self._given_up(
            request, response
        )

    async def process_exception(
        self, request: Request, exception: Exception, spider: Spider | None = None
    ) -> Request | None:
        lease = await self._ended(request)
        if isinstance(exception, IgnoreRequest) or (lease is None and self._gateway is None):
            return None
        self._inc("proxy_failures")
        await self._report(request, lease, "banned")
        again = self._again(request, f"failed: {type(exception).__name__}")
        if again is None:
            request.meta["dont_retry"] = True
        return again

    async def spider_closed(self, spider: Spider) -> None:
        await self._leases.close()
        await self._api.aclose()
        log.info(
            "egress: gave back every lease (%d taken in this crawl)", len(self._leases.granted)
        )

    def granted(self) -> list[Lease]:
        """The leases this crawl took (the last 10 000), for checks that all were given back."""
        return list(self._leases.granted)

    # --- what the methods share ---------------------------------------------------------

    def _session_of(self, request: Request) -> str:
        """The gateway session of the request's download slot, the slot named as Scrapy's
        downloader names it: it sets `download_slot` only after this middleware has seen the
        request, so a name made from that meta key alone would differ between a request's
        first try and its report."""
        engine = self._crawler.engine
        if engine is not None:
            slot = engine.downloader.get_slot_key(request)
        else:
            slot = request.meta.get("download_slot") or urlparse_cached(request).hostname or ""
        return session_name(self._session_prefix, str(slot))

    def _gateway_url(self, session: str) -> str:
        """The gateway with `session` and the selector in the username."""
        assert self._gateway is not None
        parts = [f"session={session}"]
        if self._lease_ttl:
            parts.append(f"ttl={self._lease_ttl}")
        parts += [f"{k}={v}" for k, v in sorted(self._selector.items())]
        user = quote(",".join(parts), safe="=")
        scheme, _, rest = self._gateway.partition("://")
        return f"{scheme}://{user}:{quote(self._token, safe='')}@{rest}"

    async def _ended(self, request: Request) -> Lease | None:
        lease: Lease | None = request.meta.pop(META_LEASE, None)
        if lease is not None:
            await self._leases.done(target_of(request.url), lease)
        return lease

    def _banned(self, request: Request, response: Response) -> bool:
        if response.status in self._ban_statuses:
            return True
        return self._is_ban is not None and self._is_ban(response, request)

    async def _report(self, request: Request, lease: Lease | None, result: Result) -> None:
        if lease is not None:
            # Counted by the leases, as `egress/bans`.
            await self._leases.ban(target_of(request.url), lease, result)
            return
        # Gateway mode: the gateway holds the lease; the session names it, and the gateway
        # leased it for the host alone, the target the report must name to move the session.
        self._inc("bans")
        session = request.meta.get(META_SESSION) or self._session_of(request)
        try:
            await self._api.report_session(session, result, host_of(request.url))
        except UnknownSession:
            # The session has no live lease: the gateway saw the ban too (a plain-HTTP answer)
            # and moved it, or its lease ended. Its next tunnel takes a fresh proxy anyway.
            self._inc("reports_unmatched")
            log.debug("egress: session %s had already let its proxy go", session)
        except EgressError as e:
            self._inc("report_errors")
            log.warning("egress: the report on session %s failed: %s", session, e)

    def _again(self, request: Request, why: str) -> Request | None:
        """The request to send again through another proxy, or None once out of retries."""
        retries = int(request.meta.get(META_RETRIES, 0))
        if retries >= self._max_retries:
            self._inc("retries_exhausted")
            log.warning("egress: %s %s after %d retries; giving up", request.url, why, retries)
            return None
        self._inc("retries")
        log.debug("egress: %s %s; sending it again through another proxy", request.url, why)
        again = request.replace(dont_filter=True)
        again.meta[META_RETRIES] = retries + 1
        again.meta.pop("proxy", None)
        again.meta.pop(META_SESSION, None)
        again.headers.pop(b"Proxy-Authorization", None)
        return again

    def _given_up(self, request: Request, response: Response) -> Response:
        # Handled here: Scrapy's retry middleware must not send it again.
        request.meta["dont_retry"] = True
        return response

    def _inc(self, key: str) -> None:
        if self._stats is not None:
            self._stats.inc_value(f"egress/{key}")

    def _no_match(self, target: str, e: NoMatch) -> None:
        """No proxy could be leased for a request: said once, clearly, and (unless
        `EGRESS_CLOSE_ON_NO_MATCH` is off) the crawl closed rather than left to fail every
        request."""
        if self._closing is not None:
            return
        log.error(
            "egress: no proxy to lease for %s with the selector %s: of %d considered, %d "
            "unhealthy, %d at capacity, %d cooling down for this target%s",
            target,
            self._selector,
            e.considered,
            e.unhealthy,
            e.at_capacity,
            e.in_cooldown,
            "; closing the spider" if self._close_on_no_match else "",
        )
        if not self._close_on_no_match:
            return
        engine = self._crawler.engine
        assert engine is not None
        # Not awaited here: closing waits for the downloads in progress, this one included.
        closing = getattr(engine, "close_spider_async", None)
        if closing is not None:
            self._closing = asyncio.ensure_future(closing(reason=NO_MATCH_REASON))
        else:
            spider = self._crawler.spider
            assert spider is not None
            deferred = engine.close_spider(spider, NO_MATCH_REASON)
            self._closing = deferred.asFuture(asyncio.get_running_loop())


__all__ = [
    "DEFAULT_BAN_STATUSES",
    "DEFAULT_MAX_RETRIES",
    "NO_MATCH_REASON",
    "EgressProxyMiddleware",
    "NoProxyAvailable",
    "ban_result",
    "session_name",
]
