"""Serve one viewer page on 127.0.0.1 (never on other interfaces), for `starpo view --serve`."""

from __future__ import annotations

import http.server
import threading
import time
from pathlib import Path

from starpo.errors import UserError
from starpo.viewer.html import build_viewer, content_security_policy


def _handler_for(page: Path) -> type[http.server.BaseHTTPRequestHandler]:
    """A handler that serves exactly `page` at `/` and `/<name>`, and 404 for anything else.

    Serving the whole run folder would expose checkpoints and configs; the page needs
    nothing but itself.
    """

    class PageHandler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path.split("?", 1)[0] not in ("/", "/" + page.name):
                self.send_error(404, "only the viewer page is served")
                return
            body = page.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Security-Policy", content_security_policy())
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # keep the terminal for the URL, not per-request logs

    return PageHandler


def serve(path: Path, port: int = 0) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve the page at `path` on 127.0.0.1:`port` (0 picks a free port) in a thread.

    Returns the server (call `.shutdown()` then `.server_close()` to stop) and its URL.
    """
    page = Path(path).resolve()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _handler_for(page))
    thread = threading.Thread(target=server.serve_forever, name="starpo-view", daemon=True)
    thread.start()
    host, bound_port = server.server_address[:2]
    return server, f"http://{host}:{bound_port}/"


def view_main(run_dir: str, serve: bool = False, port: int = 0) -> int:
    """`starpo view RUN [--serve] [--port N]`: build the page, print its path, maybe serve.

    Raises `UserError` for a folder without trajectories, a port out of range or one that
    cannot be bound (the CLI prints it as one line).
    """
    if serve and not 0 <= port <= 65535:
        raise UserError(f"--port must be between 0 and 65535 (0: any free port), got {port}")
    page = build_viewer(Path(run_dir))
    print(page)
    if not serve:
        return 0
    try:
        server, url = _serve(page, port)
    except OSError as exc:  # in use, or below 1024 without the right to bind it
        raise UserError(
            f"cannot serve on 127.0.0.1:{port} ({exc.strerror or exc}); choose another --port, "
            "or 0 for any free one"
        ) from None
    print(f"serving {url} (Ctrl-C to stop)", flush=True)
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
    return 0


_serve = serve  # view_main's `serve` flag shadows the function name inside it
