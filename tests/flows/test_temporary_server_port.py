"""Two stages with one seed pick different temporary Prefect server ports (flows._stage)."""

from __future__ import annotations

import os
import subprocess
import sys

from flows import REPO

SCRIPT = """
import random
from flows._stage import pick_temporary_server_port
port = pick_temporary_server_port()
random.seed(0)  # what make_stage_deterministic does after it
from prefect.server.api.server import SubprocessASGIServer
assert SubprocessASGIServer().port == port  # the instance Prefect's clients start keeps it
print(port)
"""


def test_stages_of_one_seed_get_their_own_temporary_server_port(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {"PYTHONPATH": str(REPO), "PREFECT_HOME": str(tmp_path)}
    procs = [
        subprocess.Popen([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    ports = [int(p.communicate(timeout=300)[0].split()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert ports[0] != ports[1] and all(1024 < p < 65536 for p in ports), ports


def test_a_configured_prefect_api_needs_no_temporary_port() -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows._stage import pick_temporary_server_port

    # Prefect's own override: an environment variable set here would not reach settings that an
    # earlier test's flow already fixed in this process
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:4200/api"}):
        assert pick_temporary_server_port() is None
