"""Real processes: ``launch/multihost.py`` trains the smoke config under 2 processes x 2 devices (``jax.distributed``
over 127.0.0.1, gloo CPU collectives) to the end, and its per-step losses equal those of 1 process x 4 devices on the
same (data=2, fsdp=2) mesh, with packed minibatches (``data.packing``: every process plans the same layout from the
replicated draw) and with the default padded rows. Stopped and resumed, the packed 2-process run ends as the
uninterrupted one:

- SIGTERM to one process at a random step: the flag is agreed at the step boundary, so both processes stop after the
  same step, write that checkpoint together and exit 75 with the same line; resumed (``trainer.resume=auto``), every
  logged metric and the final summary equal the uninterrupted run's.
- both processes SIGKILLed once a checkpoint exists: restarted, the same metrics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.multihost import procs

pytestmark = [pytest.mark.slow, pytest.mark.processes]

REPO = procs.REPO
KEYS = ("actor/pg_loss", "critic/vf_loss", "actor/ppo_kl")
STEPS = 4  # smoke refreshes its replay priorities every 10 steps: all 4 run before the first refresh
SAVE = 2   # checkpoints at steps 2 and 4; the SIGKILL test stops both processes once checkpoint 2 exists
RTOL = 1e-4


@pytest.fixture(scope="module")
def smoke_data(tmp_path_factory, stories_model) -> Path:
    """The smoke config's dataset (40 story openings x 4 samples, VADER), collected once in this process."""
    from jaxppo.cli.collect import collect
    from jaxppo.config import load_config
    from jaxppo.rewards import reward_fn_from_config

    out = tmp_path_factory.mktemp("smoke_data")
    cfg = load_config(str(REPO / "configs/smoke.yaml"), [
        f"model.path={stories_model}", f"rollout.prompts={REPO / 'configs/prompts/story_openings.txt'}",
        "rollout.max_prompts=40", "rollout.batch_size=40", f"trainer.output_dir={out}"])
    collect(cfg, reward_fn_from_config(cfg.reward), progress=False)
    return out / "data.jsonl"


def _overrides(stories_model, data, out, packing: bool = True) -> list[str]:
    return ["--config", str(REPO / "configs/smoke.yaml"), f"model.path={stories_model}", f"data.path={data}",
            "data.collect_if_missing=false", f"trainer.output_dir={out}", f"trainer.total_steps={STEPS}",
            f"trainer.save_every={SAVE}", "trainer.eval_every=null", "trainer.eval_prompts=8", "trainer.progress=false",
            f"data.packing={str(packing).lower()}"]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, stories_model, smoke_data):
    """(one, two): the output folders of 1 process x 4 devices and 2 processes x 2 devices (run together), packed."""
    base = tmp_path_factory.mktemp("mh_train")
    return procs.one_and_two(base, "jaxppo.train", [], lambda out: _overrides(stories_model, smoke_data, out),
                             env={"JAXPPO_CACHE_DIR": str(base / "cache")})


def _losses_match(one: Path, two: Path) -> None:
    m1, m2 = procs.metrics_by_step(one), procs.metrics_by_step(two)
    worst = {}
    for step in range(1, STEPS + 1):
        for k in KEYS:
            a, b = m1[step][k], m2[step][k]
            assert np.isfinite(a) and np.isfinite(b)
            worst[k] = max(worst.get(k, 0.0), procs.rel_diff(a, b))
    print("worst relative difference, steps 1-%d:" % STEPS, worst)
    assert all(v <= RTOL for v in worst.values()), worst


def test_two_processes_match_one(two_runs):
    one, two, _ = two_runs
    _losses_match(one, two)


def test_two_processes_match_one_padded(tmp_path, stories_model, smoke_data):
    one, two, _ = procs.one_and_two(tmp_path, "jaxppo.train", [],
                                    lambda out: _overrides(stories_model, smoke_data, out, packing=False),
                                    env={"JAXPPO_CACHE_DIR": str(tmp_path / "cache")})
    _losses_match(one, two)


def test_only_process_zero_wrote(two_runs):
    one, two, res = two_runs
    # appended files would hold every line twice if process 1 wrote too
    for name in ("metrics.jsonl", "events.jsonl"):
        assert len((two / name).read_text().splitlines()) == len((one / name).read_text().splitlines()), name
    def names(d: Path) -> list[str]:  # a TensorBoard file is named by its time and host: keep only its kind
        out = [str(p.relative_to(d)) for p in d.rglob("*") if "checkpoints" not in p.parts]
        return sorted(n.split(".out.tfevents.")[0] if ".out.tfevents." in n else n for n in out)
    assert names(two) == names(one)
    assert len(list((two / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert {"summary.json", "config.json", "hf/config.json", "hf/model.safetensors"} <= set(names(two))
    steps = sorted(int(p.name) for p in (two / "checkpoints").iterdir() if p.name.isdigit())
    assert steps[-1] == STEPS and SAVE in steps
    assert "[process 1/2]" in res[1].stderr or "process 1/2" in res[1].stderr


def test_hf_export_same_logits(two_runs):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    one, two, _ = two_runs
    ids = torch.tensor([[1, 45, 80, 200, 7, 99, 3, 12]])
    with torch.no_grad():
        l1 = AutoModelForCausalLM.from_pretrained(one / "hf").eval()(ids).logits.numpy()
        l2 = AutoModelForCausalLM.from_pretrained(two / "hf").eval()(ids).logits.numpy()
    np.testing.assert_allclose(l2, l1, rtol=1e-4, atol=1e-4)


def test_sigkill_both_then_resume(tmp_path, two_runs, stories_model, smoke_data):
    """Both processes SIGKILLed once checkpoint 2 exists; restarted (resume=auto): the same metrics as the
    uninterrupted 2-process run."""
    import signal
    import time

    _, two, _ = two_runs
    out = tmp_path / "killed"
    env = {"JAXPPO_CACHE_DIR": str(tmp_path / "cache")}
    cmd = procs.python(str(REPO / "launch/multihost.py"), *_overrides(stories_model, smoke_data, out), *procs.MESH)
    ps = procs.start(cmd, n=2, devices=procs.DEVICES, logdir=tmp_path / "logs1", env=env)
    t0 = time.monotonic()
    while not (out / "checkpoints" / str(SAVE)).is_dir():
        assert time.monotonic() - t0 < 1200 and all(p.poll() is None for p, _, _ in ps), f"no checkpoint {SAVE}"
        time.sleep(0.5)
    time.sleep(2.0)
    for p, _, _ in ps:
        p.send_signal(signal.SIGKILL)
    for p, _, _ in ps:
        p.wait()
    assert not (out / "summary.json").exists()
    res = procs.run(cmd, n=2, devices=procs.DEVICES, timeout=1200, logdir=tmp_path / "logs2", env=env)
    assert all(r.returncode == 0 for r in res), "\n".join(r.describe() for r in res)
    m_ref, m_res = procs.metrics_by_step(two), procs.metrics_by_step(out)
    assert sorted(m_res) == sorted(m_ref)
    for step in m_ref:
        for k in KEYS:
            assert m_res[step][k] == m_ref[step][k], (step, k)
    assert json.loads((out / "summary.json").read_text())["resumed_from"] == SAVE


def _final(out: Path) -> dict:
    """A run's final metrics: the numbers of its ``summary.json`` but its timings and its resume point."""
    return {k: v for k, v in json.loads((out / "summary.json").read_text()).items()
            if isinstance(v, (int, float)) and not k.startswith(("time/", "perf/")) and k != "resumed_from"}


def test_sigterm_at_a_random_step_then_resume_equals_the_uninterrupted_run(tmp_path, two_runs, stories_model,
                                                                          smoke_data):
    import random
    import signal
    import time

    from tests.resume_helpers import deterministic_rows, rows

    _, two, _ = two_runs
    k = random.SystemRandom().randint(1, STEPS - 2)      # the last logged step before the signal
    out = tmp_path / "victim"
    env = {"JAXPPO_CACHE_DIR": str(tmp_path / "cache")}
    cmd = procs.python(str(REPO / "launch/multihost.py"), *_overrides(stories_model, smoke_data, out), *procs.MESH)
    ps = procs.start(cmd, n=2, devices=procs.DEVICES, logdir=tmp_path / "logs1", env=env)
    t0 = time.monotonic()
    while not (out / "metrics.jsonl").is_file() or len((out / "metrics.jsonl").read_text().splitlines()) < k:
        assert time.monotonic() - t0 < 600 and all(p.poll() is None for p, _, _ in ps), \
            "\n".join(r.describe() for r in procs.wait(ps, 1))
        time.sleep(0.02)
    ps[random.SystemRandom().randrange(2)][0].send_signal(signal.SIGTERM)   # one process: both stop
    res = procs.wait(ps, timeout=300)
    assert [r.returncode for r in res] == [75, 75], "\n".join(r.describe() for r in res)
    n = [r["step"] for r in rows(out / "metrics.jsonl")][-1]
    assert n >= k and (out / "checkpoints" / str(n)).is_dir() and not list(out.rglob("*.orbax-checkpoint-tmp"))
    assert [r.stderr.strip().splitlines()[-1] for r in res] == 2 * [
        f"python -m jaxppo.train: preempted at step {n}; saved checkpoint {n}; resume with trainer.resume=auto"]
    assert [r["step"] for r in rows(out / "metrics.jsonl")] == list(range(1, n + 1))

    resumed = procs.run([*cmd, "trainer.resume=auto"], n=2, devices=procs.DEVICES, timeout=600, logdir=tmp_path / "logs2",
                        env=env)
    assert all(r.returncode == 0 for r in resumed), "\n".join(r.describe() for r in resumed)
    a, b = deterministic_rows(two), deterministic_rows(out)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, STEPS + 1))
    for ra, rb in zip(a, b):
        assert ra == rb, f"step {ra['step']} differs after the resume from {n} (SIGTERM after step {k})"
    final = _final(two)
    assert len(final) > 5 and _final(out) == final, sorted(final)
