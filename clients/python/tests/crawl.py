"""One Scrapy crawl through the middleware, in a process of its own (Twisted's reactor runs
once per process): `python crawl.py CONFIG OUT`.

CONFIG is JSON: `settings` (Scrapy settings), `start` (the URLs to start from). The spider
follows every link and keeps each page it got. OUT receives JSON: the pages, the crawl's stats,
why it finished, and the leases the middleware took (ids and passwords, for the tests' checks).
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from scrapy import Request, Spider, signals
from scrapy.crawler import CrawlerProcess
from scrapy.http import Response

from egress_proxies.scrapy import EgressProxyMiddleware


def is_captcha(response: Response, request: Request) -> bool:
    """The `EGRESS_RESPONSE_IS_BAN` hook for the site's soft ban (`Site.soft_ban`)."""
    return b"CAPTCHA" in response.body


class SiteSpider(Spider):
    name = "site"

    def __init__(self, start: list[str], out: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls_given = start
        self.out = out

    async def start(self) -> AsyncIterator[Request]:
        for url in self.start_urls_given:
            yield Request(url)

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Request]:
        self.out["pages"].append(response.url)
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href)

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> SiteSpider:
        spider: SiteSpider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.record_leases, signal=signals.spider_closed)
        return spider

    def record_leases(self, spider: Spider) -> None:
        middlewares = self.crawler.engine.downloader.middleware.middlewares
        for mw in middlewares:
            if isinstance(mw, EgressProxyMiddleware):
                leases = mw.granted()
                self.out["leases"] = [lease.lease_id for lease in leases]
                self.out["passwords"] = [lease.proxy.password for lease in leases]


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    out: dict[str, Any] = {"pages": [], "leases": [], "passwords": []}
    process = CrawlerProcess(settings=config["settings"])
    crawler = process.create_crawler(SiteSpider)
    process.crawl(crawler, start=config["start"], out=out)
    process.start()
    stats = crawler.stats.get_stats() if crawler.stats else {}
    out["stats"] = {k: v for k, v in stats.items() if isinstance(v, (int, str, float))}
    out["reason"] = stats.get("finish_reason")
    Path(sys.argv[2]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
