"""The trace summary against a hand-made trace with known numbers, then on a real 2-worker run."""
import json

import pytest

from ringsgd import cli
from ringsgd import timeline_summary as ts
from ringsgd.errors import UsageError

KINDS = ("step", "data", "forward", "backward", "wait", "optimizer", "allreduce", "ring_step")


def X(name, pid, t0, t1, **args):
    e = {"name": name, "ph": "X", "ts": float(t0), "dur": float(t1 - t0), "pid": pid, "tid": 0}
    if args:
        e["args"] = args
    return e


def rank0_step(s):
    """100 us: data 10, forward 30, backward 40 (its last 10 waiting), optimizer 15, idle 5.

    All-reduces: 15 us wholly inside the compute window, then 10 us of which 2 come before the wait.
    """
    t = 1000 + 100 * s
    return [X("step", 0, t, t + 100, step=s), X("data", 0, t, t + 10), X("forward", 0, t + 10, t + 40),
            X("backward", 0, t + 40, t + 80), X("wait", 0, t + 70, t + 80), X("optimizer", 0, t + 80, t + 95),
            X("allreduce", 0, t + 50, t + 65, bucket=0), X("ring_step", 0, t + 50, t + 57, step=0),
            X("allreduce", 0, t + 68, t + 78, bucket=1)]


def rank1_step(s):
    """200 us on a clock 9 s ahead: data 20, forward 60, backward 100 (last 30 waiting), optimizer 10, idle 10.

    All-reduces: 60 us of which 50 before the wait, then 10 us wholly inside the wait.
    """
    t = 9_000_000 + 200 * s
    return [X("step", 1, t, t + 200, step=s), X("data", 1, t, t + 20), X("forward", 1, t + 20, t + 80),
            X("backward", 1, t + 80, t + 180), X("wait", 1, t + 150, t + 180), X("optimizer", 1, t + 180, t + 190),
            X("allreduce", 1, t + 100, t + 160, bucket=0), X("allreduce", 1, t + 165, t + 175, bucket=1)]


def synthetic(steps=2):
    meta = [{"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"rank {r}"}} for r in (0, 1)]
    events = meta + [e for s in range(steps) for e in rank0_step(s) + rank1_step(s)]
    events += [X("evaluate", 0, 1000 + 100 * steps, 1000 + 100 * steps + 500),
               X("evaluate", 1, 9_000_000 + 200 * steps, 9_000_000 + 200 * steps + 500)]
    return events


def write_trace(path, events):
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return str(path)


# --- the summary by hand -------------------------------------------------------------------------

@pytest.mark.parametrize("rank, step_ms, shares", [
    (0, 0.100, {"compute": 0.75, "wait": 0.10, "data": 0.10, "idle": 0.05}),  # compute 30 + 40 - 10 + 15
    (1, 0.200, {"compute": 0.70, "wait": 0.15, "data": 0.10, "idle": 0.05}),  # compute 60 + 100 - 30 + 10
])
def test_shares_by_hand_add_up_to_the_step(rank, step_ms, shares):
    r = ts.summarize(synthetic(), warmup=0)[rank]
    assert r["steps"] == 2 and r["step_ms"] == pytest.approx(step_ms)
    for k, v in shares.items():
        assert r[f"{k}_share"] == pytest.approx(v)
        assert r[f"{k}_ms"] == pytest.approx(v * step_ms)
    assert sum(r[f"{k}_share"] for k in shares) == pytest.approx(1.0, abs=0.05)


def test_overlap_ratio_exact():
    s = ts.summarize(synthetic(), warmup=0)
    assert s[0]["allreduce_count"] == 4  # ring steps are not all-reduces
    assert (s[0]["allreduce_total_ms"], s[0]["hidden_total_ms"]) == pytest.approx((0.050, 0.034))
    assert s[0]["overlap_ratio"] == pytest.approx(17 / 25)
    assert s[1]["overlap_ratio"] == pytest.approx(50 / 70)
    assert s[1]["hidden_ms"] == pytest.approx(0.050)
    assert ts.overall_overlap(s) == pytest.approx((34 + 100) / (50 + 140))


def test_warmup_skips_the_first_step_but_never_all():
    two = ts.summarize(synthetic(steps=2))
    assert two[0]["steps"] == 1 and two[0]["warmup_skipped"] == 1
    assert two[0]["compute_share"] == pytest.approx(0.75)
    one = ts.summarize(synthetic(steps=1), warmup=5)
    assert one[1]["steps"] == 1 and one[1]["warmup_skipped"] == 0


def test_format_table_one_row_per_rank():
    lines = ts.format_table(ts.summarize(synthetic(), warmup=0)).splitlines()
    assert "exposed comm" in lines[0] and len(lines) == 4
    assert "75.0%" in lines[2] and "68.0%" in lines[2] and "71.4%" in lines[3]


def test_middle_steps_skip_the_first():
    events = [e for s in range(10) for e in rank0_step(s)]
    assert ts._chosen_steps(ts._steps(events), 3) == [4, 5, 6]
    assert ts._chosen_steps(ts._steps(events[:9]), 3) == [0]  # one step: nothing to skip to


# --- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, match", [
    ("{not json", "is not JSON"),
    ('{"events": []}', "no traceEvents"),
    ('{"traceEvents": [{"name": "step", "ph": "X", "ts": "soon"}]}', "numeric ts"),
])
def test_bad_trace_files_are_usage_errors(tmp_path, text, match):
    (tmp_path / "t.json").write_text(text)
    with pytest.raises(UsageError, match=match):
        ts.load_trace(str(tmp_path / "t.json"))


def test_missing_trace_and_no_steps(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        ts.load_trace(str(tmp_path / "nope.json"))
    with pytest.raises(UsageError, match="no training steps"):
        ts.summarize(ts.load_trace(write_trace(tmp_path / "t.json", [X("evaluate", 0, 0, 5)])))
    with pytest.raises(UsageError, match="not in the trace"):
        ts.gantt(synthetic(), str(tmp_path / "g.png"), ranks=[0, 7])


def test_cli_prints_table_writes_png_and_json(tmp_path, capsys):
    trace = write_trace(tmp_path / "t.json", synthetic(steps=4))
    assert cli.main(["timeline", "summarize", trace, "--json", str(tmp_path / "s.json"), "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "exposed comm" in out and "overlap:" in out
    assert (tmp_path / "t.gantt.png").stat().st_size > 0
    payload = json.loads((tmp_path / "s.json").read_text())
    assert [r["rank"] for r in payload["ranks"]] == [0, 1] and payload["ranks"][0]["steps"] == 3
    assert cli.main(["timeline", "summarize", str(tmp_path / "nope.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ringsgd: error:") and len(err.splitlines()) == 1


# --- a real 2-worker run -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_trace(tmp_path_factory):
    from ringsgd.train import TrainConfig, train
    path = tmp_path_factory.mktemp("run") / "t.json"
    train(TrainConfig(dataset="digits", workers=2, global_batch=32, epochs=1, max_steps=6, timeline=str(path),
                      progress=False, out=None, bucket_cap_mb=0.5))
    return str(path)


def test_real_trace_has_every_kind_on_every_rank(real_trace):
    events = ts.load_trace(real_trace)
    for rank in (0, 1):
        names = {e["name"] for e in events if e.get("ph") == "X" and e["pid"] == rank}
        assert set(KINDS) <= names, f"rank {rank} lacks {set(KINDS) - names}"
        assert sum(e["name"] == "step" for e in events if e.get("pid") == rank and e.get("ph") == "X") == 6


def test_real_trace_allreduce_starts_during_backward(real_trace):
    """Overlap, read straight off the clock of one rank: a bucket goes out before backward ends."""
    events = [e for e in ts.load_trace(real_trace) if e.get("ph") == "X"]
    for rank in (0, 1):
        mine = [e for e in events if e["pid"] == rank]
        steps = [e for e in mine if e["name"] == "step"]
        early = 0
        for s in steps:
            inside = [e for e in mine if s["ts"] <= e["ts"] <= s["ts"] + s["dur"]]
            (bwd,) = [e for e in inside if e["name"] == "backward"]
            early += any(e["name"] == "allreduce" and e["ts"] < bwd["ts"] + bwd["dur"] for e in inside)
        assert early > 0, f"rank {rank}: no all-reduce began before backward ended"


def test_real_trace_summary_adds_up_and_draws(real_trace, tmp_path):
    events = ts.load_trace(real_trace)
    summary = ts.summarize(events)
    assert sorted(summary) == [0, 1]
    for r in summary.values():
        assert r["steps"] == 5 and r["allreduce_count"] >= 5
        parts = sum(r[f"{k}_share"] for k in ("compute", "wait", "data", "idle"))
        assert parts == pytest.approx(1.0, abs=0.05)
        assert 0.0 <= r["overlap_ratio"] <= 1.0
    png = ts.gantt(events, str(tmp_path / "g.png"), steps=3)
    assert (tmp_path / "g.png").stat().st_size > 1000 and png.endswith("g.png")
