"""The layout guard: the card's top-level rooms exist, and imports follow the layering.

Floors, from the bottom up (an import may only point down or sideways within a room):

- ``topics.registry`` and ``schemas``: the single sources (topic names, Avro files); they
  import nothing of the project.
- ``postbacks.core``: the pure core (decisions as values; no clock, no I/O library).
- the rest of ``postbacks``: the shared adapters (Kafka, PostgreSQL, HTTP transport, codec,
  settings, metrics) and the ``postbacks`` command's helpers.
- ``topics.admin``, ``streams``, ``sinks``, ``replay_console``: the runners. They use the
  shared package and never each other.
- the entry points (``postbacks.cli``, ``postbacks.__main__``, ``postbacks.tools.demo``),
  which start the runners.

Third-party I/O libraries stay fenced in the modules that adapt them.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CARD_ROOMS = ["streams", "topics", "schemas/avro", "sinks", "replay_console", "deploy", "tests"]
PACKAGES = ["postbacks", "streams", "topics", "sinks", "replay_console", "schemas"]
RUNNER_ROOMS = ("streams", "sinks", "replay_console")
ENTRY_POINTS = frozenset({"postbacks.cli", "postbacks.__main__", "postbacks.tools.demo"})
CORE_MAY_IMPORT = ("postbacks.core", "postbacks.errors", "postbacks.ids", "postbacks.records",
                   "topics.registry", "topics", "schemas")

# library -> the module prefixes allowed to import it
FENCES: dict[str, tuple[str, ...]] = {
    "confluent_kafka": ("postbacks.kafka", "postbacks.emit", "postbacks.cli", "topics.admin",
                        "streams", "sinks"),
    "aiokafka": ("streams.anomaly_gate",),
    "faust": ("streams.anomaly_gate",),
    "mode": ("streams.anomaly_gate",),
    "httptools": ("postbacks.transport",),
    "httpx": ("postbacks.transport",),
    "aiohttp": ("postbacks.transport", "postbacks.errors", "replay_console",
                "postbacks.tools.receiver"),
    "psycopg": ("postbacks.db", "sinks", "replay_console", "streams.anomaly_gate.refresh"),
    "psycopg_pool": ("postbacks.db", "replay_console"),
    "sqlalchemy": ("postbacks.db",),
    "alembic": ("postbacks.db",),
    "prometheus_client": ("postbacks.metrics", "postbacks.metrics_local", "replay_console.web"),
    "jinja2": ("replay_console",),
    "fastavro": ("postbacks.codec", "postbacks.schema_compat"),
}


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _imports(path: Path) -> set[str]:
    """Every module an import statement names, at any depth (lazy and TYPE_CHECKING ones
    included: a cycle through a function body is still a cycle)."""
    out: set[str] = set()
    package = _module_name(path) if path.name == "__init__.py" else \
        _module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
    return out


def import_map() -> dict[str, set[str]]:
    modules = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    return {m: {i for i in _imports(p) if i in modules or i.split(".")[0] not in PACKAGES}
            for m, p in modules.items()}


def _under(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _room(module: str) -> str:
    return module.split(".")[0]


def _on_floor(module: str) -> bool:
    return module in ("topics", "topics.registry") or _under(module, ("schemas",))


def _runner(module: str) -> bool:
    return _room(module) in RUNNER_ROOMS or module == "topics.admin"


def violations(imports: Mapping[str, set[str]]) -> list[str]:
    """Every import against the layering, as ``importer -> imported: rule``."""
    own = {m for m in imports}
    bad: list[str] = []
    for mod, targets in sorted(imports.items()):
        for t in sorted(targets):
            top = t.split(".")[0]
            if t not in own and top in FENCES and not _under(mod, FENCES[top]):
                bad.append(f"{mod} -> {t}: {top} is fenced in {', '.join(FENCES[top])}")
            if t not in own:
                continue
            if _on_floor(mod) and _room(t) != _room(mod):
                bad.append(f"{mod} -> {t}: the floor imports nothing of the project")
            elif _under(mod, ("postbacks.core",)) and not _under(t, CORE_MAY_IMPORT):
                bad.append(f"{mod} -> {t}: the pure core imports only core, errors, ids, "
                           "records and the registries")
            elif (_room(mod) == "postbacks" and mod not in ENTRY_POINTS
                  and _room(t) in RUNNER_ROOMS):
                bad.append(f"{mod} -> {t}: the shared package does not reach up into a runner")
            elif _runner(mod) and _room(t) in RUNNER_ROOMS and _room(t) != _room(mod):
                bad.append(f"{mod} -> {t}: runners do not import each other")
    return bad


def cycles(imports: Mapping[str, set[str]]) -> list[list[str]]:
    """The import cycles between project modules (strongly connected components > 1)."""
    graph = {m: {t for t in ts if t in imports and t != m} for m, ts in imports.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = itertools.count()

    def visit(v: str) -> None:
        index[v] = low[v] = next(counter)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("room", CARD_ROOMS)
def test_the_cards_top_level_rooms_exist(room: str) -> None:
    assert (ROOT / room).is_dir(), f"{room}/ is missing at the repository root"


@pytest.mark.parametrize("path", ["pyproject.toml", "streams/fanout.py", "streams/gate.py",
                                  "streams/agent.py", "streams/relay.py", "sinks/postgres.py",
                                  "topics/registry.py", "topics/admin.py",
                                  "replay_console/web.py", "replay_console/cli.py"])
def test_each_stage_is_one_step_from_the_root(path: str) -> None:
    assert (ROOT / path).is_file()


def test_no_module_lives_twice() -> None:
    """A moved module leaves no copy or re-export shim behind."""
    stems: dict[str, list[str]] = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            if p.name != "__init__.py":
                stems.setdefault(p.read_text(), []).append(_module_name(p))
    assert [m for m in stems.values() if len(m) > 1] == []
    for gone in ("postbacks/streams", "postbacks/topics", "postbacks/sinks",
                 "postbacks/console", "postbacks/schemas"):
        assert not (ROOT / gone).exists(), f"{gone} is back"


def test_imports_follow_the_layering() -> None:
    assert violations(import_map()) == []


def test_no_import_cycles() -> None:
    assert cycles(import_map()) == []


# The guard itself: each rule catches what it is there for.
@pytest.mark.parametrize(("imports", "rule"), [
    ({"postbacks.core.retry": {"postbacks.kafka.stage"}, "postbacks.kafka.stage": set()},
     "the pure core"),
    ({"postbacks.core.retry": {"psycopg"}}, "psycopg is fenced"),
    ({"postbacks.db.endpoints": {"streams.agent"}, "streams.agent": set()},
     "does not reach up"),
    ({"replay_console.held": {"streams.anomaly_gate.admin"},
      "streams.anomaly_gate.admin": set()}, "runners do not import each other"),
    ({"topics.registry": {"postbacks.settings"}, "postbacks.settings": set()}, "the floor"),
    ({"streams.agent": {"faust"}}, "faust is fenced"),
    ({"topics.admin": {"sinks.postgres"}, "sinks.postgres": set()},
     "runners do not import each other"),
])
def test_the_guard_catches_a_violation(imports: dict[str, set[str]], rule: str) -> None:
    found = violations(imports)
    assert len(found) == 1 and rule in found[0]


def test_the_guard_catches_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_entry_points_may_start_runners() -> None:
    assert violations({"postbacks.cli": {"streams.agent"}, "streams.agent": set()}) == []
