"""The real operator stack for the tests, and a small local site to crawl through it.

`stack` is the system `cargo xtask dev` runs (the Kubernetes test server, the operator with
local tinyproxies, three sample Proxies and a pool, the gateway), started once per test session
from the programs `cargo xtask test` built: `EGRESS_STACK_COMMAND` names the xtask program,
which serves them with `dev --stack-file` and tears them down at SIGTERM. `EGRESS_STACK_FILE`
instead names the stack file of one already serving (for a person iterating on the tests).
Without either the tests that need it skip, or fail under `cargo xtask test`
(`EGRESS_REAL_BACKENDS_REQUIRED=1`).

Each local tinyproxy leaves from its own loopback address, which the site sees as the peer's:
`Site` answers 429 to the addresses it is told are banned, as a site does to one proxy.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from egress_proxies import Client, errors

#: How long the stack gets to be Ready, and to tear down.
START_BUDGET = 300.0
STOP_BUDGET = 120.0


@dataclass(frozen=True)
class Stack:
    discovery: str
    token: str
    gateway: str
    proxies: list[str]
    token_file: Path
    #: The CA file the API's certificate chains to.
    ca: str


def _required() -> bool:
    return os.environ.get("EGRESS_REAL_BACKENDS_REQUIRED") == "1"


def _read_stack(path: Path, tmp: Path) -> Stack:
    data = json.loads(path.read_text())
    token_file = tmp / "discovery-token"
    token_file.write_text(data["token"] + "\n")
    token_file.chmod(0o600)
    return Stack(
        data["discovery"], data["token"], data["gateway"], data["proxies"], token_file, data["ca"]
    )


def _wait_for(path: Path, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_BUDGET
    while not path.exists():
        if process.poll() is not None:
            raise RuntimeError(
                f"the stack exited ({process.returncode}):\n{log.read_text()[-4000:]}"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the stack was not Ready in {START_BUDGET} s:\n{log.read_text()[-4000:]}"
            )
        time.sleep(0.2)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("stack")
    serving = os.environ.get("EGRESS_STACK_FILE")
    if serving:
        yield _read_stack(Path(serving), tmp)
        return
    command = os.environ.get("EGRESS_STACK_COMMAND")
    if not command:
        why = "EGRESS_STACK_COMMAND is not set (cargo xtask test sets it)"
        if _required():
            pytest.fail(why)
        pytest.skip(why)
    path, log = tmp / "stack.json", tmp / "stack.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [command, "dev", "--stack-file", str(path)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        _wait_for(path, process, log)
        yield _read_stack(path, tmp)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(STOP_BUDGET)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        assert code == 0, f"the stack's teardown failed ({code}):\n{log.read_text()[-4000:]}"


def assert_given_back(stack: Stack, leases: list[str]) -> None:
    """Each lease is no longer held: renewing it finds no active lease."""
    assert leases, "no lease was taken"
    with Client(stack.discovery, stack.token, verify=stack.ca) as api:
        for lease in leases:
            with pytest.raises(errors.UnknownLease):
                api.renew(lease)


# --- the local site --------------------------------------------------------------------


#: The page a soft-banning site answers a banned peer with.
CAPTCHA = "<html><body>CAPTCHA</body></html>"


@dataclass
class Site:
    """A site of `pages` pages linking to each other, on one or more ports of 127.0.0.1 (each
    port another lease target). Answers `ban_status` to peers in `banned` (200: a page holding
    only `CAPTCHA`, a ban no status shows), or with `hang`, no answer until the site stops;
    with `ban_first`, the first peer it sees is banned, with `ban_every`, every peer."""

    pages: int = 12
    ports: int = 1
    ban_first: bool = False
    ban_every: bool = False
    ban_status: int = 429
    hang: bool = False
    banned: set[str] = field(default_factory=set)
    peers: dict[str, int] = field(default_factory=dict)
    _servers: list[ThreadingHTTPServer] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopped: threading.Event = field(default_factory=threading.Event)

    def url(self, page: int = 0) -> str:
        port = self._servers[page % len(self._servers)].server_address[1]
        return f"http://127.0.0.1:{port}/page/{page}"

    def urls(self) -> set[str]:
        return {self.url(n) for n in range(self.pages)}

    def targets(self) -> list[str]:
        return [f"127.0.0.1:{s.server_address[1]}" for s in self._servers]

    def answer(self, peer: str, path: str) -> tuple[int, str]:
        with self._lock:
            self.peers[peer] = self.peers.get(peer, 0) + 1
            if self.ban_every or (self.ban_first and not self.banned):
                self.banned.add(peer)
            banned = peer in self.banned
        if banned and self.hang:
            # Never answers that proxy while the test runs; the answer is let go at stop.
            self._stopped.wait()
        if banned:
            return self.ban_status, CAPTCHA if self.ban_status == 200 else "refused"
        found = re.fullmatch(r"/page/(\d+)", path)
        if found is None or int(found[1]) >= self.pages:
            return 404, "no such page"
        n = int(found[1])
        links = "".join(f'<a href="{self.url(m)}">{m}</a> ' for m in range(self.pages) if m != n)
        return 200, f"<html><body><h1>page {n}</h1>{links}</body></html>"

    def start(self) -> None:
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = site.answer(self.client_address[0], self.path)
                data = body.encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the proxy gave up on a hanging answer

            def log_message(self, format: str, *args: object) -> None:
                pass

        for _ in range(self.ports):
            server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self._servers.append(server)

    def stop(self) -> None:
        self._stopped.set()
        for server in self._servers:
            server.shutdown()
            server.server_close()


@pytest.fixture
def site() -> Iterator[Site]:
    """A fresh site (fresh ports: no cooldown of another test applies to its targets)."""
    s = Site()
    yield s
    s.stop()
