"""Bad input and failing disks end a command with exit status 2 and one line on stderr naming the file or key: no
traceback, no third-party log record, no temporary checkpoint folder left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.faults.conftest import one_line_error, overrides, run_module

TRAIN = "python -m jaxppo.train"


def test_config_file_that_is_not_utf8(tmp_path, compile_cache):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("trainer:\n  run_name: caf\xe9\n".encode("latin-1"))
    res = run_module("jaxppo.train", ["--config", str(bad)], compile_cache)
    line = one_line_error(res, TRAIN, str(bad), "not UTF-8", "0xe9")
    assert len(res.stderr.strip().splitlines()) == 1, line


def test_config_file_with_broken_yaml_is_one_line(tmp_path, compile_cache):
    bad = tmp_path / "broken.yaml"
    bad.write_text("trainer: [\n  a: b\n")
    res = run_module("jaxppo.train", ["--config", str(bad)], compile_cache)
    one_line_error(res, TRAIN, str(bad), "not valid YAML")
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("case", ["existing_file", "under_a_file", "not_creatable"])
def test_output_dir_that_cannot_be_used(tmp_path, compile_cache, stories_model, scored_data, case):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    out = {"existing_file": a_file, "under_a_file": a_file / "run",
           "not_creatable": Path("/proc/self/jaxppo-run")}[case]   # /proc refuses new folders, even to root
    res = run_module("jaxppo.train", overrides(stories_model, scored_data, out), compile_cache)
    line = one_line_error(res, TRAIN, f"trainer.output_dir={out}")
    assert len(res.stderr.strip().splitlines()) == 1, line
    assert a_file.read_text() == "not a folder"


def test_output_dir_without_write_permission(tmp_path, compile_cache, stories_model, scored_data):
    import os

    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        res = run_module("jaxppo.train", overrides(stories_model, scored_data, ro / "run"), compile_cache)
    finally:
        ro.chmod(0o755)
    one_line_error(res, TRAIN, f"trainer.output_dir={ro / 'run'}")


def test_non_finite_scores_and_a_broken_line_are_counted_quietly(finished_run):
    out, res, _ = finished_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["data/skipped/non_finite_score"] == 3
    assert summary["data/skipped/invalid_json"] == 1
    assert "datasets" not in res.stderr.replace("reader: line-by-line (datasets failed", ""), res.stderr[-3000:]
    assert "Failed to load JSON" not in res.stderr and "ERROR" not in res.stderr


def test_checkpoint_of_another_model_shape(finished_run, tiny_model_4_layers, scored_data, compile_cache):
    out, _, _ = finished_run
    res = run_module("jaxppo.train", overrides(tiny_model_4_layers, scored_data, out, "trainer.resume=auto",
                                               "trainer.total_steps=6"), compile_cache)
    one_line_error(res, TRAIN, "CheckpointMismatchError", str(out / "checkpoints"), "actor/model/layers",
                   "stored (5, ", "expected (4, ")


def test_disk_full_while_saving(tmp_path, stories_model, scored_data, compile_cache):
    """A file size limit (as ``ulimit -f``) makes the first checkpoint write fail: one line naming the checkpoint
    and the reason, and no temporary checkpoint folder left."""
    out = tmp_path / "run"
    res = run_module("jaxppo.train", overrides(stories_model, scored_data, out), compile_cache,
                     max_file_bytes=256 * 1024)
    one_line_error(res, TRAIN, "CheckpointWriteError", str(out / "checkpoints" / "0"), "File too large")
    assert list(out.rglob("*.orbax-checkpoint-tmp")) == []
    assert not (out / "checkpoints" / "0").exists()


def test_truncated_safetensors_names_file_and_tensor(tmp_path, stories_model, scored_data, compile_cache):
    import shutil

    from jaxppo.hf.safetensors_io import SafetensorsFile

    model = tmp_path / "cut_model"
    shutil.copytree(stories_model, model)
    st = model / "model.safetensors"
    full = SafetensorsFile(stories_model / "model.safetensors")
    keep = st.stat().st_size // 2
    with open(st, "r+b") as fh:
        fh.truncate(keep)
    # the tensors whose bytes lie past the cut (read from the intact file's header)
    cut = {n for n in full.names() if full._offset + full.header[n]["data_offsets"][1] > keep}
    res = run_module("jaxppo.train", overrides(model, scored_data, tmp_path / "run"), compile_cache)
    line = one_line_error(res, TRAIN, str(st), "truncated")
    named = [n for n in cut if f"'{n}'" in line]
    assert len(named) == 1, line


@pytest.mark.parametrize("keep", [0.5, 0.999])
def test_truncated_gguf_names_file_and_tensor(tmp_path, keep):
    from gguf import GGUFReader

    from jaxppo.hf import load_pretrained
    from tests.hf.test_gguf import write_gguf
    from tests.hf.tiny import make_hf_model

    path = write_gguf(make_hf_model("llama"), tmp_path / "full.gguf")
    data = path.read_bytes()
    n = int(len(data) * keep) // 32 * 32
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:n])
    first = next(t for t in GGUFReader(str(path)).tensors if t.data_offset + t.n_bytes > n)
    with pytest.raises(ValueError) as e:
        load_pretrained(cut)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{cut}: the GGUF file is truncated") and f"'{first.name}'" in msg


LOGS = r"""
import logging, sys
import orbax.checkpoint  # logs through absl on import: absl calls logging.basicConfig() for a root without handler
from jaxppo.cli.util import setup_logging
setup_logging(sys.argv[1], "x.log")
log = logging.getLogger("jaxppo.probe")
log.info("an info record")
log.warning("a warning record")
from jaxppo.console import PRINTED
log.warning("a printed warning", extra=PRINTED)   # the command printed it: not again on stderr
import orbax.checkpoint._src.serialization.type_handler_registry  # noqa: F401
"""


def test_info_records_go_to_the_log_file_not_stderr(tmp_path):
    """INFO records go to the log file only, warnings to stderr too, but a warning the command printed already
    (``jaxppo.console.PRINTED``) only to the file."""
    import subprocess
    import sys

    from tests.faults.conftest import REPO

    res = subprocess.run([sys.executable, "-c", LOGS, str(tmp_path / "out")], cwd=REPO, capture_output=True,
                         text=True, timeout=120, env=dict(__import__("os").environ, JAX_PLATFORMS="cpu"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stderr.strip().splitlines() == ["WARNING:jaxppo.probe:a warning record"], res.stderr[-3000:]
    text = (tmp_path / "out" / "x.log").read_text()
    assert "INFO an info record" in text and "WARNING a warning record" in text
    assert "WARNING a printed warning" in text
