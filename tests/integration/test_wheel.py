"""The installed wheel holds the whole product: every room, its data files and the compiled
codec, and ``postbacks --help`` runs from it alone (no checkout on the path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(ROOT)],
        capture_output=True, text=True, timeout=600, check=False)
    assert build.returncode == 0, build.stderr[-3000:]
    (found,) = out.glob("postbacks-*.whl")
    return found


def test_the_wheel_holds_every_room_and_its_data(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in ("postbacks/cli.py", "postbacks/core/fanout.py", "streams/agent.py",
                   "streams/anomaly_gate/runner.py", "topics/registry.py", "sinks/postgres.py",
                   "replay_console/web.py", "replay_console/cli.py", "schemas/__init__.py"):
        assert module in names, module
    for data in [*ROOT.glob("schemas/avro/*.avsc"), *ROOT.glob("replay_console/templates/*"),
                 *ROOT.glob("postbacks/db/migrations/*.sql"),
                 *ROOT.glob("postbacks/db/alembic/*.py"),
                 *ROOT.glob("postbacks/db/alembic/versions/*.py")]:
        assert str(data.relative_to(ROOT)) in names, data.name
    assert any(n.startswith("postbacks/avro_c.") and n.endswith(".so") for n in names)
    assert not any(n.startswith(("tests/", "bench/")) for n in names)


def test_postbacks_runs_from_the_wheel_alone(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    helped = subprocess.run([sys.executable, "-m", "postbacks", "--help"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=120, check=False)
    assert helped.returncode == 0, helped.stderr
    for command in ("fanout", "gate", "agent", "relay", "sink", "console", "held", "demo"):
        assert command in helped.stdout
    probe = (
        "import json, postbacks, streams, topics, sinks, replay_console, schemas;"
        "from postbacks.codec import load_schema_versions;"
        "from replay_console.http import _env;"
        "_env().get_template('base.html');"
        "print(json.dumps({'files': [m.__file__ for m in (postbacks, streams, topics, sinks,"
        " replay_console, schemas)], 'records': sorted(load_schema_versions())}))"
    )
    ran = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout)
    assert all(f.startswith(str(site)) for f in seen["files"]), seen["files"]
    assert seen["records"] == ["Attempt", "BreakerState", "ConversionEvent", "DeadLetter",
                               "Delivery", "OperationalEvent", "Outcome", "PayoutPartial"]
