"""End-to-end training: the demo's accuracy, resume after a kill, torchrun, faults and bad input."""
import json
import os
import subprocess
import sys
import time

import pytest

from ringsgd import checkpoint, cli
from ringsgd.data import make_mnist_from_digits
from ringsgd.errors import CheckpointError, WorkerFailure
from ringsgd.train import TrainConfig, train

QUICK = dict(dataset="digits", workers=2, global_batch=64, progress=False)


def test_demo_two_workers_reach_95_percent_on_digits(tmp_path):
    s = train(TrainConfig(**QUICK, epochs=8, out=str(tmp_path / "run")))
    assert s["history"][-1]["test_accuracy"] >= 0.95
    assert s["rank_hashes"][0] == s["rank_hashes"][1]
    for name in ("metrics.json", "metrics.csv", "curves.png"):
        assert os.path.getsize(tmp_path / "run" / name) > 0
    meta = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert len(meta["history"]) == 8 and meta["effective_lr"] == pytest.approx(0.01)


def test_resume_after_a_kill_reaches_the_same_parameters(tmp_path):
    full = train(TrainConfig(**QUICK, epochs=3, out=str(tmp_path / "full")))
    steps_per_epoch = full["steps"] // 3
    with pytest.raises(WorkerFailure, match="killed by SIGKILL"):
        train(TrainConfig(**QUICK, epochs=3, out=str(tmp_path / "cut"),
                          inject_fault=f"kill@1:{steps_per_epoch + 3}"))
    ckpts = checkpoint.list_checkpoints(str(tmp_path / "cut" / "checkpoints"))
    assert [os.path.basename(c) for c in ckpts] == ["ckpt-epoch0001.pt"]
    resumed = train(TrainConfig(**QUICK, epochs=3, out=str(tmp_path / "cut"), resume=True))
    assert resumed["param_hash"] == full["param_hash"]
    assert [h["epoch"] for h in resumed["history"]] == [1, 2, 3]


def test_resume_in_the_middle_of_an_epoch_continues_from_the_next_batch(tmp_path):
    full = train(TrainConfig(**QUICK, epochs=2, evaluate=False))
    out = str(tmp_path / "cut")
    cut = train(TrainConfig(**QUICK, epochs=2, max_steps=30, evaluate=False, out=out))  # epoch 2 has 22
    assert cut["steps"] == 30 and [h["complete"] for h in cut["history"]] == [True, False]
    resumed = train(TrainConfig(**QUICK, epochs=2, evaluate=False, out=out, resume=True))
    assert resumed["steps"] == full["steps"] == 44
    assert resumed["param_hash"] == full["param_hash"]


def test_corrupt_checkpoint_is_refused_and_the_previous_one_kept(tmp_path):
    out = tmp_path / "run"
    train(TrainConfig(**QUICK, epochs=2, max_steps=30, out=str(out)))
    ckpts = checkpoint.list_checkpoints(str(out / "checkpoints"))
    assert len(ckpts) == 2
    good = checkpoint.load(ckpts[0])
    with open(ckpts[1], "r+b") as f:  # truncate the newest, as a crash in mid-write would without rename
        f.truncate(os.path.getsize(ckpts[1]) // 2)
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        checkpoint.load(ckpts[1])
    with pytest.raises(CheckpointError, match="ckpt-epoch0002.pt is truncated or corrupt"):
        train(TrainConfig(**QUICK, epochs=3, out=str(out), resume=True))
    assert checkpoint.load(ckpts[0])["epoch"] == good["epoch"] == 1


def test_killed_worker_in_training_ends_the_run_within_the_timeout(capsys):
    t0 = time.monotonic()
    rc = cli.main(["train", "--dataset", "digits", "--workers", "3", "--global-batch", "63", "--epochs", "1",
                   "--timeout", "10", "--no-progress", "--out", "", "--inject-fault", "kill@2:4"])
    assert rc == 1
    assert time.monotonic() - t0 < 10 + 20  # start-up + timeout + grace, on a loaded 2-core machine
    assert "worker 2 failed first (killed by SIGKILL)" in capsys.readouterr().err


@pytest.mark.parametrize("fault,expect", [("raise", "RuntimeError: injected fault on rank 1 at step 2"),
                                          ("nan", "FloatingPointError: loss is nan"),
                                          ("diverge", "replicas diverged at step 3")])
def test_faults_are_reported_with_rank_and_traceback(fault, expect):
    with pytest.raises(WorkerFailure) as info:
        train(TrainConfig(**QUICK, epochs=1, timeout=20, check_sync_every=1, inject_fault=f"{fault}@1:2"))
    assert expect in str(info.value) and "Traceback" in str(info.value)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "ringsgd", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args,message", [
    (["--workers", "0"], "workers must be an integer from 1 to"),
    (["--workers", "3", "--global-batch", "64"], "does not split evenly over 3 workers"),
    (["--dataset", "imagenet"], "unknown dataset 'imagenet'"),
    (["--algo", "tree"], "unknown algorithm 'tree'"),
    (["--dataset", "mnist", "--data-dir", "/no/such/dir"], "data directory /no/such/dir does not exist"),
    (["--device", "cuda"], "no CUDA GPU is available"),
    (["--resume", "--out", "/tmp/ringsgd-test-no-such-run"], "--resume: no checkpoint in"),
    (["--inject-fault", "explode"], "--inject-fault 'explode'"),
])
def test_bad_arguments_get_one_clear_line(args, message, capsys):
    rc = cli.main(["train", "--no-progress", *args] + ([] if "--out" in args else ["--out", ""]))
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_bad_data_files_get_one_clear_line(tmp_path, capsys):
    make_mnist_from_digits(str(tmp_path))
    images = tmp_path / "train-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:1000])  # truncated
    rc = cli.main(["train", "--dataset", "mnist", "--data-dir", str(tmp_path), "--workers", "1",
                   "--no-progress", "--out", ""])
    err = capsys.readouterr().err
    assert rc == 2 and "train-images-idx3-ubyte" in err and err.count("\n") == 1


def test_torchrun_gives_the_same_result_as_the_builtin_launcher(tmp_path):
    common = ["train", "--dataset", "digits", "--epochs", "1", "--max-steps", "6", "--no-progress",
              "--global-batch", "64"]
    builtin = run_cli(*common, "--workers", "2", "--out", str(tmp_path / "a"))
    assert builtin.returncode == 0, builtin.stderr
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    tr = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                         "-m", "ringsgd", *common, "--out", str(tmp_path / "b")],
                        capture_output=True, text=True, timeout=180, env=env)
    assert tr.returncode == 0, tr.stderr[-3000:]
    a = json.loads((tmp_path / "a" / "metrics.json").read_text())
    b = json.loads((tmp_path / "b" / "metrics.json").read_text())
    assert b["workers"] == 2
    assert a["params_sha256"] == b["params_sha256"]


def test_the_readme_example_runs():
    path = os.path.join(os.path.dirname(__file__), "..", "examples", "custom_loop.py")
    out = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "2 workers, 3 epochs: test accuracy" in out.stdout
