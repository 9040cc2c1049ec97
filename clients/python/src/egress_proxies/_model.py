"""What the API answers: proxies as the list shows them, and leases with their proxy's
credentials, which no `repr` shows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ProxyView:
    """A proxy as `GET /v1/proxies` shows it."""

    id: str
    ip: str
    port: int
    phase: str
    healthy: bool
    latency_millis: int
    active_leases: int
    max_leases: int
    attributes: dict[str, str] = field(default_factory=dict)
    pool_role: str | None = None

    @classmethod
    def from_json(cls, v: dict[str, Any]) -> ProxyView:
        return cls(
            id=str(v["id"]),
            ip=str(v.get("ip", "")),
            port=int(v["port"]),
            phase=str(v.get("phase", "")),
            healthy=bool(v.get("healthy", False)),
            latency_millis=int(v.get("latencyMillis", 0)),
            active_leases=int(v.get("activeLeases", 0)),
            max_leases=int(v.get("maxLeases", 0)),
            attributes=dict(v.get("attributes") or {}),
            pool_role=v.get("poolRole"),
        )


@dataclass(frozen=True)
class LeasedProxy:
    """A leased proxy: the list's view and, when the proxy demands them, its credentials."""

    view: ProxyView
    username: str | None = field(default=None)
    password: str | None = field(default=None, repr=False)
    url: str | None = field(default=None, repr=False)

    @classmethod
    def from_json(cls, v: dict[str, Any]) -> LeasedProxy:
        return cls(
            view=ProxyView.from_json(v),
            username=v.get("username"),
            password=v.get("password"),
            url=v.get("url"),
        )

    @property
    def id(self) -> str:
        return self.view.id

    @property
    def proxy_url(self) -> str:
        """What an HTTP client takes as its proxy: `http://user:password@ip:port`, or
        `http://ip:port` for a proxy that demands no credentials."""
        if self.url:
            return self.url
        host = f"[{self.view.ip}]" if ":" in self.view.ip else self.view.ip
        return f"http://{host}:{self.view.port}"


@dataclass(frozen=True)
class Lease:
    """A lease granted: its id, its proxy, when it ends."""

    lease_id: str
    proxy: LeasedProxy
    expires_at: str
    ttl_seconds: int
    # True for a session's lease answered again (200) rather than a new one (201).
    resumed: bool = False

    @classmethod
    def from_json(cls, v: dict[str, Any], *, resumed: bool) -> Lease:
        return cls(
            lease_id=str(v["leaseID"]),
            proxy=LeasedProxy.from_json(v["proxy"]),
            expires_at=str(v.get("expiresAt", "")),
            ttl_seconds=int(v.get("ttlSeconds", 0)),
            resumed=resumed,
        )
