"""benchmarks/peers.py: the batch maths, the loss check and speed-up rules, jaxppo's driver (runs in CI), and the
loss equivalence of the peers' drivers on a 2-layer model (skipped, with the reason, without a peer's venv)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


peers = _load("bench_peers", REPO / "benchmarks" / "peers.py")


def test_gae_hand_computed():
    # one row, T=2, gamma=1, lam=0.5: delta_1 = r_1 - V_1 = 1 - 0.5 = 0.5; delta_0 = r_0 + V_1 - V_0 = 0 + 0.5 - 0.2
    # = 0.3; A_1 = 0.5, A_0 = 0.3 + 0.5 * 0.5 = 0.55; G = A + V = [0.75, 1.0]
    adv, ret = peers.gae(np.array([[0.0, 1.0]]), np.array([[0.2, 0.5]]), gamma=1.0, lam=0.5)
    np.testing.assert_allclose(adv, [[0.55, 0.5]])
    np.testing.assert_allclose(ret, [[0.75, 1.0]])


def test_batch_is_fixed_and_well_formed():
    a, b = peers.make_batch(), peers.make_batch()
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    s = peers.SHAPES
    assert a["fwd_ids"].shape == (s["fwd_batch"], s["fwd_seq"])
    assert a["dpo_chosen"].shape == (s["dpo_pairs"], s["dpo_response"])
    # the pad id V-1 never appears (Tunix derives its masks from it)
    for k in ("fwd_ids", "dpo_prompt", "dpo_chosen", "dpo_rejected", "rl_prompt", "rl_response"):
        assert a[k].max() < peers.VOCAB - 1 and a[k].min() >= 0
    # the rows of a group share one prompt (GRPO's n responses per prompt), different groups do not
    pr = a["rl_prompt"].reshape(-1, s["group"], s["rl_prompt"])
    assert (pr == pr[:, :1]).all() and not (pr[0, 0] == pr[1, 0]).all()
    # group-normalised advantages: zero mean per group of 4
    np.testing.assert_allclose(a["grpo_adv"].reshape(-1, s["group"]).mean(1), 0.0, atol=1e-6)


def test_compare_and_speedups_withhold_disagreeing_rows():
    recs = {"jaxppo": {"loss": 1.0, "s_per_update": 2.0}, "tunix": {"loss": 1.001, "s_per_update": 3.0},
            "trl": {"loss": 1.1, "s_per_update": 4.0}}
    c = peers.compare(recs, "float32")
    assert c["reference"] == "jaxppo" and c["agree"] == {"tunix": True, "trl": False}
    sp = peers.speedups(recs, c)
    assert sp["speedup_vs_tunix"] == pytest.approx(1.5)
    assert sp["speedup_vs_trl"] is None  # losses differ: no speed-up claimed
    one = peers.compare({"jaxppo": {"loss": 1.0}, "trl": {"error": "missing"}}, "float32")
    assert one["checked"] is False


def _run_driver(py: str, tool: str, task: str, work: Path, repeats: int, env: dict) -> dict:
    out = work / f"{tool}-{task}.json"
    p = subprocess.run([py, str(REPO / "benchmarks" / "peers" / f"{tool}_driver.py"), "--task", task, "--work",
                        str(work), "--repeats", str(repeats), "--out", str(out)], env=env, capture_output=True,
                       text=True, timeout=900, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A 2-layer work folder (weights exported by the jaxppo driver, the fixed batch, the spec)."""
    w = tmp_path_factory.mktemp("peers")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    peers.prepare_work(w, 2, env)
    return w


def _env():
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "TQDM_DISABLE": "1"}


@pytest.mark.slow
def test_jaxppo_driver_runs_and_records(work):
    rec = _run_driver(sys.executable, "jaxppo", "fwdbwd", work, 1, _env())
    assert rec["tool"] == "jaxppo" and rec["unsupported"] is None
    # random init: next-token cross-entropy near log V
    assert abs(rec["loss"] - math.log(peers.VOCAB)) < 0.5
    assert len(rec["times_s"]) == 1 and rec["s_per_update"] > 0 and rec["tokens_per_s"] > 0
    assert rec["peak_rss_mb"] > 100 and len(rec["loadavg_before"]) == 3
    # an update of a 2-layer model writes its fresh outputs (the gradients, > 28 MB of tied embedding alone)
    assert rec["minor_faults_per_update"] >= 1
    # the LoRA row: the DPO update on rank-8 adapters; at init (B = 0) its loss is the full-weight DPO loss exactly
    lora = _run_driver(sys.executable, "jaxppo", "lora", work, 1, _env())
    dpo = _run_driver(sys.executable, "jaxppo", "dpo", work, 1, _env())
    assert lora["unsupported"] is None and lora["s_per_update"] > 0
    assert lora["loss"] == dpo["loss"] and any("LoRA rank 8" in n for n in lora["notes"])


@pytest.mark.slow
def test_jaxppo_driver_rl_rows_run(work):
    """The GRPO and PPO rows run the PPO trainer's update code (make_phases / make_update / run_epochs); without
    a peer venv this is the only run they get in CI, so a change of that API fails here, not in the benchmark."""
    grpo = _run_driver(sys.executable, "jaxppo", "grpo", work, 1, _env())
    ppo = _run_driver(sys.executable, "jaxppo", "ppo", work, 1, _env())
    for rec in (grpo, ppo):
        assert rec["unsupported"] is None and np.isfinite(rec["loss"]) and rec["s_per_update"] > 0
    assert set(grpo["loss_parts"]) == {"policy_loss"} and grpo["loss"] == grpo["loss_parts"]["policy_loss"]
    parts = ppo["loss_parts"]
    assert set(parts) == {"policy_loss", "value_loss"} and parts["value_loss"] > 0
    assert ppo["loss"] == pytest.approx(parts["policy_loss"] + parts["value_loss"], rel=1e-6)


@pytest.mark.slow
def test_dpo_hh_row_real_lengths_packed(work):
    """The real-length DPO row: 8 HH-RLHF pairs at caps (256, 128) (prompts left padded, answers right padded, not
    all at the caps), and jaxppo's driver runs them packed, counting the real tokens only."""
    with np.load(work / "batch.npz") as z:
        b = {k: z[k] for k in z.files if k.startswith("hh_")}
    s = peers.SHAPES
    pm, cm, rm = b["hh_prompt_mask"], b["hh_chosen_mask"], b["hh_rejected_mask"]
    assert pm.shape == (s["hh_pairs"], s["hh_prompt"]) and cm.shape == rm.shape == (s["hh_pairs"], s["hh_response"])
    n_p = pm.sum(1)
    assert (pm == (np.arange(s["hh_prompt"]) >= s["hh_prompt"] - n_p[:, None])).all()     # left padded
    assert (cm == (np.arange(s["hh_response"]) < cm.sum(1)[:, None])).all()               # right padded
    assert n_p.min() >= 1
    assert cm.sum() + rm.sum() < 2 * cm.size                                               # ragged: not all at the cap
    rec = _run_driver(sys.executable, "jaxppo", "dpo_hh", work, 1, _env())
    assert rec["unsupported"] is None and np.isfinite(rec["loss"]) and rec["s_per_update"] > 0
    assert any(n.startswith("packed rows") for n in rec["notes"])
    assert rec["tokens_per_update"] == int(pm.sum() + cm.sum() + rm.sum())


CHECKED = ("fwdbwd", "dpo", "grpo", "dpo_hh")


@pytest.fixture(scope="module")
def jaxppo_losses():
    """jaxppo's loss per row, computed on first use (so a skipped peer test runs no driver)."""
    return {}


@pytest.mark.parametrize("tool", ["tunix", "trl"])
def test_peer_losses_match_jaxppo(work, tool, jaxppo_losses):
    """The same weights and batch give the same loss in the peer (model, DPO and GRPO losses, and the DPO loss on
    real lengths in each tool's own layout; 2 layers)."""
    py = peers.venv_python(tool)
    if not py.exists():
        pytest.skip(f"{tool} venv missing ({py}): run `bash benchmarks/peers/setup.sh {tool}`")
    for task in CHECKED:
        if task not in jaxppo_losses:
            jaxppo_losses[task] = _run_driver(sys.executable, "jaxppo", task, work, 0, _env())["loss"]
        ours = {"loss": jaxppo_losses[task]}
        theirs = _run_driver(str(py), tool, task, work, 0, _env())
        assert theirs["loss"] is not None and np.isfinite(theirs["loss"]), (task, theirs)
        assert abs(ours["loss"] - theirs["loss"]) <= peers.LOSS_TOL["float32"], (task, ours["loss"], theirs["loss"])
