"""Real processes: a global array built from host data and read back under 2 processes x 4 devices equals
the same under 1 process x 8 devices (jaxppo.parallel.from_host / to_host)."""

from __future__ import annotations

import numpy as np

from tests.multihost import procs

WORKER = str(procs.REPO / "tests" / "multihost" / "worker.py")


def _run(tmp_path, n, devices):
    out = tmp_path / f"{n}x{devices}"
    out.mkdir()
    res = procs.run(procs.python(WORKER, "global_array", str(out)), n=n, devices=devices, timeout=240,
                    logdir=out / "logs")
    for r in res:
        assert r.returncode == 0, "\n".join(x.describe() for x in res)
    return res, [dict(np.load(out / f"global_array.{i}.npz")) for i in range(n)]


def test_two_by_four_equals_one_by_eight(tmp_path):
    res2, got2 = _run(tmp_path, 2, 4)
    _, got1 = _run(tmp_path, 1, 8)
    assert "fully_addressable=False" in res2[0].stdout  # the sharded arrays really span both processes
    assert "process 1/2 local=4 global=8 ok" in res2[1].stdout
    x = np.arange(8 * 12, dtype=np.float32).reshape(8, 12) / 7.0
    for key in got1[0]:
        for g in got2:
            np.testing.assert_array_equal(g[key], got1[0][key], err_msg=key)
    for name in ("batch", "grid", "rep"):
        np.testing.assert_array_equal(got1[0][name], x)
