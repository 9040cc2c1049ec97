"""The API's errors as types, one per error code (docs/discovery.md, "Errors").

An error's text is the API's message and code; it never carries the client's token, which the
client never puts in a message, nor a lease's password.
"""

from __future__ import annotations


class EgressError(Exception):
    """Any failure of a call to the discovery API."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code

    def __str__(self) -> str:
        if self.code is None:
            return self.message
        return f"{self.code} ({self.status}): {self.message}"


class TransportError(EgressError):
    """The call got no answer: a connection that failed, or the call's timeout."""


class Unexpected(EgressError):
    """An answer outside the API's contract (a proxy in between, a wrong URL)."""


class Unauthorized(EgressError):
    """401: the token is missing or not one of the operator's clients'."""


class InvalidRequest(EgressError):
    """400: a malformed request; `field` names what is wrong (`ttl`, `target`, `session`, ...)."""

    def __init__(self, message: str, *, status: int, code: str, field: str) -> None:
        super().__init__(message, status=status, code=code)
        self.field = field


class NoMatch(EgressError):
    """409 no_match: no eligible proxy, with the counts of those considered."""

    def __init__(
        self,
        message: str,
        *,
        considered: int = 0,
        at_capacity: int = 0,
        in_cooldown: int = 0,
        unhealthy: int = 0,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, status=409, code="no_match")
        self.considered = considered
        self.at_capacity = at_capacity
        self.in_cooldown = in_cooldown
        self.unhealthy = unhealthy
        # The API's hint, when it sends `Retry-After`.
        self.retry_after = retry_after


class TooManySessions(EgressError):
    """409 too_many_sessions: the client holds as many live sessions as it may."""


class NotRenewable(EgressError):
    """409 not_renewable: the lease's proxy may no longer be leased; it runs to its expiry."""


class UnknownLease(EgressError):
    """404 unknown_lease: no such lease (never issued, ended, or forgotten)."""


class UnknownSession(EgressError):
    """404 unknown_session: this client holds no live session of that name."""


class NotFound(EgressError):
    """404 not_found: no such endpoint (a wrong base URL)."""


class RateLimited(EgressError):
    """429 rate_limited: over the client's budget; `retry_after` seconds to wait."""

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message, status=429, code="rate_limited")
        self.retry_after = retry_after


class Unavailable(EgressError):
    """503: the lease store cannot be reached (store_unavailable), or the server was busy
    (overloaded, with `retry_after`)."""

    def __init__(self, message: str, *, code: str, retry_after: float | None) -> None:
        super().__init__(message, status=503, code=code)
        self.retry_after = retry_after


class ServerError(EgressError):
    """Any other error the API answers (internal, method_not_allowed, headers_too_large)."""


# The 400 codes and the field each names.
_INVALID = {
    "invalid_query": "query",
    "invalid_body": "body",
    "invalid_ttl": "ttl",
    "invalid_result": "result",
    "invalid_target": "target",
    "invalid_session": "session",
}

_SIMPLE: dict[str, type[EgressError]] = {
    "unauthorized": Unauthorized,
    "too_many_sessions": TooManySessions,
    "not_renewable": NotRenewable,
    "unknown_lease": UnknownLease,
    "unknown_session": UnknownSession,
    "not_found": NotFound,
}


def from_answer(status: int, body: object, retry_after: float | None) -> EgressError:
    """The error for an answer `status` with the JSON `body` (None when it was not JSON)."""
    if not isinstance(body, dict) or not isinstance(body.get("error"), str):
        return Unexpected(f"unexpected answer {status}", status=status)
    code: str = body["error"]
    message = str(body.get("message", ""))
    if code in _INVALID:
        return InvalidRequest(message, status=status, code=code, field=_INVALID[code])
    if code == "no_match":
        counts = {
            k: int(body.get(k, 0) or 0)
            for k in ("considered", "atCapacity", "inCooldown", "unhealthy")
        }
        return NoMatch(
            message,
            considered=counts["considered"],
            at_capacity=counts["atCapacity"],
            in_cooldown=counts["inCooldown"],
            unhealthy=counts["unhealthy"],
            retry_after=retry_after,
        )
    if code == "rate_limited":
        return RateLimited(message, retry_after=retry_after if retry_after is not None else 1.0)
    if code in ("store_unavailable", "overloaded"):
        return Unavailable(message, code=code, retry_after=retry_after)
    if code in _SIMPLE:
        return _SIMPLE[code](message, status=status, code=code)
    return ServerError(message, status=status, code=code)
