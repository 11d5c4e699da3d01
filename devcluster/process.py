"""Background processes with a pid, a log file and a readiness probe.

Each component of the local cluster is started in its own session (so it
outlives ``headroom cluster up`` and can be stopped as a group), writes stdout
and stderr to ``<state>/logs/<name>.log``, and is known by a :class:`Component`
record that the state file keeps, so that a later ``down``, ``status`` or
``restart`` from another process can act on it.
"""

import contextlib
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

Progress = Callable[[str], None]

# Popen objects of the children this Python process started: kept so that they
# are reaped (no zombies, no ResourceWarning) when they exit or are stopped.
_children: dict[int, subprocess.Popen[bytes]] = {}


class ProcessError(RuntimeError):
    """A component died or never became ready; the message names it and quotes its log."""


@dataclass(frozen=True)
class Probe:
    """``GET url`` answers 2xx. TLS is verified against ``ca`` (or not at all when
    ``ca`` is empty, for components serving a self-signed cert), with an optional
    client certificate."""

    url: str
    ca: str = ""
    cert: str = ""
    key: str = ""

    def ok(self) -> bool:
        context: ssl.SSLContext | None = None
        if self.url.startswith("https:"):
            context = ssl.create_default_context(cafile=self.ca or None)
            if not self.ca:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if self.cert:
                context.load_cert_chain(self.cert, self.key)
        try:
            with urllib.request.urlopen(self.url, timeout=2, context=context) as response:
                return 200 <= int(response.status) < 300
        except (urllib.error.URLError, OSError, ValueError):
            return False


@dataclass
class Component:
    name: str
    argv: list[str]
    log: str
    env: dict[str, str] = field(default_factory=dict)
    probe: Probe | None = None
    pid: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Component":
        probe = data.get("probe")
        return cls(
            name=data["name"],
            argv=list(data["argv"]),
            log=data["log"],
            env=dict(data.get("env") or {}),
            probe=Probe(**probe) if probe else None,
            pid=data.get("pid"),
        )

    def alive(self) -> bool:
        """True while our process runs; a recycled pid running something else is not ours."""
        if self.pid is None:
            return False
        child = _children.get(self.pid)
        if child is not None:
            # Our own child: poll() knows (and /proc shows Python's cmdline until exec).
            return child.poll() is None
        try:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return False
        state = stat.rsplit(")", 1)[-1].split()[0]
        return state not in ("Z", "X") and cmdline[0] == self.argv[0].encode()

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = Path(self.log).read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def start(self) -> None:
        if self.alive():
            return
        Path(self.log).parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            log.write(f"--- starting: {' '.join(self.argv)}\n".encode())
            log.flush()
            child = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,
            )
        _children[child.pid] = child
        self.pid = child.pid

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL what is left after ``grace`` seconds."""
        if self.pid is None:
            return
        if self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.1)
            if self.alive():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, signal.SIGKILL)
        child = _children.pop(self.pid, None)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)
        self.pid = None

    def wait_ready(self, timeout: float, progress: Progress | None = None) -> None:
        """Until the probe answers (or, without one, the process stays up a moment)."""
        started = time.monotonic()
        deadline = started + timeout
        settle = 1.0 if self.probe is None else 0.0
        while True:
            if not self.alive():
                raise ProcessError(
                    f"{self.name} exited while starting; last lines of {self.log}:\n"
                    f"{self.log_tail()}"
                )
            elapsed = time.monotonic() - started
            if self.probe.ok() if self.probe else elapsed >= settle:
                if progress:
                    progress(f"{self.name} ready ({elapsed:.1f}s)")
                return
            if time.monotonic() > deadline:
                raise ProcessError(
                    f"{self.name} not ready after {timeout:.0f}s"
                    f"{f' ({self.probe.url})' if self.probe else ''}; "
                    f"last lines of {self.log}:\n{self.log_tail()}"
                )
            time.sleep(0.2)
