"""Real processes: decisions are taken once under 2 processes x 4 devices. The broadcast helpers given different
local inputs return process 0's value everywhere; a checkpoint damaged only where process 1 reads (its own
``ocdbt.process_1`` shard files) is skipped by BOTH processes, which restore the same older step."""

from __future__ import annotations

import json

import numpy as np

from tests.multihost import procs

WORKER = str(procs.REPO / "tests" / "multihost" / "worker.py")


def test_decisions_are_taken_once(tmp_path):
    res = procs.run(procs.python(WORKER, "decisions", str(tmp_path)), n=2, devices=4, timeout=150,
                    logdir=tmp_path / "logs")
    assert all(r.returncode == 0 for r in res), "\n".join(r.describe() for r in res)
    got = [dict(np.load(tmp_path / f"decisions.{i}.npz")) for i in range(2)]
    assert json.loads((tmp_path / "damaged_files.json").read_text()), "process 1 wrote no shard files of its own"
    for g in got:
        assert g["steps"].tolist() == [1, 2, 30]
        assert float(g["float"]) == 1.0 / 3.0            # bit for bit, not process 1's 2.0
        assert bool(g["all_true"]) and not bool(g["all_mixed"])
        assert int(g["restored_step"]) == 1 and g["damaged_steps"].tolist() == [2]
        np.testing.assert_array_equal(g["restored"], np.arange(8 * 8192, dtype=np.float32).reshape(8, 8192))
    # the two views really differed: process 0 alone could read step 2, process 1 could not
    assert bool(got[0]["local_ok"]) and not bool(got[1]["local_ok"])
    ck = tmp_path / "ckpt"
    assert [p.name for p in ck.iterdir() if p.name.startswith("2.damaged-")], sorted(p.name for p in ck.iterdir())
    assert (ck / "1").is_dir() and not (ck / "2").exists()
