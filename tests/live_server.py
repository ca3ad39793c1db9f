"""A real server on 127.0.0.1 for the tests: a free port, uvicorn in a thread, bounded start-up.

Used by the retrieval, policy and MCP server tests (tests/ is on sys.path through conftest.py).

    with LiveServer(app) as url:   # "http://127.0.0.1:<port>"
        httpx.get(url + "/health")

`RawServer` is a bare HTTP/1.1 server on sockets, for what an ASGI server cannot do: close a
connection without answering, and count the connections its clients open.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """uvicorn serving `app` in a thread; `with LiveServer(app) as url`, or `start()` / `stop()`.

    `port` defaults to a free one; a fixed port lets a test stop a server and start another in
    its place. `lifespan="on"` for apps that need their startup hooks (fastmcp's http_app)."""

    def __init__(self, app, port: int | None = None, lifespan: str = "off"):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan=lifespan)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on port {self.port}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def __enter__(self) -> str:
        return self.start().url

    def __exit__(self, *exc) -> None:
        self.stop()


class RawServer:
    """A bare HTTP/1.1 server on 127.0.0.1, a thread per connection, keep-alive.

    The first `drops` requests are read and their connection closed with no answer (what a
    server does to a pooled keep-alive connection it closed as the request went out); the others
    get `200` with the JSON bytes `answer`, and the connection stays open. `seen` counts the
    requests, `connections` the connections accepted. `with RawServer(...) as server`."""

    def __init__(self, answer: bytes = b'{"ok": true}', drops: int = 0):
        self.answer, self.drops = answer, drops
        self.seen = self.connections = 0
        self.lock, self.stopping = threading.Lock(), threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:  # the 0.2 s accept timeout, or the socket closed by close()
                continue
            with self.lock:
                self.connections += 1
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(0.5)
            buf = b""
            while not self.stopping.is_set():
                try:
                    while b"\r\n\r\n" not in buf:
                        if not (chunk := conn.recv(65536)):
                            return  # the client closed it
                        buf += chunk
                    head, _, buf = buf.partition(b"\r\n\r\n")
                    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length")), 0)
                    while len(buf) < length:
                        if not (chunk := conn.recv(65536)):
                            return
                        buf += chunk
                except TimeoutError:
                    continue  # idle: look at `stopping` again
                except OSError:
                    return
                buf = buf[length:]
                with self.lock:
                    self.seen += 1
                    drop = self.seen <= self.drops
                if drop:
                    return  # closed with no answer
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(self.answer), self.answer))

    def close(self) -> None:
        self.stopping.set()
        self.sock.close()
        for t in self.threads:
            t.join(timeout=5)

    def __enter__(self) -> RawServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
