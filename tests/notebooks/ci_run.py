"""Execute one ablation notebook with ``PROFILE="ci"`` and check its conclusion (used by the
``test_notebook_<name>.py`` files, one notebook per file so that ``--dist loadfile`` spreads them over the workers)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from tests.xla_flags import xla_flags

REPO = Path(__file__).resolve().parents[2]
VERDICT = re.compile(r"^  (\S+) vs (\S+): final held-out reward (-?\d+\.\d+) \[(-?\d+\.\d+), (-?\d+\.\d+)\] vs "
                     r"(-?\d+\.\d+) \[(-?\d+\.\d+), (-?\d+\.\d+)\]: (higher|lower|no difference measured) "
                     r"\(primary, final value: final difference (-?\d+\.\d+) \[(-?\d+\.\d+), (-?\d+\.\d+)\], (\d+) "
                     r"seeds")


# the notebooks whose ci sweeps train on configs/smoke.yaml's dataset, runs/smoke_data/data.jsonl (the sweep's first run
# collects it when it is missing: data.collect_if_missing)
SMOKE_DATA = {"prioritized_replay", "pf_ppo_filters", "ppo_vs_dpo_critic_free"}


def ensure_smoke_data() -> None:
    """Collect runs/smoke_data/data.jsonl once, under a lock: with the notebooks in test files of their own, two
    pytest-xdist workers could otherwise both find it missing and collect it into the same file at once. The same
    function the trainer calls (``ensure_data``), in a subprocess with the sweeps' one CPU device."""
    import fcntl

    (REPO / "runs").mkdir(exist_ok=True)
    with open(REPO / "runs" / ".smoke_data.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (REPO / "runs" / "smoke_data" / "data.jsonl").exists():
            return
        code = ("from jaxppo.config import load_config; from jaxppo.trainer.ppo.build import ensure_data; "
                "ensure_data(load_config('configs/smoke.yaml', ['trainer.progress=false']))")
        env = dict(os.environ, XLA_FLAGS=xla_flags(1))
        res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=900)
        assert res.returncode == 0, res.stderr[-3000:]


def execute_ci_profile(name: str, tmp_path: Path) -> list:
    """Execute notebook ``name`` with PROFILE="ci" (toy sweeps, 2 runs at a time: JOBS=2) into tmp_path; its
    conclusion names every non-baseline variant with numbers and a rule-chosen verdict. Returns the conclusion's
    verdict lines (``VERDICT`` matches)."""
    import nbformat
    import papermill

    if name in SMOKE_DATA:
        ensure_smoke_data()
    out_root = tmp_path / "sweeps"
    out_nb = tmp_path / f"{name}.ipynb"
    papermill.execute_notebook(str(REPO / "notebooks" / f"{name}.ipynb"), str(out_nb),
                               parameters={"PROFILE": "ci", "OUTPUT_ROOT": str(out_root), "JOBS": 2}, cwd=str(REPO),
                               kernel_name="python3", progress_bar=False)
    nb = nbformat.read(out_nb, as_version=4)
    cell = next(c for c in nb.cells if "conclusion" in c.metadata.get("tags", []))
    text = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")
    assert text.startswith("CONCLUSION\n"), (name, text)
    verdicts = [m for ln in text.splitlines() if (m := VERDICT.match(ln))]
    assert len(verdicts) >= 2, (name, text)   # every ci sweep has >= 3 variants, one of them the baseline
    for m in verdicts:
        mean, lo, hi = float(m.group(3)), float(m.group(4)), float(m.group(5))
        assert lo <= mean <= hi, (name, m.group(0))
        d, dlo, dhi = float(m.group(10)), float(m.group(11)), float(m.group(12))
        assert dlo <= d <= dhi and int(m.group(13)) == 2, (name, m.group(0))
    # the sweep outputs went to OUTPUT_ROOT, with results.csv and summary tables read from there
    assert list(out_root.glob("*_ci/results.csv")), name
    return verdicts
