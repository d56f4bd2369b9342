"""All-reduce correctness over real gloo processes on loopback.

One launch per world size runs every case and returns the results; the tests then check them, so
the suite pays the process start-up once per N, not once per case.
"""
import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ringsgd
from ringsgd import comm
from ringsgd.errors import UsageError

ALGOS = ("ring", "ps", "native")
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64)
WORLDS = (1, 2, 3, 4)


def rank_input(shape, dtype, seed, rank):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return torch.randint(-(10**12), 10**12, shape, generator=g, dtype=torch.int64)


def exact(shape, dtype, seed, n, op):
    total = sum(rank_input(shape, dtype, seed, r).to(torch.float64 if dtype.is_floating_point else torch.int64)
                for r in range(n))
    return total / n if op == "mean" else total


def check(result, shape, dtype, seed, n, op):
    """None if `result` is the exact sum/mean up to the dtype's own rounding, else a description."""
    want = exact(shape, dtype, seed, n, op)
    if result.dtype != dtype or tuple(result.shape) != tuple(shape):
        return f"dtype/shape changed: {result.dtype} {tuple(result.shape)}"
    if not dtype.is_floating_point:
        return None if torch.equal(result, want) else "integer sum not exact"
    scale = sum(rank_input(shape, dtype, seed, r).abs().to(torch.float64) for r in range(n))
    # the output is rounded once to `dtype`; the fp32/fp64 working sum adds at most n roundings
    work_eps = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps
    tol = torch.finfo(dtype).eps * want.abs() + n * work_eps * scale + 1e-300
    err = (result.to(torch.float64) - want).abs()
    return None if bool((err <= tol).all()) else f"max error {float(err.max()):g}"


def cases(n):
    shapes = [(0,), (1,), (max(n - 1, 1),), (n + 1,), (1000003,), (37, 29)]
    for algo in ALGOS:
        for shape in shapes:
            for dtype in DTYPES:
                for op in ("sum", "mean") if dtype.is_floating_point else ("sum",):
                    yield algo, shape, dtype, op


def _all_cases_worker():
    n, rank = dist.get_world_size(), dist.get_rank()
    failures, bytes_seen = [], {}
    for i, (algo, shape, dtype, op) in enumerate(cases(n)):
        x = rank_input(shape, dtype, i, rank)
        out = comm.all_reduce(x, algo, op)
        problem = check(out, shape, dtype, i, n, op) if out is x else "not in place"
        if problem:
            failures.append((algo, shape, str(dtype), op, problem))
    # non-contiguous input: reduced through a copy, written back into the same strided tensor
    for i, algo in enumerate(ALGOS):
        base = rank_input((29, 37), torch.float32, 500 + i, rank)
        x = base.t()
        comm.all_reduce(x, algo, "sum")
        problem = check(x.t(), (29, 37), torch.float32, 500 + i, n, "sum")
        if problem:
            failures.append((algo, "non-contiguous", problem))
    # bytes on the wire: divisible and indivisible sizes
    for numel in (n * 1000, 1000003):
        for algo in ALGOS:
            comm.reset_stats()
            comm.all_reduce(torch.ones(numel), algo, "sum")
            st = comm.stats(algo)
            bytes_seen[(algo, numel)] = (st.bytes_sent, st.bytes_received)
    return {"failures": failures, "bytes": bytes_seen, "chunks": [len(c) for c in torch.tensor_split(torch.empty(1000003), n)]}


@pytest.fixture(scope="module")
def results():
    return {n: ringsgd.launch(_all_cases_worker, workers=n, timeout=60) for n in WORLDS}


@pytest.mark.parametrize("n", WORLDS)
def test_exact_sum_and_mean(results, n):
    for rank, res in enumerate(results[n]):
        assert res["failures"] == [], f"rank {rank} of {n}"


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_sends_2_n_minus_1_over_n_of_the_bytes(results, n):
    for rank, res in enumerate(results[n]):
        numel = n * 1000
        assert res["bytes"][("ring", numel)] == (2 * (n - 1) * numel * 4 // n,) * 2
        # indivisible: rank r sends every chunk but r+1 (reduce-scatter) and r+2 (all-gather)
        c = res["chunks"]
        want = (2 * 1000003 - c[(rank + 1) % n] - c[(rank + 2) % n]) * 4
        sent, _ = res["bytes"][("ring", 1000003)]
        assert sent == want
        assert abs(sent - 2 * (n - 1) / n * 1000003 * 4) <= 2 * 4


@pytest.mark.parametrize("n", [2, 3, 4])
def test_parameter_server_traffic_grows_with_n(results, n):
    numel = n * 1000
    server_sent, _ = results[n][0]["bytes"][("ps", numel)]
    worker_sent, _ = results[n][1]["bytes"][("ps", numel)]
    assert server_sent == (n - 1) * numel * 4
    assert worker_sent == numel * 4


def test_one_worker_is_a_no_op(results):
    assert results[1][0]["bytes"][("ring", 1000)] == (0, 0)


def _property_worker():
    """Hypothesis inside the workers: derandomized, so every rank draws the same examples in order."""
    n, rank = dist.get_world_size(), dist.get_rank()
    failures = []

    @settings(max_examples=30, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(shape=st.lists(st.integers(0, 40), min_size=0, max_size=3),
           algo=st.sampled_from(ALGOS), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 10**6))
    def prop(shape, algo, dtype, seed):
        x = rank_input(tuple(shape), dtype, seed, rank)
        comm.all_reduce(x, algo, "sum")
        problem = check(x, tuple(shape), dtype, seed, n, "sum")
        if problem:
            failures.append((shape, algo, str(dtype), problem))

    prop()
    return failures


def test_random_shapes_property():
    assert ringsgd.launch(_property_worker, workers=3, timeout=60) == [[], [], []]


def _errors_worker():
    msgs = {}
    for name, call in {
        "op": lambda: comm.ring_all_reduce(torch.ones(3), op="max"),
        "int_mean": lambda: comm.ring_all_reduce(torch.ones(3, dtype=torch.int64), op="mean"),
        "device": lambda: comm.ring_all_reduce(torch.ones(3, device="meta")),
        "not_tensor": lambda: comm.ring_all_reduce([1.0, 2.0]),
        "algo": lambda: comm.all_reduce(torch.ones(3), algo="tree"),
        "async_op": lambda: comm.all_reduce_async(torch.ones(3), op="max"),
    }.items():
        try:
            call()
            msgs[name] = None
        except UsageError as e:
            msgs[name] = str(e)
    # the group must still work after refused calls: nothing was half-sent
    x = torch.ones(5)
    comm.ring_all_reduce(x)
    msgs["after"] = x.tolist()
    h = comm.all_reduce_async(torch.full((7,), 2.0), "ring", "mean")
    msgs["async"] = h.wait(30).tolist()
    return msgs


def test_bad_input_gets_one_clear_error():
    msgs = ringsgd.launch(_errors_worker, workers=2, timeout=60)[0]
    assert "unknown op 'max'" in msgs["op"]
    assert "floating-point" in msgs["int_mean"]
    assert "gloo" in msgs["device"] and "meta" in msgs["device"]
    assert "torch.Tensor" in msgs["not_tensor"]
    assert "unknown algorithm 'tree'" in msgs["algo"]
    assert "unknown op" in msgs["async_op"]
    assert msgs["after"] == [2.0] * 5
    assert msgs["async"] == [2.0] * 7


def test_no_process_group_is_a_clear_error():
    assert not dist.is_initialized()
    with pytest.raises(UsageError, match="not initialised"):
        comm.ring_all_reduce(torch.ones(3))
