"""The recorded landscapes and the replay of the self-improvement protocol (no GPU)."""

import json
import math
import statistics

import pytest

from bench.landscape import Landscape, collect, load
from bench.replay import ReplayGpu, replay
from kfc.model.records import Outcome, Proposal, Stage
from kfc.factory.offline import SearchPolicy
from kfc.factory.tune import space_for
from kfc.frontend import load_kfc
from kfc.kb.store import KnowledgeBase
from kfc.model.target import parse_target

TARGET = parse_target("sm_90a")
H200 = "bench/data/h200-rows.json"


def test_a_recorded_point_answers_with_its_measurements_and_a_new_one_with_its_neighbours():
    points = load(H200)["ops"]["softmax_bf16"]["32768x16384"]
    land = Landscape(points)
    measured = next(p for p in points if len(p["times_us"]) >= 2)
    us, error, known = land.lookup(measured["config"])
    assert known and error == "" and us == statistics.median(measured["times_us"])
    probe = dict(measured["config"], threads=1024 if measured["config"]["threads"] != 1024 else 512, rows=32)
    assert json.dumps(probe, sort_keys=True) not in land.by_key
    us, _, known = land.lookup(probe)
    timed = [p for p in points if p["times_us"]]
    dist = {id(p): sum(p["config"][k] != probe[k] for k in probe) for p in timed}
    closest = min(dist.values())
    near = [statistics.median(p["times_us"]) for p in timed if dist[id(p)] == closest]
    assert not known and closest >= 1
    # the three nearest: when the closest ring holds three or more, the answer lies within it
    if len(near) >= 3:
        assert min(near) <= us <= max(near)
    assert math.isfinite(us) and min(statistics.median(p["times_us"]) for p in timed) <= us


def test_the_replay_gpu_answers_failures_and_times_like_the_evaluator():
    spec = load_kfc("kernels/softmax.kfc")
    dims = {"M": 32768, "N": 65536}
    space = space_for(spec, dims, TARGET)
    doc = load(H200)
    gpu = ReplayGpu(doc, seed=0)
    failed = next((p for p in doc["ops"]["softmax_bf16"]["32768x65536"] if not p["times_us"]), None)
    if failed is not None:
        compiled, gated = gpu.evaluate(spec, TARGET, space.pipeline(failed["config"]), [], dims).result()
        assert gated is None and compiled.stage is Stage.VERIFIED
    # a recorded point answers with one of its recorded times (the landscape was recorded before
    # rows could be staged, so its points are register rows)
    point = next(p for p in doc["ops"]["softmax_bf16"]["32768x65536"] if p["times_us"])
    compiled, gated = gpu.evaluate(spec, TARGET, space.pipeline(point["config"]), [], dims).result()
    assert gated.stage is Stage.TIMED and gated.median_us in point["times_us"] and gated.notes == "recorded"


def test_collect_reads_knowledge_bases_and_counts_a_copied_record_once(tmp_path):
    spec = load_kfc("kernels/rmsnorm.kfc")
    dims = {"M": 32768, "N": 4096}
    space = space_for(spec, dims, TARGET)
    from kfc.kb.fingerprint import op_features, op_fingerprint

    path = tmp_path / "a.sqlite"
    with KnowledgeBase(path) as kb:
        op = kb.op_id(op_fingerprint(spec.func), spec.instance_name, op_features(spec.func))
        run = kb.start_run(op, "sm_90a", dims, "search", 2, {"gpu": "NVIDIA H200", "kfc_commit": "abc"})
        for c, us in ((space.default(), 150.0), (dict(space.default(), vec=4), 160.0)):
            cid = kb.add_candidate(run, op, "sm_90a", dims, Proposal(space.pipeline(c)))
            kb.record_outcome(cid, Outcome(Stage.TIMED, median_us=us))
    copy = tmp_path / "b.sqlite"
    copy.write_bytes(path.read_bytes())
    doc = collect([str(path), str(copy)])
    points = doc["ops"]["rmsnorm_bf16"]["32768x4096"]
    assert doc["gpus"] == ["NVIDIA H200"] and doc["kfc_commits"] == ["abc"]
    assert sorted(p["times_us"] for p in points) == [[150.0], [160.0]]
    # a later knowledge base added to the landscape: its measurements join the earlier ones
    later = tmp_path / "c.sqlite"
    with KnowledgeBase(later) as kb:
        op = kb.op_id(op_fingerprint(spec.func), spec.instance_name, op_features(spec.func))
        run = kb.start_run(op, "sm_90a", dims, "search", 1, {"gpu": "NVIDIA H200", "kfc_commit": "def"})
        cid = kb.add_candidate(run, op, "sm_90a", dims, Proposal(space.pipeline(space.default())))
        kb.record_outcome(cid, Outcome(Stage.TIMED, median_us=155.0))
    merged = collect([str(later)], base=doc)
    assert merged["kfc_commits"] == ["abc", "def"]
    assert sorted(p["times_us"] for p in merged["ops"]["rmsnorm_bf16"]["32768x4096"]) == [[150.0, 155.0], [160.0]]
    assert sorted(p["times_us"] for p in points) == [[150.0], [160.0]]  # the earlier landscape is left as it was


def test_one_seed_of_the_protocol_replays(tmp_path):
    rows = replay(load(H200), 0, 4, 4, [(32768, 4096)], lambda s: SearchPolicy(seed=s))
    (row,) = rows
    assert row["seed"] == 0 and row["best_us"] > 0 and 0 <= row["answered_from_neighbours"] <= 1


def test_an_unmeasured_point_is_answered_by_its_own_geometry_and_ties_are_averaged():
    details = {"vec": 8, "rows": 0, "stream": "cs", "store": "cs", "approx": "auto", "fuse": True}
    geometry = {"threads": 512, "cluster": 2, "persistent": True}
    other_geometry = dict(geometry, cluster=4)
    near = dict(other_geometry, **dict(details, stream="nc_na", rows=1))
    points = [{"config": dict(geometry, **details), "times_us": [100.0]},
              {"config": near, "times_us": [200.0]}]
    probe = dict(other_geometry, **details)
    # one geometry choice apart from the first point, two details from the second: the second answers
    us, _, known = Landscape(points, k=1).lookup(probe)
    assert not known and us == pytest.approx(200.0)
    # two points one detail away: both answer, not the faster alone
    tied = points + [{"config": dict(probe, approx="off"), "times_us": [50.0]},
                     {"config": dict(probe, fuse=False), "times_us": [400.0]}]
    us, _, _ = Landscape(tied, k=1).lookup(probe)
    assert us == pytest.approx(math.sqrt(50.0 * 400.0))
