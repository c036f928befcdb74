"""Real processes: when one of 2 processes is SIGKILLed, the other stops (non-zero exit) within 60 s with a
message naming the failed process, instead of waiting forever in a collective."""

from __future__ import annotations

import re

from tests.multihost import procs

WORKER = str(procs.REPO / "tests" / "multihost" / "worker.py")


def test_survivor_exits_within_60_s(tmp_path):
    # heartbeat timeout 10 s (launch/multihost.py's default of 30 s is what test_dpo_two_processes.py's kill test
    # runs under): the survivor must stop, naming task 1, well within the 60 s bound checked below
    res = procs.run(procs.python(WORKER, "one_dies", str(tmp_path)), n=2, devices=4, timeout=240,
                    logdir=tmp_path / "logs", env={"JAXPPO_HEARTBEAT_TIMEOUT_S": "10"})
    dead, survivor = res[1], res[0]
    assert dead.returncode == -9, dead.describe()
    assert "first collective ok: 28.0" in survivor.stdout, survivor.describe()
    m = re.search(r"entering the second collective at ([0-9.]+)", survivor.stdout)
    assert m, survivor.describe()
    assert survivor.returncode not in (0, None), survivor.describe()  # None: still running at the timeout
    assert "second collective returned" not in survivor.stdout
    waited = (tmp_path / "logs" / "proc0.err").stat().st_mtime - float(m.group(1))
    assert waited < 60, f"process 0 needed {waited:.0f} s to stop\n{survivor.describe()}"
    text = survivor.stderr
    assert re.search(r"task 1 heartbeat timeout", text, re.IGNORECASE), text[-3000:]
