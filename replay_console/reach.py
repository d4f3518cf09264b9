"""Where a console user may send on an endpoint's behalf, and what an edit may change.

Reach (:func:`check_reach`), checked first: a test-send or an edit & replay to a URL whose
host is not the endpoint's own (the host of its stored URL) nor in its ``test_hosts``
config is refused (403) for support, as is plain ``http`` for an ``https`` endpoint; a
reviewer or an admin may target any host, but only an admin may send an endpoint's custom
headers (credentials, shown to admins only) to such a host, and nobody sends them over
plain ``http`` when the endpoint's URL is ``https``. Edit
rights (:func:`check_edit`): support may retarget an edit and replay or a test-send, not
change what it tells the receiver (the query, the macros of the path, fields, aliases).
Then the SSRF check of the URL typed (:func:`check_target`, a DNS lookup): after the
role's checks, so a support token cannot use it to map names it may not send to."""

from __future__ import annotations

import logging
import socket
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from urllib.parse import urlsplit

from postbacks.core.endpoint import Endpoint
from postbacks.core.macros import RenderError, macro_sequence
from postbacks.core.override import Override, host_of, same_target, scheme_of
from postbacks.core.ssrf import blocked_reason, parse_host_literal, url_blocked_reason
from replay_console.auth import Principal, may
from replay_console.rules import ActionError, Lookup

log = logging.getLogger(__name__)

__all__ = ["WIDE_REACH", "TargetRefused", "check_edit", "check_reach", "check_target"]


# --- SSRF check of a URL someone typed --------------------------------------------------

def _system_lookup(host: str) -> list[str]:
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return [str(i[4][0]) for i in infos]


# A check's lookup runs on threads of its own and is waited for at most LOOKUP_S: it runs
# while the caller holds a database connection (and, for an edit & replay, the replay
# lock), and a name whose servers never answer -- a publisher controls its own domain's --
# held them for as long as the resolver tried (10-30 s), stalling every other replay and,
# four at once, every request's sign-in check. A lookup still running when its wait ends
# keeps its thread (getaddrinfo cannot be cancelled); past LOOKUP_THREADS of them, new
# lookups wait their turn within the same LOOKUP_S, and are refused when it ends.
LOOKUP_S = 5.0
LOOKUP_THREADS = 4
_lookups = ThreadPoolExecutor(LOOKUP_THREADS, thread_name_prefix="console-dns")


def _bounded(lookup: Lookup, host: str) -> list[str]:
    fut = _lookups.submit(lookup, host)
    try:
        return fut.result(timeout=LOOKUP_S)
    except FutureTimeout:
        fut.cancel()  # (one still waiting for a thread never runs)
        raise OSError(f"no answer within {LOOKUP_S:.0f} s") from None


class TargetRefused(str):
    """A refusal by :func:`check_target` (an address the SSRF policy refuses, a name that
    does not resolve, or a URL it does not accept): a problem of a save that is audited,
    as the same refusal of a test-send or an edit & replay is."""


def check_target(url: str, *, allow_loopback: bool, lookup: Lookup | None = None
                       ) -> TargetRefused | None:
    """Why ``url`` may not be a postback target, or None. Stricter than the transport
    (which connects only to the allowed addresses of a name): a URL is refused on save
    when its host resolves to ANY refused address, or does not resolve."""
    problem = url_blocked_reason(url, allow_loopback=allow_loopback)
    if problem:
        return TargetRefused(f"{url}: {problem}")
    host = urlsplit(url).hostname or ""
    if parse_host_literal(host) is not None:
        return None  # an allowed literal (url_blocked_reason judged it)
    # One answer whether the name does not resolve or resolves to a refused address, and
    # neither the address nor its kind: a caller could map internal names with them. The
    # log has the detail.
    refused = TargetRefused(
        f"{url}: host {host!r} does not resolve to an address postbacks may send to")
    try:
        addresses = _bounded(lookup or _system_lookup, host)
    except (OSError, UnicodeError) as exc:
        log.info("reach: %s does not resolve (%s)", host, exc)
        return refused
    if not addresses:
        log.info("reach: %s resolves to no address", host)
        return refused
    for a in addresses:
        why = blocked_reason(a, allow_loopback=allow_loopback)
        if why:
            log.info("reach: %s resolves to %s, refused (%s)", host, a, why)
            return refused
    return None


# --- reach: which hosts a role may send a test or an edited replay to ------------------

WIDE_REACH = ("reviewer", "admin")  # may target any host that passes the SSRF check


def check_reach(p: Principal, endpoint: Endpoint, url: str) -> None:
    """Refuse (403) a send to ``url`` on ``endpoint``'s behalf that ``p`` may not make: a
    role outside :data:`WIDE_REACH` may target only the host of the endpoint's stored URL
    and the hosts of its ``test_hosts`` config, and not over ``http`` when the endpoint's
    URL is ``https``; a role without ``edit_endpoint`` (not an admin) may not send the
    endpoint's custom headers to any other host; and no role sends an ``https``
    endpoint's custom headers over ``http`` (in clear). A reviewer or an admin may send a
    request without custom headers over http, to a test receiver for one."""
    try:
        urlsplit(url)
    except ValueError:
        return  # unparseable: the URL's own check refuses it (400)
    if scheme_of(endpoint.url) == "https" and scheme_of(url) == "http" and (
            endpoint.config.headers or p.role not in WIDE_REACH):
        raise ActionError(
            "the endpoint's URL is https: its request is not sent over plain http"
            + (f" with its custom headers ({', '.join(sorted(endpoint.config.headers))})"
               if endpoint.config.headers else " by a " + p.role)
            + "; use https", 403, scheme="http")
    own = host_of(endpoint.url)
    host = host_of(url)
    listed = bool(host) and host in endpoint.config.test_hosts
    if may(p, "edit_endpoint"):
        return
    if (host and host == own and endpoint.config.headers and not listed
            and not same_target(endpoint.url, url)):
        raise ActionError(
            f"the endpoint has custom headers ({', '.join(sorted(endpoint.config.headers))})"
            ", which only an admin may send to another path or port of its host (one host "
            "may serve many tenants): ask an admin, or an admin to add the host to "
            "test_hosts", 403, host=host, headers=sorted(endpoint.config.headers))
    if listed or (host and host == own):
        return
    if p.role in WIDE_REACH:
        if not endpoint.config.headers:
            return
        raise ActionError(
            f"the endpoint has custom headers ({', '.join(sorted(endpoint.config.headers))})"
            f", which only an admin may send to a host other than its own ({own or 'none'})"
            " or its test_hosts: ask an admin", 403, host=host,
            headers=sorted(endpoint.config.headers))
    hosts = ", ".join(endpoint.config.test_hosts) or "none"
    raise ActionError(
        f"a {p.role} may send to the endpoint's own host ({own or 'none'}) or its "
        f"test_hosts ({hosts}) only; {host or url[:80]!r} needs a reviewer or an admin "
        f"(ask one to send it, or an admin to add the host to test_hosts)", 403,
        host=host, allowed=[own, *endpoint.config.test_hosts])


# Path text that some servers read as something other than the path (Spring and Tomcat
# drop what follows ';' in a segment; a decoded %2F adds a segment): a value put before
# a macro that way is what the receiver reads.
_PATH_TRICKS = (";", "%2f", "%5c")


def _macro_tail(path: str) -> str:
    """The path from the start of the segment holding its first macro ("" without one):
    literal text there, or a segment added among the macros, changes the values a receiver
    reads by position (``/pb/{conversion_id}/9999/{payout_usd}``)."""
    first = path.find("{")
    return "" if first < 0 else path[path.rfind("/", 0, first) + 1:]


def check_edit(p: Principal, endpoint: Endpoint, override: Override) -> None:
    """Refuse (403) an edit that ``p`` may not make: a role outside :data:`WIDE_REACH` may
    retarget a replay (another scheme, host, port or path, to a host :func:`check_reach`
    allows) but not change what it tells the receiver: the query and the macros of the
    endpoint's URL stay as they are, and fields and aliases need a reviewer. A replay is
    signed with the live secret and skips the anomaly gate, so a literal payout in a query,
    macros swapped in the path, or an alias moving another value into the payout's field,
    would be paid as sent. (The path's macros must come in the same order, repeats
    included, and the path from the segment of its first macro on stays as it is: only the
    part before it may change, without a ';' or an encoded slash.)"""
    if p.role in WIDE_REACH:
        return
    why: list[str] = []
    if override.fields is not None or override.aliases is not None:
        why.append("fields and aliases")
    if override.url is not None:
        try:
            old, new = urlsplit(endpoint.url), urlsplit(override.url)
            if new.query != old.query:
                why.append("the URL's query")
            elif macro_sequence(new.path) != macro_sequence(old.path):
                why.append("the macros in the URL's path")
            elif _macro_tail(new.path) != _macro_tail(old.path):
                why.append("the URL's path from its first macro on")
            elif any(t in new.path.lower() and t not in old.path.lower() for t in _PATH_TRICKS):
                why.append("a ';' or an encoded slash in the URL's path")
        except (ValueError, RenderError):  # unparseable: the edit's own check refuses it (400)
            pass
    if why:
        raise ActionError(
            f"a {p.role} may retarget an edit and replay (scheme, host, port, path) but not "
            f"change {' or '.join(why)}: that changes what the receiver is told, money "
            "included, and a replay skips the anomaly gate; ask a reviewer or an admin", 403,
            changed=why)
