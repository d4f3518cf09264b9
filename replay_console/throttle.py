"""Throttling of failed sign-ins, and the bounded audit of refused requests.

:class:`SignInThrottle`: a token presented at ``POST /login`` or as ``Authorization:
Bearer`` that signs nothing in is a failure, counted against the client address and
against the presented token's first :data:`PREFIX_CHARS` characters (console tokens carry
no id, so the prefix is of what was presented). Once a key has :data:`LIMIT` failures
within :data:`WINDOW_S` seconds, every sign-in attempt under that key is answered 429 with
``Retry-After`` until its oldest counted failure leaves the window, a correct token
included, so a guesser learns nothing from the answer. A refused attempt is not counted
(the window is not pushed out by the refusals themselves); a successful sign-in does not
clear a key. The counts are held in this process: each console instance counts its own.
At most :data:`MAX_KEYS` keys are tracked; past that the least recently failing ones are
forgotten first.

:class:`RefusalAudit`: every 403 and 429 the console answers writes an ``audit_log`` row
(actor the principal or ``anonymous:<address>``, action ``refused.<action>``, the status
and reason in ``after``): one row per actor, action, status and reason a minute (a
repeat of the same refusal is not written again; a refusal for another reason, another
target named in it, is), at most :data:`AUDIT_PER_ACTOR` rows a minute per actor and
:data:`AUDIT_PER_MINUTE` per instance. Refusals before sign-in (``anonymous:``) have a
budget of their own (:data:`AUDIT_ANONYMOUS_PER_MINUTE`, and are not told apart by path),
so a flood of them from many addresses cannot spend the budget that records what signed-in
actors were refused. A refusal the handler marks for audit (a probe of an internal host,
an edit refused, a cookie of an ended session) is written past those budgets, up to
:data:`AUDIT_MARKED_PER_ACTOR` a minute per signed-in actor (:data:`AUDIT_PER_ACTOR` per
address before sign-in). What a minute's budgets leave out is written after it as one
``refused.unaudited`` row per actor, with the count, and in the log.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg
from aiohttp import web
from psycopg.types.json import Jsonb

__all__ = ["AUDIT_ANONYMOUS_PER_MINUTE", "AUDIT_MARKED_PER_ACTOR", "AUDIT_PER_ACTOR",
           "AUDIT_PER_MINUTE", "LIMIT", "MAX_KEYS", "PREFIX_CHARS", "WINDOW_S",
           "ActionLimit", "RefusalAudit", "SignInThrottle", "Throttled", "client_address"]

log = logging.getLogger("postbacks.console")

LIMIT = 10
WINDOW_S = 300.0
PREFIX_CHARS = 8
MAX_KEYS = 10_000
AUDIT_PER_MINUTE = 1_000
AUDIT_PER_ACTOR = 60
AUDIT_ANONYMOUS_PER_MINUTE = 200
AUDIT_MARKED_PER_ACTOR = 600
ANONYMOUS = "anonymous:"
_RETRY_IN = re.compile(r": try again in \d+ s$")  # a 429's wait: the same refusal


class Throttled(Exception):
    """Too many failed sign-ins under a key (or too many of an action): answer 429 with
    ``Retry-After``."""

    def __init__(self, retry_after_s: int,
                 what: str = "too many failed sign-ins from this address or for this token"
                 ) -> None:
        super().__init__(f"{what}: try again in {retry_after_s} s")
        self.retry_after_s = retry_after_s


def client_address(request: web.Request,
                   trusted_proxies: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]
                   ) -> str:
    """The client's address: the peer, or, when the peer is a trusted proxy, the last
    address it appended to ``X-Forwarded-For``."""
    peer = request.remote or "unknown"
    forwarded = request.headers.get("X-Forwarded-For", "")
    if forwarded and trusted_proxies:
        try:
            ip = ipaddress.ip_address(peer)
        except ValueError:
            return peer
        if any(ip in net for net in trusted_proxies):
            last = forwarded.split(",")[-1].strip()
            try:
                return str(ipaddress.ip_address(last))
            except ValueError:
                return peer
    return peer


class SignInThrottle:
    """Failed sign-ins per client address and per presented-token prefix (thread-safe)."""

    def __init__(self, *, limit: int = LIMIT, window_s: float = WINDOW_S,
                 max_keys: int = MAX_KEYS) -> None:
        self.limit = limit
        self.window_s = window_s
        self.max_keys = max_keys
        self._fails: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def keys(address: str, presented: str) -> tuple[str, ...]:
        prefix = presented.strip()[:PREFIX_CHARS]
        return (f"addr:{address}",) + ((f"prefix:{prefix}",) if prefix else ())

    def check(self, keys: Sequence[str], *, now: float | None = None,
              what: str | None = None) -> None:
        """Raise :class:`Throttled` when any key is at the limit (``what``: its message)."""
        t = time.monotonic() if now is None else now
        wait = 0.0
        with self._lock:
            for k in keys:
                q = self._fails.get(k)
                if q is None:
                    continue
                while q and q[0] <= t - self.window_s:
                    q.popleft()
                if not q:
                    del self._fails[k]
                elif len(q) >= self.limit:
                    wait = max(wait, q[0] + self.window_s - t)
        if wait > 0:
            raise (Throttled(max(1, math.ceil(wait))) if what is None
                   else Throttled(max(1, math.ceil(wait)), what))

    def failed(self, keys: Sequence[str], *, now: float | None = None) -> None:
        """Count one failed sign-in under each key."""
        t = time.monotonic() if now is None else now
        with self._lock:
            for k in keys:
                q = self._fails.pop(k, None)
                if q is None:
                    q = deque(maxlen=self.limit)
                q.append(t)
                self._fails[k] = q  # the most recently failing last
            while len(self._fails) > self.max_keys:
                self._fails.popitem(last=False)

    def __len__(self) -> int:
        return len(self._fails)


class ActionLimit:
    """At most ``per_target`` uses of an action per target and ``per_actor`` per actor
    within ``window_s`` (test-sends: the console must not become a way to flood a
    publisher's endpoint, nor one user's way to flood many). Counted in this process."""

    def __init__(self, action: str, *, per_target: int, per_actor: int,
                 window_s: float = 60.0, max_keys: int = MAX_KEYS) -> None:
        self.action = action
        self._target = SignInThrottle(limit=per_target, window_s=window_s, max_keys=max_keys)
        self._actor = SignInThrottle(limit=per_actor, window_s=window_s, max_keys=max_keys)

    def take(self, target: str, actor: str, *, now: float | None = None) -> None:
        """Count one use, or raise :class:`Throttled` (nothing counted) at either limit."""
        t = time.monotonic() if now is None else now
        self._target.check((target,), now=t, what=(
            f"too many {self.action}s to this endpoint (at most {self._target.limit} in "
            f"{self._target.window_s:g} s)"))
        self._actor.check((actor,), now=t, what=(
            f"too many {self.action}s by you (at most {self._actor.limit} in "
            f"{self._actor.window_s:g} s)"))
        self._target.failed((target,), now=t)
        self._actor.failed((actor,), now=t)


_NAME = re.compile(r"[^a-z]+")


def route_action(request: web.Request, action: str | None) -> str:
    """``refused.<action>``: the action the request named, else its route, e.g.
    ``refused.endpoints_id`` (letters and underscores, as the audit filter takes)."""
    if action:
        name = _NAME.sub("_", action.lower()).strip("_")
    else:
        info = request.match_info.route.resource
        path = info.canonical if info is not None else "unmatched"
        path = path.removeprefix("/api/v1")
        name = _NAME.sub("_", path.lower()).strip("_") or "home"
    return f"refused.{name[:40]}"


class RefusalAudit:
    """Writes the audit row of a refused request, bounded (see the module doc)."""

    def __init__(self, per_minute: int = AUDIT_PER_MINUTE,
                 anonymous_per_minute: int = AUDIT_ANONYMOUS_PER_MINUTE) -> None:
        self.per_minute = per_minute
        self.anonymous_per_minute = anonymous_per_minute
        self._minute = -1
        self._seen: set[tuple[str, str, int, str, str]] = set()
        self._rows = {True: 0, False: 0}  # this minute's rows: anonymous, signed in
        self._per_actor: dict[str, int] = {}
        self._dropped: dict[str, int] = {}
        self._unaudited: list[tuple[str, int, int]] = []  # (actor, count, minute) to write
        self._lock = threading.Lock()

    def admit(self, actor: str, action: str, status: int = 403, reason: str = "", *,
              path: str = "", now: float | None = None, marked: bool = False) -> bool:
        """Whether to write this row: the first of its (actor, action, status, reason,
        path) this minute, and within the minute's budgets (one harmless refusal used to
        hide every other refusal of its action that minute: probes of internal hosts, or of
        other deliveries' paths, included). ``marked``: the handler asked for its audit."""
        minute = int((time.time() if now is None else now) // 60)
        anonymous = actor.startswith(ANONYMOUS)
        with self._lock:
            if minute != self._minute:
                self._roll(minute)
            key = (actor, action, status, _RETRY_IN.sub("", reason[:500]),
                   "" if anonymous else path[:200])
            if key in self._seen:
                return False
            rows = self._per_actor.get(actor, 0)
            budget = self.anonymous_per_minute if anonymous else self.per_minute
            if marked:  # (anonymous: a cookie this console signed, its session ended)
                over = rows >= (AUDIT_PER_ACTOR if anonymous else AUDIT_MARKED_PER_ACTOR)
            else:
                over = self._rows[anonymous] >= budget or rows >= AUDIT_PER_ACTOR
            if over:
                self._dropped[actor] = self._dropped.get(actor, 0) + 1
                return False
            self._seen.add(key)
            self._rows[anonymous] += 1
            self._per_actor[actor] = rows + 1
            return True

    def _roll(self, minute: int) -> None:
        if self._dropped:
            log.warning("console: %d refused requests were not audited in the last minute "
                        "(over the budgets), by %d actor(s)", sum(self._dropped.values()),
                        len(self._dropped))
            # the anonymous ones in one row: their addresses are the flood, not the news
            anon = sum(n for a, n in self._dropped.items() if a.startswith(ANONYMOUS))
            self._unaudited.extend((a, n, self._minute) for a, n in self._dropped.items()
                                   if not a.startswith(ANONYMOUS))
            if anon:
                self._unaudited.append((ANONYMOUS + "*", anon, self._minute))
            del self._unaudited[:-1000]  # (bounded, should nothing write them)
        self._minute, self._seen, self._dropped = minute, set(), {}
        self._rows = {True: 0, False: 0}
        self._per_actor = {}

    def take_unaudited(self, now: float | None = None) -> list[tuple[str, int, int]]:
        """(actor, refusals not written, minute) of the minutes already over, once."""
        minute = int((time.time() if now is None else now) // 60)
        with self._lock:
            if minute != self._minute:
                self._roll(minute)
            out, self._unaudited = self._unaudited, []
        return out

    async def record(self, run: Callable[[Callable[[psycopg.Connection[Any]], None]],
                                         Awaitable[None]],
                     actor: str, action: str, path: str, status: int, reason: str, *,
                     marked: bool = False) -> None:
        """Write this refusal's row if :meth:`admit` takes it, and the rows of what earlier
        minutes left out, through ``run`` (the console's pool); best effort."""
        admitted = self.admit(actor, action, status, reason, path=path, marked=marked)
        unaudited = self.take_unaudited()
        if not admitted and not unaudited:
            return

        def write(conn: psycopg.Connection[Any]) -> None:
            self.write_unaudited(conn, unaudited)
            if admitted:
                self.write(conn, actor, action, path, status, reason)

        try:
            await run(write)
        except Exception:  # the refusal stands; its audit row is best effort
            log.exception("console: could not audit a refused request")

    @staticmethod
    def write_unaudited(conn: psycopg.Connection[Any],
                        rows: list[tuple[str, int, int]]) -> None:
        for actor, count, minute in rows:
            conn.execute(
                "INSERT INTO audit_log (actor, action, target_type, target_id, after)"
                " VALUES (%s, 'refused.unaudited', 'console_route', '*', %s)",
                (actor[:200], Jsonb({"count": count, "minute_start_s": minute * 60})))

    @staticmethod
    def write(conn: psycopg.Connection[Any], actor: str, action: str, path: str,
              status: int, reason: str) -> None:
        conn.execute(
            "INSERT INTO audit_log (actor, action, target_type, target_id, after)"
            " VALUES (%s, %s, 'console_route', %s, %s)",
            (actor[:200], action, path[:200], Jsonb({"status": status, "reason": reason[:500]})),
        )
