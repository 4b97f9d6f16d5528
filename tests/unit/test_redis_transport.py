"""A ``redis://`` broker goes through Chorus's transport (one Redis client
per channel); any other broker keeps kombu's own."""

from __future__ import annotations

from kombu.transport.redis import Transport as KombuRedis

from orchestrator.celery_conf import make_celery
from orchestrator.redis_transport import Transport
from orchestrator.settings import Settings


def test_a_redis_broker_channel_builds_one_client_and_another_broker_is_kombus() -> None:
    redis_app = make_celery(Settings(redis_url="redis://127.0.0.1:6379/0"))
    with redis_app.connection_for_write() as connection:
        assert isinstance(connection.transport, Transport)
        assert isinstance(connection.transport, KombuRedis)  # kombu's, but for the client
        channel = connection.default_channel
        assert channel._create_client() is channel._create_client()

    amqp = Settings(broker_url="amqp://guest@127.0.0.1//", result_backend="redis://127.0.0.1/0")
    with make_celery(amqp).connection_for_write() as connection:
        assert not isinstance(connection.transport, Transport)
