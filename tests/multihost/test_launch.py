"""launch/multihost.py's command dispatch (no processes started)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.multihost import procs


@pytest.fixture(scope="module")
def mh():
    spec = importlib.util.spec_from_file_location("multihost_launch", procs.REPO / "launch/multihost.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_split_command(mh):
    assert mh.split_command(["--config", "a.yaml"]) == ("jaxppo.cli.train", ["--config", "a.yaml"])
    assert mh.split_command([]) == ("jaxppo.cli.train", [])
    assert mh.split_command(["dpo", "--config", "d.yaml", "x=1"]) == ("jaxppo.cli.dpo", ["--config", "d.yaml", "x=1"])
    for name in ["train", "evaluate", "reward", "collect"]:
        module = f"jaxppo.cli.{name}"
        assert mh.split_command([name, "--config", "c"])[0] == module
    with pytest.raises(SystemExit, match="unknown command 'trian'"):
        mh.split_command(["trian", "--config", "c"])


def test_heartbeat_from_environment(mh):
    assert mh.distributed_kwargs({"JAXPPO_HEARTBEAT_TIMEOUT_S": "12"}) == {"heartbeat_timeout_seconds": 12}


def test_dead_peers_reads_the_runtime_reports(mh):
    heartbeat = ("E1206 coordination_service.cc:1549] ... UNAVAILABLE: The following tasks are unhealthy (stopped "
                 "sending heartbeats):\n1\nThe tasks have crashed.")
    assert mh.dead_peers(heartbeat) == [1]
    assert mh.dead_peers("UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):\n2, 3\n") == [2, 3]
    assert mh.dead_peers("DEADLINE_EXCEEDED: Task 3 heartbeat timeout. This indicates that the remote task") == [3]
    assert mh.dead_peers("[enforce fail at gloo/transport/tcp/pair.cc:511] Received data size doesn't match") == []
    assert mh.dead_peers("W1206 spmd_partitioner.cc:656] Involuntary full rematerialization") is None
