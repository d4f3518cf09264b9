"""Pipeline harness for end-to-end tests: a scripted receiver, endpoints, every stage."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from postbacks.codec import codec_for
from postbacks.core.endpoint import EndpointConfig
from postbacks.core.signing import generate_secret
from postbacks.db.connect import connect
from postbacks.db.crypto import SecretBox
from postbacks.db.endpoints import add_secret, upsert_endpoint
from postbacks.emit import ConversionProducer, with_instants
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, free_port, http_json, wait_for
from postbacks.tools.seed import seed_endpoints
from tests.kafka_util import scalar
from tests.unit.factories import make_conversion

STAGES = ("sink", "relay", "agent", "gate", "fanout")


def metrics_target(log_path: Path, timeout: float = 60) -> str:
    """The host:port a stage serves /metrics on, from the line its log says it on."""
    def found() -> str | None:
        urls = re.findall(r"metrics on http://(\S+)/metrics", log_path.read_text(errors="replace"))
        return urls[-1] if urls else None
    target: str = wait_for(found, timeout, what=f"the metrics address in {log_path.name}")
    return target


def dead_letters_counted(log_path: Path, stage: str) -> dict[str, float]:
    """A stage's ``webhook_dlq_total`` by reason, the reasons above 0."""
    url = f"http://{metrics_target(log_path)}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        page = r.read().decode()
    counted: dict[str, float] = {}
    for m in re.finditer(r'^webhook_dlq_total\{(.*)\} (\S+)$', page, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("stage") == stage and float(m.group(2)) > 0:
            counted[labels["reason"]] = float(m.group(2))
    return counted


def receiver_with_endpoints(stack: Stack, settings: Settings, namespace: str, *, apps: int,
                            endpoints_per_app: int, port: int | None = None,
                            ) -> tuple[str, list[Any]]:
    """Start the signature-verifying receiver, seed endpoints pointing at it and hand it
    their secrets; returns (its base URL, the seeded endpoints)."""
    port = port or free_port()
    stack.start("receiver", "receiver", "--port", str(port))
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: http_json(f"{base}/_control/stats"), 30, what="the receiver")
    seeded = seed_endpoints(settings, apps=apps, endpoints_per_app=endpoints_per_app,
                            receiver_url=base, namespace=namespace,
                            now_ms=int(time.time() * 1000))
    http_json(f"{base}/_control/secrets", {s.endpoint_id: [s.secret] for s in seeded})
    return base, list(seeded)


@dataclass
class Harness:
    settings: Settings
    stack: Stack
    namespace: str
    base: str = ""
    secrets: dict[str, str] = field(default_factory=dict)
    sent: int = 0

    def start_receiver(self) -> None:
        _, port = self.stack.start_listening(
            "receiver", "receiver", "--port", "{port}",
            ready=lambda p: http_json(f"http://127.0.0.1:{p}/_control/stats"))
        self.base = f"http://127.0.0.1:{port}"

    def endpoint(self, name: str, *, provider: str = "v3", url: str | None = None,
                 method: str = "POST", config: Mapping[str, Any] | None = None,
                 concurrency: int = 4) -> str:
        """Create an endpoint (own app ``app_<ns>_<name>``) with one secret; returns its id."""
        endpoint_id = f"ep_{self.namespace}_{name}"
        secret = generate_secret()
        box = SecretBox(self.settings.secrets_key.reveal())
        with connect(self.settings.database_url) as conn:
            upsert_endpoint(conn, endpoint_id=endpoint_id, app_id=self.app(name),
                            url=url or f"{self.base}/hooks/{endpoint_id}", provider=provider,
                            method=method, concurrency=concurrency,
                            config=EndpointConfig.from_json(config or {}))
            add_secret(conn, box, endpoint_id, secret, now_ms=int(time.time() * 1000))
            conn.commit()
        self.secrets[endpoint_id] = secret
        http_json(f"{self.base}/_control/secrets", {endpoint_id: [secret]})
        return endpoint_id

    def app(self, name: str) -> str:
        return f"app_{self.namespace}_{name}"

    def script(self, endpoint_id: str, **spec: Any) -> None:
        http_json(f"{self.base}/_control/script", {endpoint_id: spec})

    def start_stages(self, env: Mapping[str, str] | None = None) -> None:
        for stage in STAGES:
            self.stack.start(stage, stage, extra_env=env)

    def emit(self, name: str, count: int, *, checked: bool = True, **over: Any) -> list[str]:
        """Produce ``count`` conversions for app ``name`` through the producer helper; with
        ``checked=False`` as another producer would, without the helper's checks (the
        fan-out's own refusals under test)."""
        producer = ConversionProducer(self.settings)
        codec = codec_for("ConversionEvent")
        ids = []
        now = int(time.time() * 1000)
        for _ in range(count):
            self.sent += 1
            cid = f"cv_{self.namespace}_{self.sent:06d}"
            fields = {"occurred_at": now, "source_created_at": now - 1000,
                      "source_completed_at": now - 2000, **over}
            event = make_conversion(event_id=f"evt_{self.sent}", conversion_id=cid,
                                    app_id=self.app(name), **fields)
            if checked:
                producer.send(event)
            else:
                producer.send_raw(codec.encode(with_instants(event)), cid.encode())
            ids.append(cid)
        assert producer.flush() == 0
        return ids

    def received(self, endpoint_id: str | None = None) -> list[dict[str, Any]]:
        q = f"?endpoint={endpoint_id}" if endpoint_id else ""
        result: list[dict[str, Any]] = http_json(f"{self.base}/_control/received{q}")
        return result

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = http_json(f"{self.base}/_control/stats")
        return result

    def status_counts(self, endpoint_id: str) -> dict[str, int]:
        with connect(self.settings.database_url) as conn:
            rows = conn.execute("SELECT status, count(*) FROM deliveries WHERE endpoint_id = %s"
                                " GROUP BY status", (endpoint_id,)).fetchall()
        return {s: int(n) for s, n in rows}

    def wait_status(self, endpoint_id: str, status: str, n: int, timeout: float = 90) -> None:
        wait_for(lambda: self.status_counts(endpoint_id).get(status, 0) >= n, timeout,
                 what=f"{n} {status} deliveries of {endpoint_id}",
                 progress=lambda: self.status_counts(endpoint_id))

    def scalar(self, sql: str, params: Any = None) -> Any:
        return scalar(self.settings, sql, params)
