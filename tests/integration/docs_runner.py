"""Running the README's and docs/' code blocks as their reader runs them.

A :class:`Shell` stands for a user's terminal in a fresh clone: a folder holding the
checkout's ``.venv`` (a link to the test's virtualenv) and, once :class:`Served` started a
gateway there as `make run` does, its ``tidegate-data``. The environment starts as a fresh
login's (``PATH=/usr/local/bin:/usr/bin:/bin``, a home of its own) and keeps what each shell
block exports, as one terminal would; Python blocks are saved to a file and run with the
``python`` that shell finds, the interpreter the README names. The only changes made to a
block are the gateway's addresses (the tests' gateways listen on free ports) and a fixed
``sleep`` waiting for a tiering interval the test's gateway runs faster.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.services import FIRST_CONTACT_S, REPO_ROOT, free_port, wait_for_port

__all__ = ["Block", "Ran", "Served", "Shell", "blocks", "pages"]


@dataclass(frozen=True)
class Block:
    """A fenced code block of a page, under the page's nearest ``##`` heading."""

    page: str  # relative to the repository: "README.md", "docs/client.md"
    heading: str  # "" before the first "##"
    lang: str
    text: str
    line: int


def pages() -> list[Path]:
    """Every page whose code a reader may run: the README and docs/ (the design log holds
    none, and is checked for that)."""
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]


def blocks(page: Path, root: Path = REPO_ROOT) -> list[Block]:
    """The fenced code blocks of ``page`` (a page of the checkout at ``root``), in order."""
    out: list[Block] = []
    heading, fence, start, lang, lines = "", "", 0, "", []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if fence:
            if line.strip() == fence:
                rel = page.relative_to(root).as_posix()
                out.append(Block(rel, heading, lang, "\n".join(lines) + "\n", start))
                fence = ""
            else:
                lines.append(line)
            continue
        opened = re.match(r"^(```+)\s*([\w+-]*)\s*$", line)
        if opened:
            fence, lang, start, lines = opened.group(1), opened.group(2), number, []
        elif line.startswith("## "):
            heading = line[3:].strip()
    assert not fence, f"{page}: a code block opened at line {start} is never closed"
    return out


#: A line of DuckDB's progress bar: ``100% ▕████▏ (00:00:02.58 elapsed)``.
DUCKDB_BAR = re.compile(r"\s*\d{1,3}% ▕")


@dataclass
class Ran:
    """What a block did: its exit code and what it printed."""

    block: Block
    code: int
    out: str
    err: str

    def ok(self) -> bool:
        return self.code == 0 and "Traceback" not in self.out + self.err


class Served:
    """``tidegate serve`` run in ``folder`` as `make run` runs it there: data in
    ``folder/tidegate-data``, the operator key generated into it; free ports, and lake jobs
    as fast as ``env`` makes them."""

    def __init__(self, folder: Path, env: dict[str, str] | None = None) -> None:
        self.folder = folder
        self.data = folder / "tidegate-data"
        self.grpc, self.http, self.kafka = free_port(), free_port(), free_port()
        base = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
        self.env = {**base, **(env or {})}
        self.out = folder / "serve.out"
        with self.out.open("wb") as sink:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve", *self.args()],
                cwd=folder,
                env=self.env,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        wait_for_port(self.http, 120, self.proc)  # type: ignore[arg-type]
        for _ in range(1200):  # the ready line follows the ports by a moment
            if "tidegate is ready" in self.out.read_text():
                break
            assert self.proc.poll() is None, self.out.read_text()
            time.sleep(0.1)

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc}"

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.http}"

    def args(self) -> list[str]:
        return ["--grpc-port", str(self.grpc), "--http-port", str(self.http), "--kafka-port",
                str(self.kafka), "--data-dir", str(self.data)]  # fmt: skip

    def stop(self) -> str:
        """SIGTERM, as Ctrl-C in the terminal of `make run`; what it printed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)
        return self.out.read_text(errors="replace")


#: Variables of a fresh login shell that are not the user's doing (bash sets them itself).
_SHELL_OWN = {"_", "PWD", "OLDPWD", "SHLVL", "__TG_ENV"}


@dataclass
class Shell:
    """A user's terminal in a fresh clone (see the module's docstring)."""

    folder: Path
    #: text -> replacement, applied to every block (the gateway's addresses, a sleep).
    replace: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    ran: list[Ran] = field(default_factory=list)

    def __post_init__(self) -> None:
        home = self.folder / "home"
        home.mkdir(exist_ok=True)
        venv = self.folder / ".venv"
        if not venv.exists():
            venv.symlink_to(Path(sys.prefix))  # the checkout's `.venv`, which `make` made
        self.env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            # A gateway the test started answers within seconds, except on a machine loaded
            # many times over (tests/services.py, FIRST_CONTACT_S).
            "TIDEGATE_CONNECT_TIMEOUT": str(FIRST_CONTACT_S),
            **self.env,
        }

    def prepared(self, text: str) -> str:
        for old, new in self.replace.items():
            text = text.replace(old, new)
        return text

    def sh(self, block: Block, timeout: float = 300) -> Ran:
        """A shell block in this terminal: bash, stopping at the first failing command;
        what it exports stays for the next blocks."""
        env_file = self.folder / ".env-after"
        script = self.prepared(block.text) + '\nenv -0 > "$__TG_ENV"\n'
        proc = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", script],
            cwd=self.folder,
            env={**self.env, "__TG_ENV": str(env_file)},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode == 0:
            pairs = env_file.read_text().split("\0")
            self.env = {
                k: v
                for k, _, v in (p.partition("=") for p in pairs if "=" in p)
                if k not in _SHELL_OWN
            }
        return self._record(block, proc)

    def python(self, block: Block, name: str, timeout: float = 600) -> Ran:
        """A Python block saved as ``name`` in the folder and run as ``python name`` in
        this terminal (the README names that interpreter)."""
        (self.folder / name).write_text(self.prepared(block.text))
        proc = subprocess.run(
            ["bash", "-c", f"python {name}"],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return self._record(block, proc)

    def _record(self, block: Block, proc: subprocess.CompletedProcess[str]) -> Ran:
        # DuckDB draws a progress bar on stdout when a query takes seconds (a busy machine).
        out = "".join(
            line for line in proc.stdout.splitlines(keepends=True) if not DUCKDB_BAR.match(line)
        )
        ran = Ran(block, proc.returncode, out, proc.stderr)
        self.ran.append(ran)
        return ran


def expected_output(block: Block) -> list[str]:
    """The lines a Python block says it prints: its comment lines right below a print."""
    lines = block.text.splitlines()
    return [
        line.removeprefix("# ")
        for prev, line in itertools.pairwise(lines)
        if line.startswith("# ") and "print(" in prev
    ]
