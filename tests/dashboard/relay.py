"""A TCP relay in front of the test server that a test can cut: every
connection through it is closed at once, as when a network drops, while the
server keeps running (a page's event stream ends mid-way and it reconnects
through the relay, which keeps accepting)."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class Relay:
    """Relays ``127.0.0.1:<port>`` to ``127.0.0.1:<upstream>``."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.cuts = 0
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self._listener.accept()
            except OSError:  # closed
                return
            try:
                far = socket.create_connection(("127.0.0.1", self.upstream), timeout=5)
            except OSError:
                near.close()
                continue
            far.settimeout(None)
            with self._lock:
                self._open |= {near, far}
            for source, sink in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            self._close(source, sink)

    def _close(self, *ends: socket.socket) -> None:
        with self._lock:
            self._open -= set(ends)
        for end in ends:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def cut(self) -> None:
        """Close every connection now (new ones are still relayed)."""
        with self._lock:
            ends = list(self._open)
        self._close(*ends)
        self.cuts += 1

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self._listener.close()
        self.cut()

    def __enter__(self) -> Relay:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()
