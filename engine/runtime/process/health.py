"""The process's HTTP endpoints: /metrics (Prometheus), /healthz (liveness: the loop made
progress) and /readyz (readiness: tasks are assigned, none is restoring (the answer names those
that are), and none of the reasons that stop deciding holds: writes refused for ISR starvation
first, then a duplicate instance id)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from engine.runtime.process.metrics import EngineMetrics


def serve_health(metrics: EngineMetrics, port: int) -> ThreadingHTTPServer:
    """Start /metrics, /healthz and /readyz on 0.0.0.0:port in a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                body, status = generate_latest(metrics.registry), 200
                content_type = CONTENT_TYPE_LATEST
            elif self.path == "/healthz":
                alive = metrics.liveness()
                body = b"ok\n" if alive else b"no loop progress within the liveness timeout\n"
                status, content_type = (200 if alive else 503), "text/plain"
            elif self.path == "/readyz":
                refused, restoring = metrics.writes_refused, metrics.restoring
                ready = metrics.is_ready and refused is None and not restoring
                if refused:
                    why = f"not ready: {refused}"
                elif restoring:
                    why = f"restoring partitions {', '.join(map(str, restoring))}"
                else:
                    why = metrics.unready_reason or "restoring or unassigned"
                body = b"ready\n" if ready else f"{why}\n".encode()
                status, content_type = (200 if ready else 503), "text/plain"
            else:
                body, status, content_type = b"not found\n", 404, "text/plain"
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True, name="health").start()
    return server
