"""The resolver's share of lookups per zone: a zone whose servers never answer holds at
most ZONE_LOOKUPS of the lookup threads, so other endpoints' names still resolve."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import pytest

from postbacks.transport.resolver import (
    ZONE_LOOKUPS,
    ZONE_WAITING,
    VettingResolver,
    ZoneBusy,
    zone_of,
)


def test_a_zone_that_never_answers_holds_its_share_and_no_more() -> None:
    asked: list[str] = []
    hang = asyncio.Event()

    async def lookup(host: str) -> list[str]:
        asked.append(host)
        if host.lower().endswith("hostile.test"):
            await hang.wait()  # a server that never answers (released at the end)
        return ["93.184.216.34"]

    async def main() -> None:
        r = VettingResolver(False, lookup=lookup)
        # each send gives up after its deadline; the lookups it started go on
        for n in range(3 * ZONE_LOOKUPS):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(r.resolve(f"u{n}.Hostile.Test"), 0.01)
        assert len([h for h in asked if "hostile" in h.lower()]) == ZONE_LOOKUPS
        assert await asyncio.wait_for(r.resolve("good.test"), 1) == ("93.184.216.34",)
        # past the waiting room, at once: a name that does not resolve (for now)
        for n in range(ZONE_WAITING - 2 * ZONE_LOOKUPS):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(r.resolve(f"w{n}.hostile.test"), 0.01)
        with pytest.raises(socket.gaierror, match=r"under hostile\.test"):
            await asyncio.wait_for(r.resolve("late.hostile.test"), 1)
        hang.set()  # the servers answer: every waiting lookup ends, the zone is forgotten
        assert await asyncio.wait_for(r.resolve("again.hostile.test"), 1) == ("93.184.216.34",)
        await asyncio.sleep(0)
        assert not r._zones

    asyncio.run(main())


def test_zones_are_registrable_domains_not_public_suffixes() -> None:
    assert zone_of("api.bbc.co.uk") == zone_of("www.BBC.co.uk.") == "bbc.co.uk"
    assert zone_of("r1.attacker.co.uk") == "attacker.co.uk"
    assert zone_of("one.herokuapp.com") != zone_of("two.herokuapp.com")
    assert zone_of("u7.hostile.test") == "hostile.test" and zone_of("localhost") == "localhost"


def test_a_busy_zone_holds_up_no_other_under_the_same_public_suffix_nor_is_remembered() -> None:
    hang = asyncio.Event()

    async def lookup(host: str) -> list[str]:
        if host.endswith("attacker.co.uk"):
            await hang.wait()
        return ["93.184.216.34"]

    async def main() -> None:
        r = VettingResolver(False, lookup=lookup)
        for n in range(ZONE_LOOKUPS + ZONE_WAITING):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(r.resolve(f"r{n}.attacker.co.uk"), 0.01)
        assert await asyncio.wait_for(r.resolve("api.bbc.co.uk"), 1) == ("93.184.216.34",)
        with pytest.raises(ZoneBusy):
            await asyncio.wait_for(r.resolve("late.attacker.co.uk"), 1)
        hang.set()  # the zone answers again: the name refused while it was busy resolves
        for _ in range(100):
            if not r._zones:
                break
            await asyncio.sleep(0.01)
        assert await asyncio.wait_for(r.resolve("late.attacker.co.uk"), 1) == (
            "93.184.216.34",)

    asyncio.run(main())


def test_many_new_names_keep_the_cache_at_its_cap_and_each_lookup_cheap() -> None:
    """A macro in the host, or a wildcard zone: a new name every send. The cache grew past
    its cap for a whole TTL, each insertion copying it (seconds of CPU per 5,000 names)."""
    from postbacks.transport import resolver

    async def lookup(host: str) -> list[str]:
        return ["93.184.216.34"] if not host.startswith("bad") else ["10.0.0.1"]

    async def main() -> None:
        r = VettingResolver(False, lookup=lookup)
        for n in range(3 * resolver._DNS_CACHE_MAX):
            name = f"{'bad' if n % 2 else 'u'}{n}.wild.test"
            if n % 2:
                with pytest.raises(resolver.BlockedAddress):
                    await r.resolve(name)  # refusals are cached too
            else:
                await r.resolve(name)
            assert len(r._cache) <= resolver._DNS_CACHE_MAX
        assert await r.resolve(f"u{3 * resolver._DNS_CACHE_MAX - 2}.wild.test")  # newest kept

    start = time.process_time()
    asyncio.run(main())
    assert time.process_time() - start < 10  # (was quadratic: minutes at this count)


def test_many_hostile_zones_together_hold_no_more_than_their_first_shares(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight zones whose servers never answer (each lookup ends at the resolver's timeout),
    four lookups each, held all 32 of the agent's lookup threads round after round, and
    every other endpoint's lookup timed out. A lookup that failed having taken past SLOW_S
    makes its zone slow: lookups under slow zones together run at most SLOW_LOOKUPS at
    once, and the rest fail at once. A zone that answers slowly is not slow."""
    from postbacks.transport import resolver

    monkeypatch.setattr(resolver, "SLOW_S", 0.1)
    running: list[str] = []
    most = [0]

    async def lookup(host: str) -> list[str]:
        if ".hostile" in host:
            running.append(host)
            most[0] = max(most[0], len(running))
            try:
                await asyncio.sleep(0.3)  # the resolver's timeout
            finally:
                running.remove(host)
            raise socket.gaierror(socket.EAI_AGAIN, "timed out")
        if host.startswith("slowly."):
            await asyncio.sleep(0.2)  # a slow name server that answers
        return ["93.184.216.34"]

    async def main() -> None:
        r = VettingResolver(False, lookup=lookup)
        assert await r.resolve("slowly.legit.test") == ("93.184.216.34",)

        async def attack(n: int) -> None:
            """A send per zone asking a new name, each giving up (its lookup goes on)."""
            sends = [asyncio.ensure_future(r.resolve(f"n{n}.z{z}.hostile{z}.test"))
                     for z in range(8)]
            for _ in range(5):
                await asyncio.sleep(0)
            for t in sends:
                t.cancel()
            for t in sends:
                with contextlib.suppress(asyncio.CancelledError, socket.gaierror):
                    await t

        for n in range(ZONE_LOOKUPS):  # the first shares, before any zone is known slow
            await attack(n)
        assert len(running) == 8 * ZONE_LOOKUPS
        await asyncio.sleep(0.4)  # they time out, past SLOW_S: every hostile zone is slow
        assert not running
        most[0] = 0
        for n in range(ZONE_LOOKUPS, 4 * ZONE_LOOKUPS):  # it keeps asking new names
            await attack(n)
            await asyncio.sleep(0.02)
        assert 0 < most[0] <= resolver.SLOW_LOOKUPS, most[0]
        assert await asyncio.wait_for(r.resolve("good.test"), 1) == ("93.184.216.34",)
        assert "legit.test" not in r._slow  # answered slowly: not held with the others
        assert await asyncio.wait_for(r.resolve("b.legit.test"), 1) == ("93.184.216.34",)
        await asyncio.sleep(0.4)
        assert r._slow_running == 0 and not r._zones

    asyncio.run(main())


def test_a_slow_zone_is_held_to_its_share_until_a_lookup_under_it_succeeds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from postbacks.transport import resolver

    monkeypatch.setattr(resolver, "SLOW_S", 0.05)
    answers = asyncio.Event()

    async def lookup(host: str) -> list[str]:
        if not answers.is_set():
            await asyncio.sleep(0.1)
            raise socket.gaierror(socket.EAI_AGAIN, "timed out")
        return ["93.184.216.34"]

    async def main() -> None:
        r = VettingResolver(False, lookup=lookup)
        with pytest.raises(socket.gaierror):
            await r.resolve("a.flaky.test")
        assert "flaky.test" in r._slow
        sends = [asyncio.ensure_future(r.resolve(f"n{i}.flaky.test")) for i in range(4)]
        got = await asyncio.gather(*sends, return_exceptions=True)
        busy = [g for g in got if isinstance(g, ZoneBusy)]
        assert len(busy) == 4 - resolver.SLOW_ZONE_LOOKUPS  # its share: the rest at once
        assert r._slow_running == 0
        answers.set()  # its servers answer again
        assert await r.resolve("b.flaky.test") == ("93.184.216.34",)
        assert "flaky.test" not in r._slow

    asyncio.run(main())
