"""Real processes: ``launch/multihost.py reward train``, ``reward score``, ``collect`` and ``evaluate`` under
2 processes x 2 devices give the outputs of the plain 1-process commands (4 devices), and only process 0 wrote
files. One chain per side, tiny sizes: 64 HH-RLHF pairs, 8 prompts x 2 samples of 8 tokens, stories260K.

The chain: a reward model trained on the pairs -> it scores the pairs -> ``collect`` samples the prompts and scores
them with that reward model -> ``evaluate`` runs the policy against the reference on the held-out half of the
collected rows on a (data=2, fsdp=2) mesh (VADER reward)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.multihost import procs

pytestmark = [pytest.mark.slow, pytest.mark.processes]

REPO = procs.REPO


def _commands(stories: Path, hh: Path, d: Path) -> list[list[str]]:
    """The four command lines (arguments after the module) writing under ``d``."""
    pairs = [f"model.path={stories}", f"data.path={hh}", "data.schema=preference", "data.preference_format=hh",
             "data.max_rows=64", "data.max_prompt_length=16", "data.max_response_length=16", "data.eval_fraction=0.25",
             "trainer.progress=false"]
    rm = d / "rm"
    gen = [f"model.path={stories}", "data.max_prompt_length=24", "data.max_response_length=8",
           "rollout.max_new_tokens=8", "rollout.batch_size=8", "rollout.n=2", "trainer.progress=false",
           "trainer.seed=1"]
    return [
        ["reward", "train", *pairs, "reward.epochs=1", "reward.batch_size=16", "reward.eval_batch_size=16",
         f"trainer.output_dir={rm}"],
        ["reward", "score", *pairs, f"reward.model_path={rm}", "reward.eval_batch_size=16",
         f"trainer.output_dir={d / 'score'}"],
        ["collect", *gen, f"rollout.prompts={REPO / 'configs/prompts/story_openings.txt'}", "rollout.max_prompts=8",
         "reward.kind=model", f"reward.model_path={rm}", "rollout.output_format=jsonl",
         f"trainer.output_dir={d / 'collect'}"],
        ["evaluate", *gen, f"data.path={d / 'collect' / 'data.jsonl'}", "data.schema=scored", "data.eval_fraction=0.5",
         "data.behaviour_batch_size=8", "reward.kind=vader", *procs.MESH,
         f"trainer.output_dir={d / 'evaluate'}"],
    ]


MODULES = {"reward": "jaxppo.reward", "collect": "jaxppo.collect", "evaluate": "jaxppo.evaluate"}


@pytest.fixture(scope="module")
def chains(tmp_path_factory, stories_model, hh_pairs):
    """(one, two): the chain's folders run by 1 process x 4 devices and by 2 processes x 2 devices (side by side:
    the 1-process chain is one shell script started first)."""
    import shlex

    base = tmp_path_factory.mktemp("mh_commands")
    one, two = base / "one", base / "two"
    script = " && ".join(shlex.join([sys.executable, "-m", MODULES[c[0]], *c[1:]])
                         for c in _commands(stories_model, hh_pairs, one))
    p1 = procs.start(["bash", "-c", script], n=1, devices=2 * procs.DEVICES, logdir=base / "logs1", env={"JAXPPO_DISTRIBUTED": "0"})
    results = []
    for i, c in enumerate(_commands(stories_model, hh_pairs, two)):
        res = procs.run(procs.python(str(REPO / "launch/multihost.py"), *c), n=2, devices=procs.DEVICES, timeout=600,
                        logdir=base / f"logs2_{i}")
        assert all(r.returncode == 0 for r in res), f"{c[:2]}\n" + "\n".join(r.describe() for r in res)
        results.append(res)
    r1 = procs.wait(p1, timeout=900)
    assert r1[0].returncode == 0, r1[0].describe()
    return one, two, results


def _json(p: Path) -> dict:
    return json.loads(p.read_text())


def _jsonl(p: Path) -> list[dict]:
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def test_outputs_equal_one_process(chains):
    one, two, _ = chains
    a, b = _json(one / "rm/metrics.json"), _json(two / "rm/metrics.json")
    for k in ("eval/accuracy", "eval/loss", "train/loss", "n_train_pairs", "n_eval_pairs"):
        np.testing.assert_allclose(b[k], a[k], rtol=1e-4, err_msg=k)
    sa, sb = _jsonl(one / "score/scores.jsonl"), _jsonl(two / "score/scores.jsonl")
    assert [r["index"] for r in sa] == [r["index"] for r in sb] and len(sa) > 0
    # the reward model is trained in every process on its first device; 4- and 8-device CPU clients differ in the
    # last float bits (train/loss 6e-8 relative), which moves the scores by ~1e-4
    np.testing.assert_allclose([r["r_chosen"] for r in sb], [r["r_chosen"] for r in sa], atol=2e-3)
    ca, cb = _jsonl(one / "collect/data.jsonl"), _jsonl(two / "collect/data.jsonl")
    assert len(ca) == len(cb) == 16
    assert [r["response_ids"] for r in cb] == [r["response_ids"] for r in ca]
    np.testing.assert_allclose([r["score"] for r in cb], [r["score"] for r in ca], atol=2e-3)
    ea, eb = _json(one / "evaluate/eval.json"), _json(two / "evaluate/eval.json")
    for k in ("eval/reward_policy", "eval/reward_reference", "eval/kl", "eval/perplexity", "n_prompts"):
        np.testing.assert_allclose(eb[k], ea[k], rtol=1e-4, atol=1e-6, err_msg=k)
    sa, sb = _jsonl(one / "evaluate/eval_samples.jsonl"), _jsonl(two / "evaluate/eval_samples.jsonl")
    assert [r["response_policy"] for r in sb] == [r["response_policy"] for r in sa]


def test_only_process_zero_wrote(chains):
    one, two, results = chains

    def names(d: Path) -> list[str]:
        return sorted(str(p.relative_to(d)) for p in d.rglob("*"))
    assert names(two) == names(one)
    for log in two.rglob("*.log"):   # process 1 logs to stderr only
        assert "[process 1/2]" not in log.read_text(), log
    for res in results:
        assert "process 1/2" in res[1].stderr
