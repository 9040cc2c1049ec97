"""The egress-proxy operator's lease API for Python: `Client` (blocking) and `AsyncClient`
(asyncio) list proxies, lease one for a target, renew, give back and report bans, each call
bounded by a timeout; errors are types named after the API's codes (`egress_proxies.errors`).
`egress_proxies.scrapy` is a Scrapy downloader middleware and `egress_proxies.transport` an
httpx transport, each leasing a proxy per destination host.
"""

from . import _errors as errors
from ._client import DEFAULT_TIMEOUT, MAX_RETRIES, AsyncClient, Client, Result
from ._errors import EgressError
from ._model import Lease, LeasedProxy, ProxyView

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_RETRIES",
    "AsyncClient",
    "Client",
    "EgressError",
    "Lease",
    "LeasedProxy",
    "ProxyView",
    "Result",
    "errors",
]
