"""The ``jaxppo`` console command (``[project.scripts]``): the command table, the one-line error for an unknown
command, and a real training run through the installed script, as a user types it after ``pip install -e .``."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from jaxppo import cli

REPO = Path(__file__).resolve().parents[1]


def test_every_command_has_a_main_and_is_listed(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name, (module, help_) in cli.COMMANDS.items():
        assert callable(importlib.import_module(module).main), module
        assert f"  {name}" in out and help_ in out
    assert {"train", "dpo", "evaluate", "collect", "reward", "sweep", "plan", "prompts"} <= set(cli.COMMANDS)


def test_unknown_and_missing_command_exit_2(capsys):
    assert cli.main(["trian"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown command 'trian'" in err and "train" in err
    assert cli.main([]) == 2


def test_the_installed_jaxppo_train_runs(tmp_path, shared_dir):
    exe = shutil.which("jaxppo")
    if exe is None:
        pytest.fail("the jaxppo console script is not installed: pip install -e . (as README's test command does)")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}   # one CPU device, as a user's shell
    out = tmp_path / "run"
    proc = subprocess.run(
        [exe, "train", "--config", "configs/smoke.yaml", f"trainer.output_dir={out}", "trainer.total_steps=2",
         "trainer.eval_every=2", "trainer.eval_prompts=2", "rollout.max_prompts=10", "critic.ppo_epochs=1",
         "actor.ppo_mini_batch_size=8", "actor.ppo_micro_batch_size=8", "trainer.progress=false",
         f"data.path={tmp_path / 'data' / 'data.jsonl'}", f"model.path={shared_dir / 'models' / 'stories260K'}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    assert max(steps) == 2 and (out / "hf" / "config.json").is_file() and (out / "summary.json").is_file()
    bad = subprocess.run([exe, "train", "--config", str(tmp_path / "missing.yaml")], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "missing.yaml" in bad.stderr
