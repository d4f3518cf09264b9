"""Hostname -> the addresses the SSRF policy allows (the agent's resolver).

Every name is looked up through :class:`VettingResolver`: ``loop.getaddrinfo`` (a thread
of the loop's pool per lookup), results cached for :data:`DNS_TTL_S`, failures for
:data:`DNS_FAILED_TTL_S`, and every address the SSRF policy refuses dropped. A lookup runs
on after the send that asked for it has given up (others may ask for the same name), so
a zone whose servers never answer would hold a thread per name for the resolver's whole
timeout; a receiver redirecting each delivery to a new name under it could take every
thread and stall every other endpoint's lookups. Lookups under one zone (a name's
registrable domain, :func:`zone_of`) therefore run at most :data:`ZONE_LOOKUPS` at once,
and past :data:`ZONE_WAITING` waiting for one, a lookup under that zone fails at once
(:class:`ZoneBusy`, not remembered as a failed name).

A zone's share alone still let a few zones take every thread round after round: eight
never-answering zones at four lookups each hold 32. So a zone is **slow** for
:data:`SLOW_TTL_S` after a lookup under it failed having taken past :data:`SLOW_S` (the
resolver gave up on its servers: a name that answers, however slowly, does not make its
zone slow), until one under it succeeds. Lookups under slow zones run at most
:data:`SLOW_ZONE_LOOKUPS` at once per zone and :data:`SLOW_LOOKUPS` all together; past
those they fail at once. A hostile zone still holds its first share for one of the
resolver's timeouts once every :data:`SLOW_TTL_S`.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from typing import TypeVar

from publicsuffixlist import PublicSuffixList

from postbacks.core.ssrf import blocked_reason, parse_host_literal

__all__ = ["DNS_FAILED_TTL_S", "DNS_TTL_S", "SLOW_LOOKUPS", "SLOW_S", "SLOW_TTL_S",
           "SLOW_ZONE_LOOKUPS",
           "ZONE_LOOKUPS", "ZONE_WAITING", "BlockedAddress", "Lookup", "VettingResolver",
           "ZoneBusy", "zone_of"]

DNS_TTL_S = 30.0
# A name that did not resolve is not asked again for this long: a broken delegation makes
# each lookup hang for the resolver's whole timeout on one of the few threads that serve
# every lookup, and every delivery to that endpoint would ask again.
DNS_FAILED_TTL_S = 5.0
_DNS_CACHE_MAX = 4096
ZONE_LOOKUPS = 4  # lookups in flight at once under one zone
ZONE_WAITING = 64  # lookups waiting for one of those, past which one fails at once
SLOW_S = 1.0  # a lookup that fails having run longer makes its zone slow
SLOW_TTL_S = 600.0  # ... for this long, or until a lookup under it succeeds
SLOW_LOOKUPS = 8  # lookups in flight at once under all slow zones together
SLOW_ZONE_LOOKUPS = 2  # ... and under one slow zone


class BlockedAddress(OSError):
    """Every address of the host is refused by the SSRF policy."""


Lookup = Callable[[str], Awaitable[list[str]]]
"""Name -> addresses (the DNS seam; the default is the system resolver)."""


async def _system_lookup(host: str) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, None, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return [str(info[4][0]) for info in infos]


class VettingResolver:
    """Hostname -> the addresses the SSRF policy allows, cached for ``ttl_s``.

    IP literals (any form :func:`parse_host_literal` knows) are judged without DNS.
    Raises :class:`BlockedAddress` when every address is refused (that verdict is cached
    too), ``socket.gaierror`` when the name does not resolve (cached for
    :data:`DNS_FAILED_TTL_S`).
    """

    def __init__(self, allow_loopback: bool, *, ttl_s: float = DNS_TTL_S,
                 lookup: Lookup | None = None) -> None:
        self._allow_loopback = allow_loopback
        self._ttl = ttl_s
        self._dns = lookup or _system_lookup
        self._cache: dict[str, tuple[float, tuple[str, ...] | str]] = {}
        self._failed: dict[str, tuple[float, OSError]] = {}
        self._pending: dict[str, asyncio.Task[tuple[str, ...] | str]] = {}
        self._zones: dict[str, _Zone] = {}
        self._slow: dict[str, tuple[float, None]] = {}  # zone -> slow until (loop time)
        self._slow_running = 0  # lookups started under slow zones, not ended yet

    async def resolve(self, host: str) -> tuple[str, ...]:
        loop = asyncio.get_running_loop()
        failed = self._failed.get(host)
        if failed is not None:
            if failed[0] > loop.time():
                raise failed[1].with_traceback(None)  # no frames kept from raise to raise
            del self._failed[host]
        hit = self._cache.get(host)
        if hit is None or hit[0] <= loop.time():
            task = self._pending.get(host)
            if task is None:
                task = self._pending[host] = loop.create_task(self._lookup(host))
                task.add_done_callback(functools.partial(self._settled, host))
            result = await asyncio.shield(task)
        else:
            result = hit[1]
        if isinstance(result, str):
            raise BlockedAddress(result)
        return result

    def _settled(self, host: str, task: asyncio.Task[tuple[str, ...] | str]) -> None:
        self._pending.pop(host, None)
        exc = None if task.cancelled() else task.exception()
        if isinstance(exc, OSError) and not isinstance(exc, ZoneBusy):
            now = asyncio.get_running_loop().time()
            self._failed = _room(self._failed, now)
            self._failed[host] = (now + DNS_FAILED_TTL_S, exc)
        if not task.cancelled() and task.exception() is None:
            now = asyncio.get_running_loop().time()
            self._cache = _room(self._cache, now)
            self._cache[host] = (now + self._ttl, task.result())

    async def _lookup(self, host: str) -> tuple[str, ...] | str:
        """The vetted addresses, or why none may be used."""
        literal = parse_host_literal(host)
        if literal is not None:
            if isinstance(literal, ipaddress.IPv6Address) and literal.ipv4_mapped is not None:
                literal = literal.ipv4_mapped
            addresses = [str(literal)]
        else:
            addresses = list(dict.fromkeys(await self._ask(host)))
        vetted = tuple(
            a for a in addresses if blocked_reason(a, allow_loopback=self._allow_loopback) is None
        )
        if vetted:
            return vetted
        reasons = {blocked_reason(a, allow_loopback=self._allow_loopback) for a in addresses}
        return f"{host}: refused ({', '.join(sorted(map(str, reasons)))})"

    async def _ask(self, host: str) -> list[str]:
        """One DNS lookup, within its zone's share of the lookups (see the module)."""
        name = zone_of(host)
        zone = self._zones.get(name)
        if zone is None:
            zone = self._zones[name] = _Zone()
        if zone.users >= ZONE_LOOKUPS + ZONE_WAITING:
            raise ZoneBusy(socket.EAI_AGAIN, f"{ZONE_LOOKUPS + ZONE_WAITING} lookups under "
                           f"{name} already in flight or waiting")
        zone.users += 1
        try:
            loop = asyncio.get_running_loop()
            self._refuse_if_slow(name, zone, loop.time())  # (not after waiting its turn)
            async with zone.slots:
                slow = self._refuse_if_slow(name, zone, loop.time())
                self._slow_running += slow
                zone.slow_running += slow
                started = loop.time()
                try:
                    addresses = await self._dns(host)
                except OSError:
                    ended = loop.time()
                    if ended - started > SLOW_S:
                        self._slow.pop(name, None)  # (re-inserted last: evicted last)
                        self._slow = _room(self._slow, ended)
                        self._slow[name] = (ended + SLOW_TTL_S, None)
                    raise
                finally:
                    self._slow_running -= slow
                    zone.slow_running -= slow
                self._slow.pop(name, None)  # it answers
                return addresses
        finally:
            zone.users -= 1
            if not zone.users:
                del self._zones[name]

    def _refuse_if_slow(self, name: str, zone: _Zone, now: float) -> bool:
        """Whether ``name`` is a slow zone (see the module); raises :class:`ZoneBusy` when
        slow zones' lookups, or this one's, are all taken."""
        until = self._slow.get(name)
        if until is None:
            return False
        if until[0] <= now:
            del self._slow[name]
            return False
        if self._slow_running >= SLOW_LOOKUPS or zone.slow_running >= SLOW_ZONE_LOOKUPS:
            raise ZoneBusy(socket.EAI_AGAIN, f"{name} failed to answer and its share of the "
                           "lookups under such zones is in flight")
        return True


class ZoneBusy(socket.gaierror):
    """A lookup not made: its zone's share is taken (not remembered as a failed name)."""


_PSL = PublicSuffixList()


@functools.lru_cache(maxsize=4096)
def zone_of(host: str) -> str:
    """The registrable domain of ``host`` (by the Public Suffix List, its private section
    included: ``api.bbc.co.uk`` -> ``bbc.co.uk``, ``app.herokuapp.com`` is its own), or the
    name itself when it has none."""
    name = host.rstrip(".").lower()
    return _PSL.privatesuffix(name) or name


class _Zone:
    __slots__ = ("slots", "slow_running", "users")

    def __init__(self) -> None:
        self.slots = asyncio.Semaphore(ZONE_LOOKUPS)
        self.users = 0
        self.slow_running = 0  # its lookups started while it was slow, not ended yet


_E = TypeVar("_E")


def _room(cache: dict[str, tuple[float, _E]], now: float) -> dict[str, tuple[float, _E]]:
    """``cache`` with room for one more entry: when full, without its expired entries and,
    if still over three quarters full, without its oldest (insertion order) down to three
    quarters. Many new names within a TTL (a macro in the host, a wildcard zone) used to
    grow it past the cap, each insertion copying it whole."""
    if len(cache) < _DNS_CACHE_MAX:
        return cache
    kept = {h: e for h, e in cache.items() if e[0] > now}
    keep = _DNS_CACHE_MAX * 3 // 4
    if len(kept) > keep:
        kept = dict(list(kept.items())[len(kept) - keep:])
    return kept
