"""MetricsLogger: strict JSON lines, non-finite values, events, resume truncation, TensorBoard files."""

from __future__ import annotations

import json
import math
import time

import jax.numpy as jnp
import numpy as np
import pytest

from jaxppo.trainer.guards import GuardAction
from jaxppo.trainer.metrics_log import MetricsLogger, read_jsonl, truncate_log


def _lines(path):
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def test_log_writes_one_strict_json_object_per_step(tmp_path):
    with MetricsLogger(tmp_path, total_steps=3, tensorboard=False, progress=False) as lg:
        out = lg.log(1, {"actor/pg_loss": jnp.float32(0.5), "critic/vf_loss": np.float64(2.0), "n": 3})
        lg.log(2, {"actor/pg_loss": float("nan"), "critic/vf_loss": float("inf"), "x": -float("inf")})
    assert out == {"actor/pg_loss": 0.5, "critic/vf_loss": 2.0, "n": 3.0}
    assert all(type(v) is float for v in out.values())
    text = (tmp_path / "metrics.jsonl").read_text()
    rows = [json.loads(ln, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
            for ln in text.splitlines()]
    assert rows[0] == {"step": 1, "actor/pg_loss": 0.5, "critic/vf_loss": 2.0, "n": 3.0}
    assert rows[1] == {"step": 2, "actor/pg_loss": "nan", "critic/vf_loss": "inf", "x": "-inf"}
    back = read_jsonl(tmp_path / "metrics.jsonl")
    assert math.isnan(back[1]["actor/pg_loss"]) and back[1]["critic/vf_loss"] == math.inf
    assert back[1]["x"] == -math.inf


def test_bad_metric_values_name_the_key(tmp_path):
    with MetricsLogger(tmp_path, total_steps=3, tensorboard=False, progress=False) as lg:
        with pytest.raises(TypeError, match="'a/b'"):
            lg.log(1, {"a/b": "hello"})
        with pytest.raises(TypeError, match="'vec'"):
            lg.log(1, {"vec": np.ones(3)})
        with pytest.raises(ValueError, match="step"):
            lg.log(1, {"step": 1.0})
    with pytest.raises(RuntimeError, match="closed"):
        lg.log(2, {"a": 1.0})


def test_events_file_and_warning(tmp_path, caplog):
    with MetricsLogger(tmp_path, total_steps=3, tensorboard=False, progress=False) as lg:
        with caplog.at_level("WARNING", logger="jaxppo.trainer"):
            lg.event(4, "lower_lr", "KL too high", lr=1e-6, kl=np.float32(0.1))
            act = GuardAction("rollback", "nan", {"nan_steps": 3})
            lg.event(5, act.kind, act.message, **act.data)   # how the harness logs a guard action
    rows = _lines(tmp_path / "events.jsonl")
    assert rows[0]["step"] == 4 and rows[0]["kind"] == "lower_lr" and rows[0]["lr"] == 1e-6
    assert rows[0]["kl"] == pytest.approx(0.1)
    assert rows[1] == {"step": 5, "kind": "rollback", "message": "nan", "nan_steps": 3}
    assert "KL too high" in caplog.text and "lower_lr" in caplog.text


def _run(out, steps, start=0, kill_after=None):
    """Log steps start+1..steps (metric = step**2); stops early (without close) at kill_after."""
    lg = MetricsLogger(out, total_steps=steps, start_step=start, tensorboard=False, progress=False)
    for s in range(start + 1, steps + 1):
        lg.log(s, {"m": float(s * s)})
        if s % 3 == 0:
            lg.event(s, "note", f"step {s}")
        if kill_after is not None and s == kill_after:
            return lg
    lg.close()
    return lg


@pytest.mark.parametrize("half_line", [False, True])
def test_resume_truncates_to_checkpoint_and_equals_uninterrupted(tmp_path, half_line):
    ref, res = tmp_path / "ref", tmp_path / "res"
    _run(ref, 10)
    killed = _run(res, 10, kill_after=8)  # "checkpoint" at step 6, killed after logging step 8
    killed._metrics.close()
    killed._events.close()
    if half_line:  # SIGKILL in the middle of a write
        with open(res / "metrics.jsonl", "a") as f:
            f.write('{"step": 9, "m": 8')
        with open(res / "events.jsonl", "a") as f:
            f.write('{"step": 9, "ki')
    _run(res, 10, start=6)
    for name in ("metrics.jsonl", "events.jsonl"):
        assert (res / name).read_text() == (ref / name).read_text()
    assert [r["step"] for r in _lines(res / "metrics.jsonl")] == list(range(1, 11))
    assert not list(res.glob("*.tmp"))


def test_fresh_start_empties_old_files(tmp_path):
    _run(tmp_path, 4)
    _run(tmp_path, 2)
    assert [r["step"] for r in _lines(tmp_path / "metrics.jsonl")] == [1, 2]


def test_corrupt_middle_line_is_an_error(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "m": 1.0}\n{"step": 2, "m": oops}\n{"step": 3, "m": 9.0}\n')
    with pytest.raises(ValueError, match="line 2"):
        truncate_log(p, 2)
    p.write_text('{"step": 1, "m": 1.0}\n{"step": 2, "m": 4.0}\n{"step": 3, "m"')
    assert truncate_log(p, 5) == 2


def _tb_scalars(logdir):
    """(tag, step, value) of every scalar in the TFRecord event files of ``logdir`` (independent reader)."""
    import struct

    from tensorboardX.proto import event_pb2

    out = []
    for f in sorted(logdir.glob("events.out.tfevents.*")):
        data = f.read_bytes()
        pos = 0
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos:pos + 8])
            rec = data[pos + 12:pos + 12 + n]
            pos += 12 + n + 4
            ev = event_pb2.Event.FromString(rec)
            for v in ev.summary.value:
                if v.HasField("simple_value"):
                    out.append((v.tag, ev.step, v.simple_value))
    return out


def test_tensorboard_scalars_and_progress_bar(tmp_path):
    with MetricsLogger(tmp_path, total_steps=3, tensorboard=True, progress=True) as lg:
        lg.log(1, {"critic/score/mean": 0.25, "actor/ppo_kl": float("nan")})
        lg.log(3, {"critic/score/mean": 0.75})
    assert _tb_scalars(tmp_path / "tensorboard") == [("critic/score/mean", 1, 0.25), ("critic/score/mean", 3, 0.75)]


def test_non_writing_process_touches_no_files(tmp_path):
    out = tmp_path / "run"
    with MetricsLogger(out, total_steps=2, write=False) as lg:
        assert lg.log(1, {"a": np.float32(2.0)}) == {"a": 2.0}
        lg.event(1, "note", "x")
    assert not out.exists()


def test_tensorboard_resume_writes_a_purge_marker(tmp_path):
    from tensorboardX.proto import event_pb2

    with MetricsLogger(tmp_path, total_steps=6, tensorboard=True, progress=False) as lg:
        for s in range(1, 5):
            lg.log(s, {"m": float(s)})
    with MetricsLogger(tmp_path, total_steps=6, start_step=2, tensorboard=True, progress=False) as lg:
        lg.log(3, {"m": 30.0})
    import struct

    starts = []
    for f in sorted((tmp_path / "tensorboard").glob("events.out.tfevents.*")):
        data, pos = f.read_bytes(), 0
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos:pos + 8])
            ev = event_pb2.Event.FromString(data[pos + 12:pos + 12 + n])
            pos += 16 + n
            if ev.HasField("session_log") and ev.session_log.status == event_pb2.SessionLog.START:
                starts.append(ev.step)
    assert 3 in starts  # TensorBoard drops the first run's events with step >= 3


# ------------------------------------------------------------------------------------ experiment trackers
def test_resolve_logger():
    from jaxppo.trainer.trackers import resolve_logger

    assert resolve_logger("console") == (False, ())
    assert resolve_logger("console", tensorboard=True) == (True, ())                # trainer.tensorboard alone
    assert resolve_logger(["console", "tensorboard", "wandb"]) == (True, ("wandb",))
    assert resolve_logger(("mlflow", "wandb", "mlflow")) == (False, ("mlflow", "wandb"))
    with pytest.raises(ValueError, match="unknown logger.*neptune"):
        resolve_logger(["console", "neptune"])


class _Recorder:
    def __init__(self):
        self.calls = []

    def log(self, step, metrics):
        self.calls.append(("log", step, dict(metrics)))

    def event(self, step, kind, message, data):
        self.calls.append(("event", step, kind, message))

    def close(self):
        self.calls.append(("close",))


def test_logger_fans_out_to_trackers(tmp_path):
    rec = _Recorder()
    with MetricsLogger(tmp_path, total_steps=2, tensorboard=False, progress=False, trackers=[rec]) as lg:
        lg.log(1, {"a": np.float32(0.5), "b": float("nan")})
        lg.event(1, "lower_lr", "KL too high", kl=0.3)
    assert rec.calls[0][:2] == ("log", 1) and rec.calls[0][2]["a"] == 0.5 and math.isnan(rec.calls[0][2]["b"])
    assert rec.calls[1:] == [("event", 1, "lower_lr", "KL too high"), ("close",)]
    other = _Recorder()                                        # not process 0: trackers get nothing
    with MetricsLogger(tmp_path / "p1", total_steps=2, progress=False, write=False, trackers=[other]) as lg:
        lg.log(1, {"a": 1.0})
    assert other.calls == []


def test_missing_tracker_package_names_the_extra(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)              # import wandb -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'jaxppo\[track\]'"):
        MetricsLogger(tmp_path, total_steps=1, tensorboard=False, progress=False, trackers=["wandb"])


def test_trackio_adapter_with_a_fake_module(tmp_path, monkeypatch):
    """trackio is not installed here (it would upgrade pillow): the adapter is checked against a fake module."""
    import sys
    import types

    calls = []
    fake = types.ModuleType("trackio")
    fake.init = lambda **kw: calls.append(("init", kw)) or object()
    fake.log = lambda metrics, step=None: calls.append(("log", dict(metrics), step))
    fake.finish = lambda: calls.append(("finish",))
    monkeypatch.setitem(sys.modules, "trackio", fake)
    with MetricsLogger(tmp_path / "run7", total_steps=2, tensorboard=False, progress=False, trackers="trackio",
                       group="sweepA", run_config={"actor": {"lr": 1e-6}}) as lg:
        lg.log(1, {"x": 1.0, "y": float("inf")})
        lg.event(2, "rollback", "ppl up")
    assert calls == [("init", {"project": "sweepA", "name": "run7", "config": {"actor": {"lr": 1e-6}}}),
                     ("log", {"x": 1.0}, 1), ("log", {"events/rollback": 1.0}, 2), ("finish",)]


def _wandb_records(run_file):
    """Records of a W&B ``.wandb`` file (a LevelDB-style log of protobuf records after a 7-byte header)."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    b = run_file.read_bytes()
    assert b[:4] == b":W&B"
    pos, buf, out = 7, b"", []
    while pos + 7 <= len(b):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", b[pos:pos + 7])
        data = b[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind == 0:
            continue
        buf = data if kind in (1, 2) else buf + data
        if kind in (1, 4):
            r = pb.Record()
            r.ParseFromString(buf)
            out.append(r)
    return out


def test_wandb_offline_run_holds_the_metrics(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)               # default: offline, no network
    with MetricsLogger(tmp_path, total_steps=3, tensorboard=False, progress=False, trackers=["wandb"],
                       run_name="seed0", group="sweepA", run_config={"replay": {"alpha": 0.6}}) as lg:
        for s in (1, 2, 3):
            lg.log(s, {"actor/pg_loss": 0.5 * s, "bad": float("nan") if s == 2 else 1.0})
        lg.event(3, "lower_lr", "KL too high")
    [run_file] = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    # wandb's service process may still be writing the offline file when finish() returns: read until the three
    # history rows are in (or 60 s have passed)
    deadline = time.monotonic() + 60.0
    while True:
        records = _wandb_records(run_file)
        if sum(r.WhichOneof("record_type") == "history" for r in records) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    hist = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            hist.setdefault(row["_step"], {}).update(row)
    assert [hist[s]["actor/pg_loss"] for s in (1, 2, 3)] == [0.5, 1.0, 1.5]
    assert "bad" not in hist[2] and hist[1]["bad"] == 1.0 and hist[3]["events/lower_lr"] == 1.0
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"][:1]
    assert run.display_name == "seed0" and run.run_group == "sweepA"


def test_mlflow_file_store_holds_the_metrics(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with MetricsLogger(tmp_path, total_steps=3, tensorboard=False, progress=False, trackers=["mlflow"],
                       run_name="seed1", group="sweepB", run_config={"replay": {"alpha": 0.6}}) as lg:
        for s in (1, 2, 3):
            lg.log(s, {"actor/pg_loss": 0.5 * s, "bad": float("nan") if s == 2 else 1.0})
        lg.event(2, "lower_lr", "KL too high")
    [metric_file] = list((tmp_path / "mlruns").glob("*/*/metrics/actor/pg_loss"))
    lines = [ln.split() for ln in metric_file.read_text().splitlines()]          # "<timestamp> <value> <step>"
    assert [(float(v), int(s)) for _, v, s in lines] == [(0.5, 1), (1.0, 2), (1.5, 3)]
    run_dir = metric_file.parents[2]
    assert [ln.split()[2] for ln in (run_dir / "metrics" / "bad").read_text().splitlines()] == ["1", "3"]
    assert (run_dir / "tags" / "event.2.lower_lr").read_text() == "KL too high"
    assert (run_dir / "tags" / "mlflow.runName").read_text() == "seed1"
    assert (run_dir / "params" / "replay.alpha").read_text() == "0.6"
    assert "name: sweepB" in (run_dir.parent / "meta.yaml").read_text()


def test_progress_bar_shows_the_data_score_with_or_without_a_critic(tmp_path):
    """The progress line shows the minibatch score of a critic run (critic/score/mean) and of a critic-free run
    (data/score/mean, hand-written critic-free metrics) under the same name."""
    from jaxppo.trainer.metrics_log import progress_postfix

    critic = {"critic/score/mean": 0.5, "actor/pg_loss": -0.125, "actor/ppo_kl": 0.001, "critic/vf_loss": 2.0,
              "perf/throughput": 1e4}
    assert progress_postfix(critic) == {"score/mean": "0.5", "pg_loss": "-0.125", "ppo_kl": "0.001",
                                        "vf_loss": "2"}
    critic_free = {"data/score/mean": 0.123456, "actor/advantages/mean": 0.0, "actor/pg_loss": -0.25,
                   "actor/ppo_kl": 0.002}
    assert progress_postfix(critic_free) == {"score/mean": "0.1235", "pg_loss": "-0.25", "ppo_kl": "0.002"}
    assert progress_postfix({"perf/throughput": 1.0}) == {}
    # the bar itself gets that postfix
    with MetricsLogger(tmp_path, total_steps=2, tensorboard=False, progress=True) as lg:
        lg.log(1, critic_free)
        assert lg._bar.postfix == "score/mean=0.1235, pg_loss=-0.25, ppo_kl=0.002"
