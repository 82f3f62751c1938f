"""kfc tune over a Ray cluster (a private one on this machine, with stand-in GPU actors that need
no GPU), and the single-host evaluator's retry of a job whose worker died. Compiles are real."""

import math
import os
import sys
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from kfc.diagnostics import KfcError
from kfc.factory.cluster import GpuActor, RayEvaluator
from kfc.factory.evaluate import Evaluator, GpuWorker, compile_candidate, distinct_fixed
from kfc.factory.gate import GateResult
from kfc.model.records import Stage
from kfc.factory.offline import SearchPolicy
from kfc.factory.problem import gate_cases
from kfc.factory.tune import space_for, tune
from kfc.frontend import load_kfc
from kfc.kb.store import KnowledgeBase
from kfc.model.target import parse_target

pytestmark = pytest.mark.xdist_group("cluster")  # on one pytest-xdist worker: it starts one Ray cluster

TARGET = parse_target("sm_90a")
DIMS = {"M": 32768, "N": 4096}
BUDGET, BATCH, SEED = 7, 4, 5
STAND_IN = {"num_gpus": 0, "num_cpus": 0}  # the stand-in actors hold nothing: the cluster's CPUs compile


def fake_gate(spec, dims, pipeline) -> GateResult:
    """A deterministic time from the candidate's tile options (as test_tune's FakeGpu)."""
    from kfc.passes import ROW_PIPELINE, parse_pipeline

    space = space_for(spec, dims, TARGET)
    c = space.config_of(pipeline)
    if pipeline == str(parse_pipeline(ROW_PIPELINE)):
        c = space.default()
    if c is None:
        us = 500.0
    else:
        us = 100.0 * (1 + 0.15 * abs(math.log2(c["threads"] / 256)) + 0.2 * abs(math.log2(c["cluster"]))
                      + 0.1 * abs(math.log2(8 / c["vec"])) + 0.05 * (c["stream"] != "cs") + 0.05 * c["persistent"])
    return GateResult(Stage.TIMED, median_us=us, spread_us=1.0, times_us=(us,))


class StandInGpuActor(GpuActor):
    """The production actor's plumbing, the gate replaced by fake_gate. Its JIT cache is its
    own, as on another machine: a candidate is gated only if its kernels came with the job."""

    def __init__(self, timeout_s):
        super().__init__(timeout_s)
        shared = Path(os.environ["KFC_CACHE_DIR"])
        os.environ["KFC_CACHE_DIR"] = tempfile.mkdtemp(prefix="actor-cache-", dir=shared.parent)
        self.jobs = 0

    def gate(self, job):
        from kfc.runtime import cache
        from kfc.runtime.kernel import kernel_cache_key

        self.jobs += 1
        time.sleep(0.2)  # a gate takes a while: the jobs spread over the actors
        spec = load_kfc(job["kfc"], job["dtypes"])
        for dims in distinct_fixed(spec, [c["dims"] for c in job["cases"]]):
            if cache.lookup(kernel_cache_key(spec, parse_target(job["target"]), job["pipeline"], dims)) is None:
                return GateResult(Stage.COMPILED, "the compiled kernel did not reach the actor", "worker")
        return fake_gate(spec, job["timed"], job["pipeline"])

    def jobs_done(self):
        return self.jobs


def dies_once(marker: Path, on_job: int):
    """A stand-in actor that kills its own process on its `on_job`-th job, once in the whole
    cluster (the first to create `marker`)."""

    class DiesOnce(StandInGpuActor):
        def gate(self, job):
            if self.jobs + 1 == on_job:
                try:
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
                except FileExistsError:
                    pass
                else:
                    os._exit(1)
            return super().gate(job)

    return DiesOnce


class SerialFake:
    """One candidate at a time in this process: the real compile, then fake_gate."""

    n_gpus = 1

    def evaluate(self, spec, target, pipeline, cases, timed):
        compiled = compile_candidate(spec, target, pipeline, distinct_fixed(spec, [c.dims for c in cases]))
        f = Future()
        f.set_result((compiled, fake_gate(spec, timed, pipeline) if compiled.stage is Stage.COMPILED else None))
        return f


@pytest.fixture(scope="module")
def kfc_cache(tmp_path_factory):
    """One JIT cache for the module, set before the cluster starts so its workers share it."""
    old = os.environ.get("KFC_CACHE_DIR")
    os.environ["KFC_CACHE_DIR"] = str(tmp_path_factory.mktemp("kfc-cache"))
    yield
    if old is None:
        del os.environ["KFC_CACHE_DIR"]
    else:
        os.environ["KFC_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def ray_cluster(kfc_cache):
    ray = pytest.importorskip("ray")
    from kfc.factory.cluster import connect

    # the stand-ins travel by value: the cluster's workers cannot import this test module
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    assert connect(local_cpus=4)
    yield ray
    ray.shutdown()


def records(kb, run_id):
    return [(t.proposal.pipeline, t.outcome.stage, t.outcome.median_us, t.outcome.registers)
            for t in kb.trials(run_id=run_id)]


def serial_records(path):
    spec = load_kfc("kernels/rmsnorm.kfc")
    with KnowledgeBase(path) as kb:
        r = tune(spec, TARGET, DIMS, BUDGET, SearchPolicy(seed=SEED), kb, SerialFake(), batch=BATCH)
        return records(kb, r.run_id)


@pytest.mark.slow
def test_a_tune_over_several_actors_records_what_a_serial_one_does(ray_cluster, tmp_path):
    spec = load_kfc("kernels/rmsnorm.kfc")
    ev = RayEvaluator(actors=3, actor_class=StandInGpuActor, actor_options=STAND_IN)
    try:
        start = time.monotonic()
        with KnowledgeBase(tmp_path / "kb.sqlite") as kb:
            r = tune(spec, TARGET, DIMS, BUDGET, SearchPolicy(seed=SEED), kb, ev, batch=BATCH)
            wall = time.monotonic() - start
            spread = records(kb, r.run_id)
            assert kb.pending(r.run_id) == [] and kb.runs()[-1]["status"] == "finished"
        per_actor = ray_cluster.get([a.jobs_done.remote() for a in ev._actors])
    finally:
        ev.close()
    assert r.candidates == BUDGET and len(spread) == BUDGET + 1
    assert sum(s is Stage.TIMED for _, s, _, _ in spread) >= BUDGET // 2  # gated on the actors, not failed
    assert spread == serial_records(tmp_path / "serial.sqlite")
    assert sum(per_actor) == BUDGET + 1 and sum(n > 0 for n in per_actor) >= 2, per_actor
    assert ev.actors_replaced == 0
    assert ev.throughput.evaluated == BUDGET + 1
    assert ev.candidates_per_minute >= (BUDGET + 1) * 60 / wall


def test_an_actor_killed_mid_run_loses_nothing(ray_cluster, tmp_path):
    spec = load_kfc("kernels/rmsnorm.kfc")
    marker = tmp_path / "died"
    ev = RayEvaluator(actors=2, actor_class=dies_once(marker, 2), actor_options=STAND_IN)
    try:
        with KnowledgeBase(tmp_path / "kb.sqlite") as kb:
            r = tune(spec, TARGET, DIMS, BUDGET, SearchPolicy(seed=SEED), kb, ev, batch=BATCH)
            killed = records(kb, r.run_id)
            assert kb.pending(r.run_id) == [] and kb.runs()[-1]["status"] == "finished"
    finally:
        ev.close()
    assert marker.exists() and ev.actors_replaced == 1  # an actor died holding a candidate
    assert r.candidates == BUDGET and not r.interrupted
    # the candidate it held was gated again on another actor: every record as in a serial run
    assert killed == serial_records(tmp_path / "serial.sqlite")


def test_kfc_tune_ray_runs_on_the_cluster_and_reports_throughput(ray_cluster, tmp_path, monkeypatch, capsys):
    import json

    from kfc.cli import main
    from kfc.factory import cluster

    seen = []

    class OnTheTestCluster(RayEvaluator):
        def __init__(self, address, **kwargs):
            seen.append(address)
            super().__init__(address, actors=2, actor_class=StandInGpuActor, actor_options=STAND_IN, **kwargs)

    monkeypatch.setattr(cluster, "RayEvaluator", OnTheTestCluster)
    out = tmp_path / "out"
    assert main(["tune", "kernels/rmsnorm.kfc", "--shape", "M=32768,N=4096", "--budget", "3", "--ray", "auto",
                 "--seed", str(SEED), "--kb", str(tmp_path / "kb.sqlite"), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert seen == ["auto"]
    assert "3 candidates; best" in printed and "candidates per minute on 2 GPU(s)" in printed
    (folder,) = out.iterdir()
    assert json.loads((folder / "tune.json").read_text())["candidates"] == 3


def test_ray_and_gpus_together_is_an_error(capsys):
    from kfc.cli import main

    assert main(["tune", "kernels/rmsnorm.kfc", "--ray", "auto", "--gpus", "0"]) == 2
    err = capsys.readouterr().err
    assert "give either --ray or --gpus, not both" in err and "Traceback" not in err


def test_without_ray_the_error_says_what_to_install(monkeypatch, tmp_path, capsys):
    from kfc.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails, as where it is not installed
    with pytest.raises(KfcError) as e:
        RayEvaluator("auto")
    assert "pip install 'kfc[cluster]'" in e.value.message
    assert main(["tune", "kernels/rmsnorm.kfc", "--ray", "auto", "--kb", str(tmp_path / "kb.sqlite")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'kfc[cluster]'" in err and "Traceback" not in err
    assert not (tmp_path / "kb.sqlite").exists()  # it stopped before opening anything


# --- one host: a worker that dies holding a job gets the job again, once ----------------------

DIES = "import os, signal, sys; sys.stdin.readline(); os.kill(os.getpid(), signal.SIGKILL)"
EXITS_7 = "import sys; sys.stdin.readline(); sys.exit(7)"
HANGS = "import sys, time; sys.stdin.readline(); time.sleep(60)"
ANSWERS = ("import sys, json\n"
           "for line in sys.stdin:\n"
           "    job = json.loads(line)\n"
           "    print(json.dumps({'id': job['id'], 'stage': 'timed', 'median_us': 12.5, 'error': '',"
           " 'defence': '', 'notes': ''}), flush=True)\n")


def scripted(*scripts):
    """A GpuWorker factory whose n-th process runs scripts[n] (the last one from then on)."""
    made = []

    class Scripted(GpuWorker):
        starts = 0

        def command(self):
            self.starts += 1
            return [sys.executable, "-c", scripts[min(self.starts, len(scripts)) - 1]]

    def factory(gpu, timeout_s):
        made.append(Scripted(gpu, timeout_s))
        return made[-1]

    return factory, made


def evaluate_once(factory, kfc_cache, timeout_s=30.0):
    from kfc.compile import row_dims
    from kfc.passes import ROW_PIPELINE

    spec = load_kfc("kernels/rmsnorm.kfc")
    ev = Evaluator(["0"], compile_workers=1, timeout_s=timeout_s, worker=factory)
    try:
        compiled, gated = ev.evaluate(spec, TARGET, ROW_PIPELINE, gate_cases(spec, DIMS, row_dims(spec.func)),
                                      DIMS).result()
    finally:
        ev.close()
    assert compiled.stage is Stage.COMPILED
    return gated, ev


def test_a_job_whose_worker_was_killed_is_answered_by_a_fresh_worker(kfc_cache):
    factory, made = scripted(DIES, ANSWERS)
    gated, ev = evaluate_once(factory, kfc_cache)
    assert gated.stage is Stage.TIMED and gated.median_us == 12.5
    assert made[0].starts == 2
    assert ev.throughput.evaluated == 1 and ev.candidates_per_minute > 0


def test_a_job_that_kills_its_worker_twice_is_a_crash(kfc_cache):
    factory, made = scripted(EXITS_7)
    gated, _ = evaluate_once(factory, kfc_cache)
    assert gated.stage is Stage.COMPILED and gated.defence == "worker"
    assert gated.error == "crashed: the GPU worker exited with status 7 (2 tries, each on a fresh worker); restarted"
    assert made[0].starts == 2  # tried twice, not more


def test_a_hung_job_is_not_retried(kfc_cache):
    factory, made = scripted(HANGS, ANSWERS)
    gated, _ = evaluate_once(factory, kfc_cache, timeout_s=1.0)
    assert gated.stage is Stage.COMPILED and "hung" in gated.error
    assert made[0].starts == 1  # it waited out the limit once; the next candidate gets a fresh worker


class CrashContainedActor(GpuActor):
    """The production actor, its worker process a script that dies on its first job (as under a
    crashing kernel) and answers from then on."""

    def __init__(self, timeout_s):
        super().__init__(timeout_s)
        factory, _ = scripted(DIES, ANSWERS)
        self.worker = factory(self.worker.gpu, timeout_s)


def test_on_the_cluster_a_worker_crash_kills_its_process_not_the_actor(ray_cluster):
    from kfc.compile import row_dims
    from kfc.passes import ROW_PIPELINE

    spec = load_kfc("kernels/rmsnorm.kfc")
    ev = RayEvaluator(actors=1, actor_class=CrashContainedActor, actor_options=STAND_IN)
    try:
        compiled, gated = ev.evaluate(spec, TARGET, ROW_PIPELINE, gate_cases(spec, DIMS, row_dims(spec.func)),
                                      DIMS).result(timeout=120)
    finally:
        ev.close()
    assert compiled.stage is Stage.COMPILED
    assert gated.stage is Stage.TIMED and gated.median_us == 12.5  # retried on a fresh process in the actor
    assert ev.actors_replaced == 0


def test_an_address_where_nothing_listens_is_one_message():
    import socket

    from kfc.factory.cluster import _check_reachable

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(KfcError, match=f"nothing answers at the Ray address 127.0.0.1:{port}") as info:
        _check_reachable(f"127.0.0.1:{port}", timeout_s=2.0)
    assert "ray start --head" in info.value.hint
    with pytest.raises(KfcError, match="bad Ray address"):
        _check_reachable("127.0.0.1:port")
    _check_reachable("auto")  # found by Ray on the node itself
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        _check_reachable(f"ray://127.0.0.1:{listening.getsockname()[1]}")
