"""A stand-in kube-apiserver for the agent's real API client: answers every request
with what the test sets, and records what it was sent.

For the answers a unit test cannot get from the real apiserver cheaply (a stored
report read at start, an eviction refused); e2e checks the real ones.
"""

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client

Answer = tuple[int, dict[str, Any]]


def status(code: int, message: str, state: str = "Failure", reason: str = "") -> dict[str, Any]:
    """A ``metav1.Status`` as the apiserver writes it."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": state,
        "message": message,
        "reason": reason,
        "code": code,
    }


class StandIn:
    """``answer(method, path)`` gives each response; ``requests`` holds (method, path,
    body) of every request, in order."""

    def __init__(self, answer: Callable[[str, str], Answer]) -> None:
        self.answer = answer
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                outer.requests.append((self.command, self.path, body))
                code, obj = outer.answer(self.command, self.path)
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _serve

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def api(self) -> client.ApiClient:
        return client.ApiClient(client.Configuration(host=self.url))


def serving(answer: Callable[[str, str], Answer]) -> Iterator[StandIn]:
    """Run a :class:`StandIn` for the length of a fixture."""
    standin = StandIn(answer)
    thread = threading.Thread(target=standin.httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield standin
    finally:
        standin.httpd.shutdown()
        standin.httpd.server_close()
