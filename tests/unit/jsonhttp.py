"""A real HTTP server on loopback answering GET requests with JSON, for the tests that talk
to a Prometheus-shaped API (doctor's listen-address check, gpueff's live answers)."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: ``answer(path, query)`` -> the JSON body, or ``None`` for 404.
Answer = Callable[[str, str], Any]


class JsonServer:
    """Serves ``answer`` in a thread while used as a context manager; ``url`` is its base."""

    def __init__(self, answer: Answer) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query).get("query", [""])[0]
                found = answer(url.path, query)
                if found is None:
                    self.send_error(404)
                    return
                body = json.dumps(found).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> JsonServer:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()
