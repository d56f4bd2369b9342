"""The benchmark commands run end to end and write well-formed JSON and PNG (no timing asserted)."""
import json

from ringsgd import cli


def test_allreduce_benchmark_table_and_json(tmp_path, capsys):
    out = tmp_path / "ar.json"
    assert cli.main(["bench", "allreduce", "--workers", "2", "--sizes", "4KiB,1MiB", "--iters", "2",
                     "--warmup", "1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["workers"] == 2
    rows = data["results"]
    assert {(r["bytes"], r["algo"]) for r in rows} == {(b, a) for b in (4096, 1 << 20) for a in ("ring", "ps", "native")}
    for r in rows:
        assert r["max_error"] == 0 and r["time_us"] > 0
        assert abs(r["busbw_GBps"] - r["algbw_GBps"]) < 1e-12  # 2(N-1)/N = 1 for N = 2
    assert "ring/native busbw" in capsys.readouterr().out


def test_step_benchmark_splits_compute_and_communication(tmp_path):
    out = tmp_path / "step.json"
    assert cli.main(["bench", "step", "--workers", "2", "--model", "lenet", "--batch", "8", "--iters", "2",
                     "--warmup", "1", "--algo", "ring", "--json", str(out)]) == 0
    r = json.loads(out.read_text())["results"][0]
    assert r["algo"] == "ring" and r["buckets"] >= 1
    for k in ("compute_ms", "comm_ms", "overlap_ms", "serial_ms"):
        assert r[k] > 0


def test_short_scaling_run_writes_json_and_png(tmp_path):
    js, png = tmp_path / "s.json", tmp_path / "s.png"
    assert cli.main(["bench", "scaling", "--dataset", "digits", "--workers", "1,2", "--algo", "ring",
                     "--regime", "weak", "--epochs", "1", "--batch", "64", "--json", str(js), "--plot", str(png)]) == 0
    data = json.loads(js.read_text())
    rows = data["results"]
    assert [(r["workers"], r["global_batch"]) for r in rows] == [(1, 64), (2, 128)]
    assert rows[0]["speedup"] == 1.0 and rows[1]["speedup"] > 0
    for r in rows:
        shares = r["compute_share"] + r["comm_exposed_share"] + r["data_share"] + r["idle_share"]
        assert abs(shares - 1) < 0.05
        assert 0 <= r["test_accuracy"] <= 1 and r["threads"] == 1
    assert png.stat().st_size > 1000
    assert data["paper"]["mnist_4gpu_speedup"] == 3.77
