"""Open event streams end soon after their token is revoked.

A token is checked when a request arrives; an event stream then stays open
for as long as its job or conversation runs. Every :attr:`Revocations.every`
seconds (:data:`RECHECK`, or the keep-alive interval if shorter) one query
reads which of the open streams' tokens are still valid (their ids, the
primary key: one read for all of this process's streams, none per event);
a stream whose token was revoked (or deleted) since gets an ``event:
error`` with the 401 body (``AuthenticationError``) and ends. A check that
fails (Postgres away) ends every open stream with a 503 body, as a stream
whose reading fails does: a stream is never served on a token that could
not be checked for longer than the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from orchestrator.client import Client
from orchestrator.errors import AuthenticationError, ChorusError, ServiceUnavailableError
from orchestrator.store import token_sql

log = logging.getLogger(__name__)

#: Longest time, in seconds, between two checks of the open streams' tokens.
RECHECK = 5.0


class Revocations:
    """This process's open streams, by their token's id, and the task
    that checks those tokens (:meth:`run`, from the app's lifespan)."""

    def __init__(self, client: Client, every: float) -> None:
        self._client = client
        self.every = every
        self._open: dict[str, set[asyncio.Future[ChorusError]]] = {}

    @contextlib.contextmanager
    def watching(self, token_id: str) -> Iterator[asyncio.Future[ChorusError]]:
        """While open: a future that is set to the error the stream must
        end with once its token is no longer valid."""
        ended: asyncio.Future[ChorusError] = asyncio.get_running_loop().create_future()
        streams = self._open.setdefault(token_id, set())
        streams.add(ended)
        try:
            yield ended
        finally:
            streams.discard(ended)
            if not streams:
                self._open.pop(token_id, None)

    async def run(self) -> None:
        """Check the open streams' tokens every :attr:`every` seconds, forever."""
        while True:
            await asyncio.sleep(self.every)
            await self.check()

    async def check(self) -> None:
        """End the streams whose token is revoked (all, if the check fails)."""
        ids = list(self._open)
        if not ids:
            return
        try:
            valid = await asyncio.to_thread(self._valid, ids)
        except Exception as exc:
            log.warning("could not check the tokens of the open event streams", exc_info=exc)
            error = ServiceUnavailableError(f"checking the token failed: {type(exc).__name__}")
            self._end(ids, error)
            return
        revoked = [token_id for token_id in ids if token_id not in valid]
        self._end(revoked, AuthenticationError("the token was revoked"))

    def _valid(self, ids: list[str]) -> set[str]:
        with self._client.runtime.session() as session:
            return token_sql.unrevoked(session, ids)

    def _end(self, ids: list[str], error: ChorusError) -> None:
        for token_id in ids:
            for ended in self._open.get(token_id, ()):
                if not ended.done():
                    ended.set_result(error)
