"""A worker module whose consumer cannot start: Celery logs "Unrecoverable
error" and stops the worker (``test_an_unrecoverable_error_exits_non_zero``).
Imported only by that test's worker process."""

from celery.worker.consumer import consumer


def _fail(self: consumer.Consumer) -> None:
    raise RuntimeError("this consumer cannot start")


consumer.Consumer.start = _fail  # type: ignore[method-assign]
