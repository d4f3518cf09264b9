"""A stage that restarted in place because the brokers went away (a cluster outage longer
than a transaction's deadline) used to fail its start-up check and exit for good (code 2):
under Compose it stayed down. A restarted copy now tries again every 5 s, counting each
try in ``postbacks_restarts_in_place_total``, and goes on once the brokers answer. A fresh
start still fails fast (test_startup_errors.py)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import threading
import time
from collections.abc import Iterator

from confluent_kafka import Producer

from postbacks.codec import codec_for
from postbacks.kafka.watchdog import RESTARTS_ENV
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, free_port, wait_for
from tests.kafka_util import decode, read_topic
from tests.unit.factories import make_delivery
from topics import TOPICS


@contextlib.contextmanager
def forwarder(port: int, target: str) -> Iterator[None]:
    """127.0.0.1:``port`` forwarded to ``target`` (host:port) until the block ends: the
    bootstrap address a stage was started with, reachable from now on."""
    host, tport = target.rsplit(":", 1)
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        w.close()

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection(host, int(tport))
        await asyncio.gather(pipe(r, uw), pipe(ur, w))

    def run() -> None:
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(asyncio.start_server(serve, "127.0.0.1", port))
        ready.set()
        loop.run_forever()
        server.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(10)
    try:
        yield
    finally:
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)


def _restarts(page: str) -> float:
    got = re.search(r"^postbacks_restarts_in_place_total (\S+)$", page, re.M)
    return float(got.group(1)) if got else 0.0


def test_a_restarted_stage_waits_for_the_brokers_and_goes_on(
        settings: Settings, stack: Stack) -> None:
    port = free_port()
    relay = stack.start("relay", "relay", extra_env={
        "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",  # nothing there yet
        RESTARTS_ENV: "1"})  # as a copy restarted in place would be
    wait_for(lambda: "trying again in 5 s" in relay.tail(4000), 60,
             what="the relay's copy waiting for the brokers", progress=lambda: relay.tail(400))
    assert relay.alive(), relay.tail(4000)

    p = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers})
    d = make_delivery(delivery_id="dlv_after_outage", endpoint_id="ep_outage",
                      due_at=int(time.time() * 1000))
    p.produce(settings.topic(TOPICS.retry_tier("5s").base),
              codec_for("Delivery").encode(d), b"ep_outage")
    assert p.flush(10) == 0
    with forwarder(port, settings.kafka_bootstrap_servers):  # the brokers are back
        [m] = read_topic(settings, TOPICS.dispatch.base, 1, timeout=120)
        assert decode("Delivery", m)["delivery_id"] == "dlv_after_outage"
        assert relay.alive()
        assert _restarts(relay.metrics() or "") >= 2  # the copy it was, and each wait


def test_a_stage_waiting_for_the_brokers_stops_on_sigterm(stack: Stack) -> None:
    """A supervisor stopping a copy that waits for the brokers: it ends at once (it used to
    exec a new copy after its wait, which never heard of the SIGTERM)."""
    relay = stack.start("relay-waiting", "relay", extra_env={
        "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}", RESTARTS_ENV: "1"})
    wait_for(lambda: "trying again in 5 s" in relay.tail(4000), 60,
             what="the relay's copy waiting for the brokers", progress=lambda: relay.tail(400))
    relay.popen.send_signal(signal.SIGTERM)
    assert relay.popen.wait(timeout=10) == 0, relay.tail(4000)
