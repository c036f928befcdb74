"""Two processes (``launch/multihost.py``, jax.distributed on 127.0.0.1), process 1 SIGKILLed: process 0 stops with
one line naming process 1 and the last complete checkpoint, and exit status 76, instead of the runtime's native abort
(kept in ``crash-process0.log``). (SIGTERM to one of two processes: ``tests/multihost/test_train_two_processes.py``.)"""

from __future__ import annotations

import re
import signal
import time

import pytest

from tests.faults.conftest import TINY
from tests.multihost import procs
from tests.resume_helpers import rows

REPO = procs.REPO
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _start(stories_model, data, out, logdir, *extra: str):
    return procs.start(procs.python(str(REPO / "launch/multihost.py"), "train", f"model.path={stories_model}",
                                    f"data.path={data}", f"trainer.output_dir={out}", *TINY, "data.eval_fraction=0",
                                    "trainer.save_every=2", "trainer.log_every=1", "trainer.total_steps=400",
                                    *procs.MESH, *extra),
                       n=2, devices=procs.DEVICES, logdir=logdir, env={"JAXPPO_HEARTBEAT_TIMEOUT_S": "8"})


def _wait_for(path, ps, limit: float = 600) -> None:
    t0 = time.monotonic()
    while not path.is_dir():
        assert time.monotonic() - t0 < limit and all(p.poll() is None for p, _, _ in ps), \
            "\n".join(r.describe() for r in procs.wait(ps, 1))
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.processes
def test_a_dead_peer_is_one_line_naming_it_and_the_last_checkpoint(tmp_path, stories_model, scored_data):
    out = tmp_path / "run"
    ps = _start(stories_model, scored_data, out, tmp_path / "logs")
    _wait_for(out / "checkpoints" / "2", ps)
    ps[1][0].send_signal(signal.SIGKILL)        # its supervisor: the training child dies with it
    res = procs.wait(ps, timeout=180)
    survivor = res[0]
    assert survivor.returncode == 76, survivor.describe()
    last = survivor.stderr.strip().splitlines()[-1]
    m = re.fullmatch(r"launch/multihost\.py: process 0: (process 1 of 2 died \(it stopped sending heartbeats\)|a peer "
                     r"process of 2 died \(its connection to process 0 was lost\)); the run stopped; last complete "
                     r"checkpoint: step (\d+) in (\S+); restart every process with trainer\.resume=auto "
                     r"\(runtime report in (\S+)\)", last)
    assert m, survivor.stderr[-3000:]
    assert int(m[2]) >= 2 and (out / "checkpoints" / m[2]).is_dir() and m[3] == str(out / "checkpoints")
    assert m[4] == str(out / "crash-process0.log") and (out / "crash-process0.log").read_text().strip()
    assert "Traceback" not in survivor.stderr and "Fatal Python error" not in survivor.stderr
    logged = [r["step"] for r in rows(out / "metrics.jsonl")]
    assert logged == list(range(1, len(logged) + 1)) and len(logged) >= int(m[2])
