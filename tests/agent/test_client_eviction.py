"""``PodActions.evict`` against kube-apiserver's answers, from a stand-in HTTP server.

A pod that two PodDisruptionBudgets select cannot be evicted: kube-apiserver's
eviction REST (``pkg/registry/core/pod/storage/eviction.go``, v1.34) refuses it
with a ``Status`` of ``Failure``, code 500, "This pod has more than one
PodDisruptionBudget, which the eviction subresource does not support." A tenant
with ``edit`` may write two budgets over their own pod: that is a refusal, after
which the service deletes the pod, not an error retried for ever. The real
apiserver's answer is checked end to end in ``tests/e2e/test_guard_policy.py``.
"""

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from agent.client import PodActions

MULTI_PDB = (
    "This pod has more than one PodDisruptionBudget, which the eviction subresource "
    "does not support."
)


def status(code: int, message: str, state: str = "Failure", reason: str = "") -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": state,
        "message": message,
        "reason": reason,
        "code": code,
    }


class Server:
    """Answers every POST with ``answer`` and records what it was sent."""

    def __init__(self) -> None:
        self.answer: tuple[int, dict[str, Any]] = (201, status(201, "", "Success"))
        self.requests: list[tuple[str, dict[str, Any]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                outer.requests.append((self.path, json.loads(self.rfile.read(length) or b"{}")))
                code, body = outer.answer
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    thread = threading.Thread(target=s.httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield s
    finally:
        s.httpd.shutdown()
        s.httpd.server_close()


def actions(server: Server) -> PodActions:
    config = client.Configuration(host=server.url)
    return PodActions(client.ApiClient(config), "gpu-node-1", timeout_seconds=5)


def test_two_disruption_budgets_are_a_refusal_not_an_error(server: Server) -> None:
    server.answer = (500, status(500, MULTI_PDB))
    assert actions(server).evict("ns", "nb", "uid-1", 30) is False
    path, body = server.requests[0]
    assert path == "/api/v1/namespaces/ns/pods/nb/eviction"
    assert body["deleteOptions"]["preconditions"] == {"uid": "uid-1"}


def test_other_server_errors_are_errors(server: Server) -> None:
    server.answer = (500, status(500, "etcdserver: request timed out", reason="InternalError"))
    with pytest.raises(ApiException, match="request timed out"):
        actions(server).evict("ns", "nb", "uid-1", 30)


def test_evicted_refused_and_gone(server: Server) -> None:
    server.answer = (201, status(201, "", "Success"))
    assert actions(server).evict("ns", "nb", "uid-1", 30) is True
    refusal = "Cannot evict pod as it would violate the pod's disruption budget."
    server.answer = (429, status(429, refusal, reason="TooManyRequests"))
    assert actions(server).evict("ns", "nb", "uid-1", 30) is False
    server.answer = (404, status(404, 'pods "nb" not found', reason="NotFound"))
    assert actions(server).evict("ns", "nb", "uid-1", 30) is True
