"""The TorchTitan adapter with TorchTitan's real Trainer on CPU ranks (gloo), built from
TorchTitan's own command line through ``lmr-torchtitan``'s main: conformance under FSDP,
HSDP, TP x FSDP, CP x FSDP and EP x FSDP on a MoE model (module replay by each TP, CP or EP
group, compared within a coordinate) and PP; a campaign of hidden-output, gradient and weight SDC scored by
``lmr campaign compare`` in every layout (localized where the layout gives a strict
majority, and the cells that cannot, asserted as such); fault-free runs; the campaign clock
across TorchTitan's own checkpoints; certified checkpoints and recovery."""

import json
import os
import shutil
import subprocess
import sysconfig

import pytest

pytest.importorskip("torchtitan")

import torchtitan_cpu  # noqa: E402
import torchtitan_workers as w  # noqa: E402
from lm_resiliency.fault_injection import FaultCampaign, FaultInjectionRecord  # noqa: E402
from lm_resiliency.scout import explain_attributions  # noqa: E402
from lm_resiliency.workloads import spawn  # noqa: E402
from test_scout import replay_results  # noqa: E402

pytestmark = pytest.mark.distributed

EXPECTED = ["matches", "structure", "tensors", "optimizer", "loads", "communication", "replay"]
STEPS = 12


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The tokenizer, dataset and config package every rank reads (made once)."""
    return torchtitan_cpu.assets(str(tmp_path_factory.mktemp("tt-assets")))


# layout: (world, ranks and blocks of the hidden, gradient and weight faults, layers, localized)
CELLS = {
    # 4 compute peers (2 replicas x 2 shards): every fault localized.
    "hsdp": (4, (1, 2, 3), (1, 0, 1), 2, {"hidden", "gradient", "weight"}),
    # 2 stages of 3 FSDP ranks, faults on blocks of both stages: every fault localized.
    "pp_fsdp": (6, (1, 4, 5), (1, 3, 2), 4, {"hidden", "gradient", "weight"}),
    # 2 peers: replay sees the hidden and gradient faults but no strict majority names a
    # rank; the weight fault is seen at rest by its shard's owner.
    "fsdp": (2, (1, 0, 1), (1, 0, 1), 2, {"weight"}),
    # TP2 x FSDP3: each block replayed by its TP group in every replica, compared among the
    # 3 ranks of each TP coordinate: every fault localized to its rank.
    "tp_fsdp": (6, (1, 2, 3), (1, 0, 1), 2, {"hidden", "gradient", "weight"}),
    # CP2 x FSDP3: each CP group replays a block together (its attention gathers keys and
    # values over the CP group), compared among the 3 ranks of each CP coordinate.
    "cp_fsdp": (6, (1, 2, 3), (1, 0, 1), 2, {"hidden", "gradient", "weight"}),
    # DeepSeek-V3's MoE blocks (TorchTitan's GroupedExperts, 6 routed experts) under EP2 x
    # FSDP3: each EP group replays a block together (its token AllToAll included), compared
    # within each EP coordinate; gradient and weight faults on the rank's routed experts.
    "ep_fsdp": (6, (1, 2, 3), (2, 2, 1), 3, {"hidden", "gradient", "weight"}),
    # One rank per stage: no peers, nothing to compare.
    "pp": (2, (1, 0, 1), (1, 0, 1), 2, set()),
}
CONFORMANCE = ("fsdp", "hsdp", "tp_fsdp", "pp")  # the layouts whose adapter is checked
FIRST_FAULT = 3  # tt_campaign's first faulty iteration: the steps before it are fault-free
GRADIENT_STEPS = 3 + len(w.GRADIENT_OPERATIONS)  # the gradient operations' campaign, to its last window


@pytest.fixture(scope="module")
def worlds(env, tmp_path_factory):
    """One world a layout, started when a test first asks for it: the adapter conformance
    checks (where CONFORMANCE has the layout), then in the same world a fresh job runs the
    layout's campaign with a check every step and state integrity on. What each rank
    returned, and the campaign's artifact folder; a world that failed fails every test that
    asks for it, without starting again."""
    done = {}

    def get(layout):
        if layout not in done:
            world, ranks, blocks, layers, _ = CELLS[layout]
            artifacts = tmp_path_factory.mktemp(f"tt-{layout}")
            campaign_run = (STEPS, ["--lmr-check-interval", "1", "--lmr-state-integrity", "on",
                                    "--lmr-artifacts", str(artifacts)], [], cell_campaign(layout))
            env_layers = {**env, "LMR_TT_LAYERS": str(layers)}
            if layout == "ep_fsdp":
                env_layers["LMR_TT_CONFIG"] = "dsv3_cpu_tiny"
            second = None
            if layout == "hsdp":  # TorchTitan's selective activation checkpointing on, and every gradient operation
                env_layers["LMR_TT_AC"] = "1"
                second = (GRADIENT_STEPS, ["--lmr-check-interval", "1", "--lmr-artifacts", str(artifacts / "gradients")],
                          [], w.gradient_operations_campaign())
            try:
                if layout in CONFORMANCE:
                    out = spawn(w.conformance, world, preload=torchtitan_cpu.PRELOAD,
                                args=(layout, campaign_run, second), env=env_layers, timeout=900)
                else:
                    out = [{"run": o} for o in spawn(w.run, world, preload=torchtitan_cpu.PRELOAD, timeout=900,
                                                     env=env_layers, args=(layout, *campaign_run))]
                done[layout] = (out, artifacts)
            except Exception as e:  # noqa: BLE001 - kept for the other test of this layout
                done[layout] = e
        if isinstance(done[layout], Exception):
            raise done[layout]
        return done[layout]

    return get


def cell_campaign(layout):
    ranks, blocks = CELLS[layout][1:3]
    return (w.tt_moe_campaign if layout == "ep_fsdp" else w.tt_campaign)(ranks, blocks)


@pytest.mark.parametrize("layout", CONFORMANCE)
def test_conformance(worlds, layout):
    out, _ = worlds(layout)
    assert all(o["name"] == "torchtitan" and o["checks"] == EXPECTED for o in out)
    assert all(o["replay"] is None for o in out)  # AdamW over copies, bit for bit
    mesh = {"fsdp": [("fsdp", 2, "shard")], "hsdp": [("dp_replicate", 2, "replicate"), ("fsdp", 2, "shard")],
            "tp_fsdp": [("fsdp", 3, "shard"), ("tp", 2, "model")], "pp": [("pp", 2, "model")]}[layout]
    assert out[0]["mesh"] == mesh
    if layout == "pp":  # global layer keys kept on each stage; the embedding first, the head last
        assert [o["blocks"] for o in out] == [[0], [1]]
        assert [o["holds"] for o in out] == [[True, False], [False, True]]
    else:
        assert all(o["blocks"] == [0, 1] and o["holds"] == [True, True] for o in out)
    assert out[0]["modules"] is None, out[0]["modules"]  # module replay on in every layout, TP included


@pytest.mark.parametrize("layout", list(CELLS))
def test_campaign_in_each_layout(worlds, layout):
    out, tmp_path = worlds(layout)
    per_rank = [o["run"] for o in out]
    world, _, _, _, localized = CELLS[layout]
    assert all(out["clock"] == (STEPS, STEPS) for out in per_rank)
    lmr_cli = shutil.which("lmr", path=sysconfig.get_path("scripts"))
    artifacts = sorted(str(p) for p in tmp_path.glob("injections-rank-*.json"))
    assert len(artifacts) == world
    compare = subprocess.run([lmr_cli, "campaign", "compare", "--injections", *artifacts, "--localization",
                              str(tmp_path / "localization.json"), "--format", "json"], capture_output=True, text=True)
    report = json.loads(compare.stdout)
    got = {o["occurrence_id"].split("@")[0] for o in report["occurrences"] if o["localized"]}
    assert got == localized, report
    assert report["totals"]["injected"] == 3, (report["totals"], [r.get("error") for out in per_rank
                                                                  for r in out["records"] if r.get("error")])
    assert compare.returncode == (0 if len(localized) == 3 else compare.returncode)
    campaign = FaultCampaign.from_json(cell_campaign(layout))
    records = [FaultInjectionRecord.from_dict(r) for out in per_rank for r in out["records"]]
    results = [r for out in per_rank for r in replay_results(out["results"])]
    unexplained = [a.describe() for a in explain_attributions(campaign, records, results)
                   if a.explanation == "unexplained"]
    assert not unexplained, unexplained
    fault_free_steps_agree(layout, per_rank)
    if layout == "fsdp":  # seen, not attributable: two peers disagree, no majority
        hidden = next(r for r in results if r.step == 4)
        assert hidden.status == "Inconclusive" and "no_majority" in hidden.inconclusive_reasons["hidden.1.output"]
    if layout in ("tp_fsdp", "cp_fsdp", "ep_fsdp"):  # compared within a TP (CP, EP) coordinate: ranks 1, 3, 5
        hidden = next(r for r in results if r.sdc_sources == [f"hidden.{CELLS[layout][2][0]}.output"])
        assert hidden.peer_ranks == [1, 3, 5] and hidden.sdc_ranks == [1], hidden.to_json()


def test_every_gradient_operation_is_localized_under_activation_checkpointing(worlds, tmp_path):
    """HSDP 2x2 with TorchTitan's selective activation checkpointing (the debug model's
    default): each operation the kit has on a gradient, on the rank's unsharded gradient
    before the reduce-scatter, is localized to its rank through param_grad. (Recomputation
    runs a block's forward twice: a replay that hooked the gradient once per forward flipped
    the same bits twice, which undoes a bit flip.)"""
    out, artifacts = worlds("hsdp")
    per_rank = [o["second"] for o in out]
    assert all(o["clock"] == (GRADIENT_STEPS, GRADIENT_STEPS) for o in per_rank)
    lmr_cli = shutil.which("lmr", path=sysconfig.get_path("scripts"))
    folder = artifacts / "gradients"
    compare = subprocess.run([lmr_cli, "campaign", "compare", "--injections",
                              *sorted(str(p) for p in folder.glob("injections-rank-*.json")),
                              "--localization", str(folder / "localization.json"), "--format", "json"],
                             capture_output=True, text=True)
    report = json.loads(compare.stdout)
    missed = [(o["occurrence_id"], o.get("reasons")) for o in report["occurrences"] if not o["localized"]]
    assert report["totals"]["injected"] == len(w.GRADIENT_OPERATIONS) and not missed, (report["totals"], missed)
    results = [r for o in per_rank for r in replay_results(o["results"])]
    assert {s for r in results for s in r.sdc_sources} == {"hidden.0.param_grad", "hidden.1.param_grad"}
    assert compare.returncode == 0, compare.stderr


def fault_free_steps_agree(layout, per_rank):
    """The steps before the first fault agree on every rank (no false alarm from the layout
    itself), and the run checked what the layout lets it check."""
    for out in per_rank:
        results = [r for r in replay_results(out["results"]) if r.step < FIRST_FAULT]
        assert len(results) == FIRST_FAULT - 1 and all(r.status == "Agree" for r in results), [
            (r.step, r.status, r.inconclusive_reasons) for r in results if r.status != "Agree"]
    recipes = {i for out in per_rank for r in replay_results(out["results"]) for i in r.checked_recipe_ids}
    if layout != "pp":
        assert {"integrity", "optimizer.0"} <= recipes, recipes
    if layout in ("hsdp", "pp_fsdp", "tp_fsdp", "cp_fsdp", "ep_fsdp"):
        assert {"embedding", "hidden.0", "hidden.1", "output"} <= recipes, recipes


def test_resume_from_torchtitan_checkpoints_keeps_the_campaign_clock(env, tmp_path):
    first = spawn(w.resume_run, 2, preload=torchtitan_cpu.PRELOAD, args=(str(tmp_path), 6), env=env, timeout=600)
    assert sorted(os.listdir(tmp_path / "checkpoint")) == ["step-3", "step-6"]
    assert [(r["injection_id"], r["status"]) for r in first[1]["records"]] == [("early@2/f", "completed")]
    second = spawn(w.resume_run, 2, preload=torchtitan_cpu.PRELOAD, args=(str(tmp_path), 12), env=env, timeout=600)
    for out in second:
        assert out["step"] == 12 and out["clock"] == (12, 12)
        assert [r["step"] for r in out["results"]] == list(range(7, 13))  # counted from the resumed step
        assert out["loaded"]["completed_iterations"] == 6 and out["loaded"]["journal"]
    # The journal came back with the checkpoint: the early fault stays done, the late one fires at 8.
    assert [(r["injection_id"], r["status"], r["iteration"]) for r in second[1]["records"]] == [
        ("late@8/f", "completed", 8)]


def test_a_plain_torchtitan_checkpoint_still_resumes(env, tmp_path):
    """A checkpoint TorchTitan wrote without LM Resiliency has no campaign state: the clock
    then comes from TorchTitan's train state."""
    spawn(w.plain_run, 2, preload=torchtitan_cpu.PRELOAD, args=(str(tmp_path), 3), env=env, timeout=600)
    second = spawn(w.resume_run, 2, preload=torchtitan_cpu.PRELOAD, args=(str(tmp_path), 6), env=env, timeout=600)
    for out in second:
        assert out["step"] == 6 and out["clock"] == (6, 6) and out["loaded"] is None
        assert [r["step"] for r in out["results"]] == [4, 5, 6]


def test_certified_checkpoints_resume_bit_for_bit(env, tmp_path):
    first = spawn(w.certify_run, 2, preload=torchtitan_cpu.PRELOAD, args=(str(tmp_path), 10, 1), env=env, timeout=600)
    manifest = json.loads(first[0]["manifest"])
    verified = [c for c in manifest["checkpoints"] if c["state"] == "RECOVERY_VERIFIED"]
    assert verified, manifest
    newest = max(c["step"] for c in verified)
    files = set(os.listdir(next(c["location"] for c in verified if c["step"] == newest)))
    assert {".metadata", "lmr-checkpoint.json", "lmr-rank-0.pt", "lmr-rank-1.pt"} <= files, files
    # Another seed, TorchTitan's own latest checkpoint present: the trusted one wins.
    second = spawn(w.certify_run, 2, preload=torchtitan_cpu.PRELOAD, args=(str(tmp_path), 10, 2), env=env, timeout=600)
    for before, after in zip(first, second):
        assert after["resumed"] == newest and after["step"] == 10
        saved = dict(before["saved"][newest], step=newest + 1)  # Trainer.step is incremented before a step
        assert after["first"] == saved


def test_the_protect_example_resumes_from_the_trusted_checkpoint(env, tmp_path):
    """examples/protect/protect_torchtitan.py as a user calls it: a run, then a restart on the
    same folders that resumes from the newest verified checkpoint; every check agrees."""
    first, second = spawn(w.example_run, 2, preload=torchtitan_cpu.PRELOAD, args=(str(tmp_path), (6, 9)), env=env,
                          timeout=600)[0]
    assert first["resumed"] is None and first["step"] == 6 and first["verified"], first
    assert second["resumed"] == first["verified"] and second["step"] == 9, second
    assert first["statuses"] == second["statuses"] == ["Agree"]


def test_lmr_torchtitan_is_installed_and_lists_its_options():
    exe = shutil.which("lmr-torchtitan", path=sysconfig.get_path("scripts"))
    assert exe, "pip install . must install lmr-torchtitan"
    out = subprocess.run([exe, "--lmr-help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for option in ("--lmr-check-interval", "--lmr-campaign", "--lmr-certify", "--lmr-artifacts"):
        assert option in out.stdout


def test_bad_input_is_refused_with_what_is_wrong(env):
    errors = spawn(w.refusals, 1, preload=torchtitan_cpu.PRELOAD, env=env, timeout=300)[0]
    assert "--checkpoint.enable" in errors["durable"]
    assert "check_interval must be an int >= 0" in errors["interval"]
    assert "pass the Trainer alone" in errors["optimizer"]


_TORCH = tuple(int(x) for x in __import__("torch").__version__.split("+")[0].split(".")[:2])


@pytest.mark.gpu
@pytest.mark.xfail(_TORCH < (2, 13), strict=False,
                   reason="torchtitan 0.3.0 does not train on torch 2.11 (the accelerator machine's): with shims 5, "
                          "6, 8, 9, 10 and 11 it builds, then its own backward fails in torch.rms_norm (\"data is not "
                          "allocated yet\"), on one rank and without LM Resiliency too")
def test_campaign_with_cuda_tensors_on_ranks_sharing_the_gpu(env, tmp_path):
    """The accelerator machine: 4 ranks on GPU 0 over gloo (HSDP with replicas only: gloo
    has no reduce-scatter of CUDA tensors), the campaign localized; the shims the machine's
    torch still needs are printed."""
    c = w.tt_campaign((1, 2, 3), (1, 0, 1))
    per_rank = spawn(w.run, 4, preload=torchtitan_cpu.PRELOAD, timeout=900, env=env,
                     args=("ddp", STEPS, ["--lmr-check-interval", "1", "--lmr-state-integrity", "on",
                                          "--lmr-artifacts", str(tmp_path)], [], c))
    assert all(out["device"].startswith("cuda") for out in per_rank)
    print("shims applied with torch", __import__("torch").__version__, per_rank[0]["shims"])
    report = json.loads(subprocess.run(
        [shutil.which("lmr", path=sysconfig.get_path("scripts")), "campaign", "compare", "--injections",
         *sorted(str(p) for p in tmp_path.glob("injections-rank-*.json")), "--localization",
         str(tmp_path / "localization.json"), "--format", "json"], capture_output=True, text=True).stdout)
    assert report["totals"]["localized"] == 3, report
