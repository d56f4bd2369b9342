"""Read a `ringsgd train --timeline` trace: where each rank's step time went, and a Gantt chart.

A step's time splits into four parts that add up to it:
  compute        forward + (backward - wait) + optimizer
  exposed comm   wait: the main thread blocked at the end of backward on all-reduces it did not hide
  data           fetching the batch
  idle           step - the rest (Python between the spans, zero_grad, the loss check)
Communication is judged on its own clock: an all-reduce that runs while backward still computes
(before that step's wait began) is hidden; overlap ratio = hidden / all all-reduce time.

Clocks of different ranks are not aligned, so every comparison stays within one rank.
"""
from __future__ import annotations

import argparse
import bisect
import json
import os

from .errors import UsageError

MAIN = ("data", "forward", "backward", "wait", "optimizer")
LANES = ("step",) + MAIN + ("allreduce",)
COLORS = {"data": "#937860", "forward": "#4C72B0", "backward": "#55A868", "wait": "#C44E52",
          "optimizer": "#8172B2", "allreduce": "#DD8452", "ring_step": "#333333"}


# --- reading -------------------------------------------------------------------------------------

def load_trace(path: str) -> list[dict]:
    """The trace's events; a file that is not a Chrome trace is one clear error, not a KeyError later."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"timeline trace {path} does not exist: "
                         "write one with ringsgd train --timeline FILE") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"timeline trace {path} is not JSON ({e.msg} at line {e.lineno}); was it cut short?") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read timeline trace {path}: {e}") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc  # the format also allows a bare list
    if not isinstance(events, list):
        raise UsageError(f"timeline trace {path} has no traceEvents list: is it a Chrome trace?")
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            raise UsageError(f"timeline trace {path}: event {i} is not an object")
        if e.get("ph") == "X" and not all(isinstance(e.get(k), (int, float)) for k in ("ts", "dur", "pid")):
            raise UsageError(f"timeline trace {path}: event {i} ({e.get('name')!r}) lacks a numeric ts, dur or pid")
    return events


def _end(e: dict) -> float:
    return e["ts"] + e["dur"]


def _steps(events: list[dict]) -> dict[int, list[dict]]:
    """Per rank, its steps in time order, each {"step", "span", one event per MAIN name, "allreduce": [...]}.

    Main-thread events belong to the step whose span contains their start; so do all-reduces (the
    end-of-backward wait guarantees they finish inside it too).
    """
    by_rank: dict[int, list[dict]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("name") == "step":
            by_rank.setdefault(e["pid"], []).append(e)
    out = {}
    for rank, spans in sorted(by_rank.items()):
        spans.sort(key=lambda e: e["ts"])
        out[rank] = [{"step": s.get("args", {}).get("step", i), "span": s, "allreduce": [], "ring_step": []}
                     for i, s in enumerate(spans)]
    starts = {rank: [s["span"]["ts"] for s in steps] for rank, steps in out.items()}
    for e in events:
        name = e.get("name")
        if e.get("ph") != "X" or e["pid"] not in out or name not in MAIN + ("allreduce", "ring_step"):
            continue
        i = bisect.bisect_right(starts[e["pid"]], e["ts"]) - 1
        if i < 0 or e["ts"] > _end(out[e["pid"]][i]["span"]):
            continue  # outside every step (e.g. before the first)
        step = out[e["pid"]][i]
        if name in ("allreduce", "ring_step"):
            step[name].append(e)
        else:
            step[name] = e
    return out


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


# --- the summary ---------------------------------------------------------------------------------

def summarize(events: list[dict], warmup: int = 1) -> dict[int, dict]:
    """Per rank: mean step time, its split into compute / exposed comm / data / idle, and the overlap.

    The first `warmup` steps of each rank are left out (the first one also waits for the slowest rank
    to arrive), but never all of them. Times are in ms, shares are fractions of the step time.
    """
    if warmup < 0:
        raise UsageError(f"warmup must be zero or more steps, got {warmup}")
    per_rank = _steps(events)
    if not per_rank:
        raise UsageError("the trace holds no training steps: write it with ringsgd train --timeline FILE")
    summary = {}
    for rank, steps in per_rank.items():
        skip = min(warmup, len(steps) - 1)
        steps = steps[skip:]
        t = dict.fromkeys(("step", "compute", "wait", "data", "idle", "allreduce", "hidden"), 0.0)
        n_allreduce = 0
        for s in steps:
            dur = {k: s[k]["dur"] if k in s else 0.0 for k in MAIN}
            compute = dur["forward"] + dur["backward"] - dur["wait"] + dur["optimizer"]
            step = s["span"]["dur"]
            t["step"] += step
            t["compute"] += compute
            t["wait"] += dur["wait"]
            t["data"] += dur["data"]
            t["idle"] += max(0.0, step - compute - dur["wait"] - dur["data"])
            if "backward" in s:  # the compute window: backward until its wait began
                w0 = s["backward"]["ts"]
                w1 = s["wait"]["ts"] if "wait" in s else _end(s["backward"])
                for a in s["allreduce"]:
                    t["allreduce"] += a["dur"]
                    t["hidden"] += _overlap(a["ts"], _end(a), w0, w1)
                    n_allreduce += 1
        n, total = len(steps), t["step"] or 1.0
        summary[rank] = {
            "rank": rank, "steps": n, "warmup_skipped": skip, "step_ms": t["step"] / n / 1e3,
            **{f"{k}_ms": t[k] / n / 1e3 for k in ("compute", "wait", "data", "idle")},
            **{f"{k}_share": t[k] / total for k in ("compute", "wait", "data", "idle")},
            "allreduce_count": n_allreduce, "allreduce_ms": t["allreduce"] / n / 1e3,
            "allreduce_total_ms": t["allreduce"] / 1e3, "hidden_ms": t["hidden"] / n / 1e3,
            "hidden_total_ms": t["hidden"] / 1e3,
            "overlap_ratio": t["hidden"] / t["allreduce"] if t["allreduce"] else 0.0,
        }
    return summary


def overall_overlap(summary: dict[int, dict]) -> float:
    """Hidden over all all-reduce time, every rank together."""
    total = sum(r["allreduce_total_ms"] for r in summary.values())
    return sum(r["hidden_total_ms"] for r in summary.values()) / total if total else 0.0


def format_table(summary: dict[int, dict]) -> str:
    """One row per rank: step time, where it went (%), and how much all-reduce backward hid."""
    import io

    from .bench.common import print_table

    headers = ["rank", "steps", "step ms", "compute", "exposed comm", "data", "idle",
               "allreduce ms", "hidden ms", "overlap"]
    rows = [[r["rank"], r["steps"], f"{r['step_ms']:.2f}",
             *(f"{100 * r[k + '_share']:.1f}%" for k in ("compute", "wait", "data", "idle")),
             f"{r['allreduce_ms']:.2f}", f"{r['hidden_ms']:.2f}", f"{100 * r['overlap_ratio']:.1f}%"]
            for r in summary.values()]
    buf = io.StringIO()
    print_table(headers, rows, file=buf)
    return buf.getvalue().rstrip("\n")


# --- the chart -----------------------------------------------------------------------------------

def _chosen_steps(per_rank: dict[int, list[dict]], k: int) -> list:
    """k consecutive step indices every rank has, from the middle of the run, past the first one."""
    common = sorted(set.intersection(*({s["step"] for s in steps} for steps in per_rank.values())))
    if not common:
        raise UsageError("the ranks in this trace share no step index to draw")
    pool = common[1:] if len(common) > 1 else common
    k = min(k, len(pool))
    first = (len(pool) - k) // 2
    return pool[first:first + k]


def gantt(events: list[dict], path: str, steps: int = 3, ranks: list[int] | None = None) -> str:
    """Draw a few steps as a PNG, one lane per rank and activity, each rank's time from its own start.

    Ring steps show as thin dark bars along the bottom of the all-reduce lane.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if steps < 1:
        raise UsageError(f"steps must be at least 1, got {steps}")
    per_rank = _steps(events)
    if not per_rank:
        raise UsageError("the trace holds no training steps: write it with ringsgd train --timeline FILE")
    if ranks is not None:
        unknown = sorted(set(ranks) - set(per_rank))
        if unknown:
            raise UsageError(f"rank(s) {unknown} are not in the trace, which has ranks {sorted(per_rank)}")
        per_rank = {r: per_rank[r] for r in ranks}
    chosen = _chosen_steps(per_rank, steps)

    lanes = [(rank, lane) for rank in per_rank for lane in LANES]
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.26 * len(lanes)))
    for rank, rank_steps in per_rank.items():
        picked = [s for s in rank_steps if s["step"] in chosen]
        t0 = picked[0]["span"]["ts"]

        def bar(lane: str, e: dict, color: str, height: float = 0.8, offset: float = 0.0) -> None:
            y = lanes.index((rank, lane))
            ax.broken_barh([((e["ts"] - t0) / 1e3, e["dur"] / 1e3)], (y - 0.4 + offset, height),
                           facecolors=color, edgecolor="none")

        for j, s in enumerate(picked):
            bar("step", s["span"], "#bbbbbb" if j % 2 else "#dddddd")
            ax.text((s["span"]["ts"] - t0 + s["span"]["dur"] / 2) / 1e3, lanes.index((rank, "step")),
                    f"step {s['step']}", ha="center", va="center", fontsize=7)
            for name in MAIN:
                if name in s:
                    bar(name, s[name], COLORS[name])
            for a in s["allreduce"]:
                bar("allreduce", a, COLORS["allreduce"])
            for r in s["ring_step"]:
                bar("allreduce", r, COLORS["ring_step"], height=0.15, offset=0.65)
    ax.set_yticks(range(len(lanes)), [f"rank {r} {lane}" for r, lane in lanes], fontsize=8)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    for i in range(len(LANES), len(lanes), len(LANES)):
        ax.axhline(i - 0.5, color="black", linewidth=0.6)
    ax.set_xlabel("ms since the rank's first drawn step began (rank clocks are not aligned)")
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=COLORS[k], label=k if k != "ring_step" else "ring step") for k in COLORS]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    ratio = overall_overlap({r: s for r, s in summarize(events).items() if r in per_rank})
    span = f"step {chosen[0]}" if len(chosen) == 1 else f"steps {chosen[0]}-{chosen[-1]}"
    ax.set_title(f"{os.path.basename(path)}: {span} on {len(per_rank)} rank(s); "
                 f"{100 * ratio:.0f}% of all-reduce time hidden behind backward", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --- CLI glue ------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", help="a trace written by ringsgd train --timeline FILE")
    parser.add_argument("--png", default=None, help="Gantt chart to write (default: next to the trace, *.gantt.png)")
    parser.add_argument("--steps", type=int, default=3, help="steps to draw, from the middle of the run")
    parser.add_argument("--ranks", default=None, help="comma list of ranks to draw (default: all)")
    parser.add_argument("--warmup", type=int, default=1, help="first steps per rank the summary leaves out")
    parser.add_argument("--json", default=None, metavar="OUT.json", help="write the summary as JSON")


def run_from_args(ns: argparse.Namespace) -> int:
    """`ringsgd timeline summarize`: print the table and the overlap, write the chart and the JSON."""
    from .bench.common import write_json

    ranks = None
    if ns.ranks:
        try:
            ranks = [int(r) for r in ns.ranks.split(",") if r.strip()]
        except ValueError:
            raise UsageError(f"--ranks {ns.ranks!r}: write a comma list of integers like 0,1") from None
    if ns.steps < 1:
        raise UsageError(f"--steps must be at least 1, got {ns.steps}")
    events = load_trace(ns.trace)
    summary = summarize(events, warmup=ns.warmup)
    if ranks is not None and set(ranks) - set(summary):
        raise UsageError(f"--ranks {ns.ranks}: the trace has ranks {sorted(summary)}")
    print(format_table(summary))
    ratio = overall_overlap(summary)
    print(f"overlap: {100 * ratio:.1f}% of all-reduce time ran while backward still computed "
          f"(all ranks, after {ns.warmup} warm-up step(s))")
    png = ns.png or os.path.splitext(ns.trace)[0] + ".gantt.png"
    gantt(events, png, steps=ns.steps, ranks=ranks)
    print(f"wrote {png}")
    write_json(ns.json, {"trace": os.path.abspath(ns.trace), "warmup": ns.warmup, "overlap_ratio": ratio,
                         "ranks": list(summary.values())})
    return 0
