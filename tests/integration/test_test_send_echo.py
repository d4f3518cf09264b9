"""A test-send's response excerpt masks the endpoint's API key where the receiver echoes
it, also across the excerpt's 256-byte cut: it was masked after the cut, so a key
straddling it kept its first bytes."""

from __future__ import annotations

import asyncio
import dataclasses
import http.server
import threading
from typing import Any

from postbacks.core.endpoint import Endpoint, EndpointConfig, SigningSecret
from postbacks.settings import Settings
from replay_console import endpoints as console_endpoints

KEY = "sk_live_0123456789abcdef0123456789abcdef"


class _Echo(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b"x" * 245 + self.headers["X-Api-Key"].encode() + b"y" * 40
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


def test_a_key_echoed_across_the_excerpts_cut_is_masked(settings: Settings) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ep = Endpoint("ep_echo", "app_echo", f"http://127.0.0.1:{server.server_port}/hook",
                      frozenset({"*"}), config=EndpointConfig(headers={"X-Api-Key": KEY}),
                      secrets=(SigningSecret("s1", b"k" * 32, 0),))
        result = asyncio.run(console_endpoints.test_send(dataclasses.replace(settings,
                                                           allow_loopback_targets=True), ep))
    finally:
        server.shutdown()
        server.server_close()
    excerpt = result["response"]["body_excerpt"]
    assert result["response"]["status"] == 200, result
    assert excerpt.startswith("x" * 245) and "sk_liv" not in excerpt, excerpt
    assert excerpt[245:] == "[redacted]y"  # masked, then cut at 256 bytes
