"""The Scrapy quick start of docs/clients/python.md, run as written against the real stack.

Its blocks marked `quickstart` run in order in a fresh directory, with only what differs here
replaced: the stack's API address and token file for the dev run's, a free port for the site's
8000, a directory of the test's for /tmp/egress-site. The lines that make the environment (the
virtual environment, `pip install`) are left out: this one has the package and Scrapy
installed (the wheel's install into a fresh environment is checked by `cargo xtask test`).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from conftest import Stack

GUIDE = Path(__file__).parents[3] / "docs" / "clients" / "python.md"
#: The lines of the shell blocks that make the environment, which the test run has.
ENVIRONMENT = ("python3 -m venv", "pip install")


def quickstart_blocks(text: str) -> list[tuple[str, str]]:
    """The guide's blocks marked `quickstart`, as (language, code), in order."""
    return re.findall(r"```(\w+) quickstart\n(.*?)```", text, flags=re.DOTALL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_the_quick_start_works_as_written(tmp_path: Path, stack: Stack) -> None:
    port = free_port()
    replaced = {
        "https://127.0.0.1:8090": stack.discovery,
        "target/egress-dev/ca.pem": stack.ca,
        "target/egress-dev/discovery-token": str(stack.token_file),
        "127.0.0.1:8000": f"127.0.0.1:{port}",
        "8000 --bind": f"{port} --bind",
        "/tmp/egress-site": str(tmp_path / "site"),
    }
    blocks = quickstart_blocks(GUIDE.read_text())
    assert [language for language, _ in blocks] == ["sh", "python", "sh"]
    output = tmp_path / "output.log"
    background: list[subprocess.Popen[bytes]] = []
    with output.open("wb") as out:
        shell = Shell(tmp_path, out)
        try:
            for language, code in blocks:
                for old, new in replaced.items():
                    code = code.replace(old, new)
                if language == "python":
                    name = code.splitlines()[0].removeprefix("# ").strip()
                    (tmp_path / name).write_text(code)
                    continue
                for line in code.splitlines():
                    if line.startswith(ENVIRONMENT) or not line.strip():
                        continue
                    if line.endswith(" &"):
                        background.append(shell.start(line.removesuffix(" &")))
                        wait_listening(port)
                    else:
                        shell.run(line)
        finally:
            for process in background:
                process.terminate()
                process.wait(10)
    pages = json.loads((tmp_path / "pages.json").read_text())
    site = f"http://127.0.0.1:{port}/"
    assert sorted(p["url"] for p in pages) == [site, *(f"{site}{n}.html" for n in (1, 2, 3))]
    assert sorted(p["title"] for p in pages) == ["1", "2", "3", "Directory listing for /"]
    # Through one lease, given back; the site saw a proxy's address, never the crawler's.
    log = output.read_text()
    assert "'egress/leases': 1," in log and "'egress/released': 1," in log
    visits = re.findall(r"^(127\.\d+\.\d+\.\d+) - - .*\"GET /", log, flags=re.MULTILINE)
    assert len(visits) == 4 and "127.0.0.1" not in visits


class Shell:
    """Runs the guide's lines with bash in `cwd`, this environment's programs first on the
    PATH, their errors (Scrapy's log, the site's access lines) into `out`."""

    def __init__(self, cwd: Path, out: IO[bytes]) -> None:
        self.cwd, self.out = cwd, out
        self.env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(cwd)}

    def start(self, line: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(["bash", "-c", line], cwd=self.cwd, env=self.env, stderr=self.out)

    def run(self, line: str) -> None:
        subprocess.run(
            ["bash", "-c", line],
            cwd=self.cwd,
            env=self.env,
            stderr=self.out,
            check=True,
            timeout=180,
        )


def wait_listening(port: int) -> None:
    """Until the site accepts connections (the shell started it in the background)."""
    deadline = time.monotonic() + 30
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert time.monotonic() < deadline, f"nothing listens on {port}"
        time.sleep(0.05)
