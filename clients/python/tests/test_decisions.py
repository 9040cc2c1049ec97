"""The pure decisions behind the middleware and the transport: a URL's lease target, which
idle lease makes room, a slot's gateway session, how a ban is reported, and the settings a
crawl is refused for, with what it is told."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from scrapy.settings import Settings

from egress_proxies._hosts import ban_result, idle_to_evict, target_of
from egress_proxies.scrapy import _token, session_name


def test_a_target_is_the_host_with_a_port_only_when_not_the_schemes() -> None:
    assert target_of("http://Shop.Example/cart?id=1") == "shop.example"
    assert target_of("https://shop.example:443/") == "shop.example"
    assert target_of("https://shop.example:8443/x") == "shop.example:8443"
    assert target_of("http://127.0.0.1:8000/1.html") == "127.0.0.1:8000"
    assert target_of("http://[::1]:8080/") == "[::1]:8080"


def test_room_is_made_by_the_least_recently_used_idle_lease() -> None:
    from egress_proxies._hosts import _Held

    def held(users: int, last_used: float) -> _Held:
        return _Held(lease=None, renew_at=0.0, users=users, last_used=last_used)  # type: ignore[arg-type]

    assert idle_to_evict({"a": held(0, 5.0), "b": held(0, 1.0), "c": held(2, 0.0)}) == "b"
    assert idle_to_evict({"a": held(1, 5.0)}) is None
    assert idle_to_evict({}) is None


def test_a_slots_session_is_a_valid_name_of_its_own() -> None:
    a, b = session_name("1a2b3c4d", "shop.example"), session_name("1a2b3c4d", "other.example")
    assert a != b and a == session_name("1a2b3c4d", "shop.example")
    assert a != session_name("99999999", "shop.example")
    for name in (a, b, session_name("1a2b3c4d", "x" * 500)):
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name)


def test_a_429_is_rate_limited_and_any_other_ban_banned() -> None:
    assert ban_result(429) == "rate_limited"
    assert ban_result(403) == "banned"
    assert ban_result(200) == "banned"


def test_the_token_comes_from_one_place_and_must_be_there(tmp_path: Path) -> None:
    assert _token(Settings({"EGRESS_TOKEN": "t1"})) == "t1"
    file = tmp_path / "token"
    file.write_text("t2\nold-token\n")
    assert _token(Settings({"EGRESS_TOKEN_FILE": str(file)})) == "t2"
    with pytest.raises(ValueError, match="not both"):
        _token(Settings({"EGRESS_TOKEN": "t1", "EGRESS_TOKEN_FILE": str(file)}))
    with pytest.raises(ValueError, match="EGRESS_TOKEN or EGRESS_TOKEN_FILE is needed"):
        _token(Settings({}))
    file.write_text("\n")
    with pytest.raises(ValueError, match="is needed"):
        _token(Settings({"EGRESS_TOKEN_FILE": str(file)}))
