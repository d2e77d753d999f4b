"""Real 4-rank torch.distributed worlds on CPU (gloo)."""

import pytest

import dist_workers
from lm_resiliency.workloads import TrainConfig, spawn

pytestmark = pytest.mark.distributed


def check_c3(results):
    for r in results:  # every rank reached the same decisions
        assert {k: v for k, v in r.items() if not k.startswith("subgroup")} == results[0]
    r = results[0]
    assert r["clean"] == ("Agree", [], [0, 1, 2, 3])
    assert r["one_altered"] == ("Attributed", [1], [0, 1, 2, 3])
    assert r["two_altered"][0] == "Inconclusive"  # 2 of 4 agree: no strict majority
    assert r["timing"] == ("Attributed", [3], [0, 1, 2, 3])
    assert r.get("async_collective", ("Agree", [], [0, 1, 2, 3])) == ("Agree", [], [0, 1, 2, 3])
    assert all(x["subgroup"] == ("Attributed", [3], [1, 2, 3]) for x in results[1:])
    assert all(x["subgroup_long"] == ("Attributed", [2], [1, 2, 3]) for x in results[1:])


def test_c3_over_a_gloo_world():
    results = spawn(dist_workers.c3_checks, 4, args=("cpu",))
    assert "async_collective" in results[0]
    check_c3(results)


@pytest.mark.gpu
def test_c3_over_gloo_with_cuda_tensors():
    check_c3(spawn(dist_workers.c3_checks, 4, args=("cuda",)))


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2", "hsdp"])
def test_reference_workload_trains_and_replicas_agree(parallel):
    cfg = TrainConfig(parallel=parallel, steps=25, dp_replicate=2)
    results = spawn(dist_workers.train_and_compare, 4, args=(cfg,))
    losses = results[0]["losses"]
    assert len(losses) == 25
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.6 * first, losses
    for r in results:
        assert r["losses"] == losses
        assert r["status"] == "Agree"
    if parallel == "hsdp":  # 2 x 2 mesh: replicate peers are ranks {0, 2} and {1, 3}
        assert sorted(tuple(r["peers"]) for r in results) == [(0, 2), (0, 2), (1, 3), (1, 3)]
    else:
        assert results[0]["peers"] == [0, 1, 2, 3]


@pytest.mark.gpu
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2", "hsdp"])
def test_reference_workload_trains_on_cuda(parallel):
    # Four ranks share one GPU through gloo (NCCL would need a GPU per rank).
    cfg = TrainConfig(parallel=parallel, steps=15, device="cuda")
    results = spawn(dist_workers.train_and_compare, 4, args=(cfg,))
    losses = results[0]["losses"]
    assert sum(losses[-3:]) < 0.8 * sum(losses[:3]), losses
    assert all(r["status"] == "Agree" for r in results)


def test_spawn_reports_the_failing_rank():
    with pytest.raises(RuntimeError, match="rank 1 failed"):
        spawn(dist_workers.fail_on_rank_one, 2)


def test_spawn_reports_a_rank_that_returns_nothing_usable():
    with pytest.raises(RuntimeError, match="without a result"):
        spawn(dist_workers.return_unpicklable, 2, timeout=60)


def test_a_rank_killed_by_a_signal_names_where_it_died():
    # The crash of a rank inside native code names the Python frames it was in, from
    # faulthandler (a GPU world's rank 0 ended with exit code -11 and nothing else to go on).
    with pytest.raises(RuntimeError, match="rank 1 exited with code -11") as failure:
        spawn(dist_workers.crash_in_native_code_on_rank_one, 2, timeout=60)
    assert "Fatal Python error: Segmentation fault" in str(failure.value)
    assert "crash_in_native_code_on_rank_one" in str(failure.value)


def test_a_world_that_cannot_start_says_why():
    """Arguments a rank cannot receive fail at the start with the pickling error itself (the
    cleanup once joined the unstarted processes and raised an AssertionError instead)."""
    with pytest.raises(Exception, match="pickle") as failure:
        spawn(dist_workers.c3_checks, 2, args=(lambda: 0,))
    assert not isinstance(failure.value, AssertionError)

def test_worlds_with_a_preload_fork_from_one_warm_parent():
    preload = ("dist_workers_preload:shim", "dist_workers")
    first = spawn(dist_workers.preloaded_state, 2, preload=preload, env={"LMR_TEST_RANK_ENV": "a"})
    second = spawn(dist_workers.preloaded_state, 3, preload=preload, env={"LMR_TEST_RANK_ENV": "b"})
    parents = {r["parent"] for r in first + second}
    assert len(parents) == 1  # one parent served both worlds
    # The shim ran once, in the parent; every rank has its world's own environment.
    assert all(r["marker"] and r["shim"] == [next(iter(parents))] for r in first + second)
    assert [r["env"] for r in first] == ["a", "a"] and [r["env"] for r in second] == ["b"] * 3
    assert [r["world"] for r in second] == [3, 3, 3]
    plain = spawn(dist_workers.preloaded_state, 1)[0]
    assert plain["parent"] not in parents and not plain["marker"]
    # A failing rank is reported as from any world, and the parent serves the next one.
    with pytest.raises(RuntimeError, match="rank 1 failed"):
        spawn(dist_workers.fail_on_rank_one, 2, preload=preload)
    assert spawn(dist_workers.preloaded_state, 1, preload=preload)[0]["parent"] in parents


def test_a_preload_that_fails_is_a_clear_error():
    with pytest.raises(RuntimeError, match="(?s)could not import.*this preload fails on purpose"):
        spawn(dist_workers.preloaded_state, 2, preload=("dist_workers_preload:broken",))
