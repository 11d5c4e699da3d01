"""Every command on bad input: one line on stderr naming what is wrong, a non-zero
exit, never a traceback. Run as the user runs them, in a process of their own
(``python -m cli``), with no $KUBECONFIG and an empty home.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def headroom(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
    environ.update(HOME=str(home), PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        capture_output=True,
        text=True,
        env=environ,
        cwd=home,
        timeout=60,
        check=False,
    )


def one_line_error(done: subprocess.CompletedProcess[str], code: int, *named: str) -> str:
    assert done.returncode == code, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for part in named:
        assert part in lines[0], (part, lines[0])
    return lines[0]


@pytest.fixture
def unreachable(tmp_path: Path) -> Path:
    """A kubeconfig for an apiserver that refuses connections (port 1 on 127.0.0.1)."""
    path = tmp_path / "unreachable.kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


@pytest.fixture
def malformed(tmp_path: Path) -> Path:
    path = tmp_path / "malformed.kubeconfig"
    path.write_text("clusters: [\n")
    return path


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    from certs.generate import generate

    generate(tmp_path / "pki", service="s", namespace="n")
    return tmp_path / "pki" / "ca.crt"


@pytest.mark.parametrize(
    "command",
    [
        ["top"],
        ["certs", "inject", "--webhook", "headroom", "--ca", "CA"],
        ["certs", "secret", "--namespace", "n", "--service", "s"],
        ["demo", "--duration", "5"],
    ],
    ids=["top", "certs-inject", "certs-secret", "demo"],
)
def test_a_malformed_kubeconfig_is_named(
    tmp_path: Path, malformed: Path, ca: Path, command: list[str]
) -> None:
    args = [str(ca) if a == "CA" else a for a in command]
    done = headroom(tmp_path, *args, "--kubeconfig", str(malformed))
    assert done.returncode != 0
    one_line_error(done, done.returncode, str(malformed), "line 2")


@pytest.mark.parametrize(
    ("command", "code"),
    [
        (["top"], 1),
        (["certs", "inject", "--webhook", "headroom", "--ca", "CA"], 1),
        (["certs", "secret", "--namespace", "n", "--service", "s"], 1),
    ],
    ids=["top", "certs-inject", "certs-secret"],
)
def test_an_unreachable_apiserver_is_one_line_naming_it(
    tmp_path: Path, unreachable: Path, ca: Path, command: list[str], code: int
) -> None:
    args = [str(ca) if a == "CA" else a for a in command]
    done = headroom(tmp_path, *args, "--kubeconfig", str(unreachable))
    one_line_error(done, code, "127.0.0.1", "port=1")


def test_top_without_any_kubeconfig_says_where_it_looked(tmp_path: Path) -> None:
    one_line_error(headroom(tmp_path, "top"), 2, "~/.kube/config")


@pytest.mark.parametrize("value", ["2s", "3500ms"])
def test_a_verify_after_a_bind_could_outlive_is_refused(tmp_path: Path, value: str) -> None:
    """A read sooner than a binding POST's own deadline (3 s) could find the pod unbound
    while the POST may still be stored, and release a charge that is about to land."""
    done = headroom(tmp_path, "extender", "--verify-after", value)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert "--verify-after" in error
    assert "at least 5s" in error
