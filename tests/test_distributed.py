"""Two CPU processes (torchrun, gloo) under DDP and FSDP2 follow the same loss curve as one process
with the same global batch (relative tolerance 1e-4); only rank 0 writes; checkpoints are
strategy-independent. FSDP2 runs under one torchrun agent, DDP under two agents that meet at one
rendezvous (as on two nodes), reading the ranks' losses every third step."""

import contextlib
import csv
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import alive, learnable_tokens
from growlm.memory.estimate import write_plan
from growlm.memory.measure import make_plan
from growlm.model import build_model, load_model
from growlm.launch import standalone_command
from growlm.runner import TrainingJob
from growlm.train import train
from growlm.train_config import TrainConfig

V, T = 128, 16
MODEL = dict(n_embd=32, n_layer=2, vocab_size=V, n_positions=T, head_dim=8, seed=0)
TRAIN = dict(tokens=8 * T * 10, batch_size=8, context=T, lr=3e-3, warmup_steps=2, eval_interval=5, eval_tokens=512,
             checkpoint_every=4, dense_log_steps=10, seed=1)
REL = 1e-4


def tokens(n=20000, seed=0):
    return learnable_tokens(V, n, seed)


def losses(ledger: Path) -> list[tuple[int, str, float]]:
    out = []
    for r in csv.DictReader(open(ledger)):
        for col in ("train_loss", "val_loss"):
            if r[col]:
                out.append((int(r["step"]), col, float(r[col])))
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist")
    np.save(d / "tok.npy", tokens())
    (d / "model.json").write_text(json.dumps(MODEL))
    (d / "train.json").write_text(json.dumps(TRAIN))
    # the reference: one process, the whole global batch at once
    spec = dict(MODEL)
    model = build_model(seed=spec.pop("seed"), **spec)
    data = np.load(d / "tok.npy")
    # from_dict, as the jobs read train.json (a settings dict without final_eval_tokens reads back as growlm before
    # the key computed: the last evaluation reads eval_tokens)
    train(model, data, data, TrainConfig.from_dict(TRAIN), ckpt_dir=d / "ref_ck", ledger_path=d / "ref.csv", log=lambda s: None)
    return d



def one_process_job(d: Path, name: str) -> Path:
    """`d/<name>_job.json`: the training job of train.json on one CPU device, its files named after `name`."""
    write_plan(make_plan({k: v for k, v in MODEL.items() if k != "seed"}, context=T, global_batch=8, n_devices=1,
                         device="cpu", memory_limit_gb=1, measure=False), d / f"{name}_plan.json")
    job = TrainingJob(TrainConfig.from_dict(json.loads((d / "train.json").read_text()), device="cpu"),
                      out_dir=d / f"{name}_model", train_file=d / "tok.npy", val_file=d / "tok.npy",
                      start={"build": MODEL}, ckpt_dir=d / f"{name}_ck", plan_file=d / f"{name}_plan.json",
                      ledger_file=d / f"{name}.csv", summary_file=d / f"{name}.json")
    (d / f"{name}_job.json").write_text(job.to_json())
    return d / f"{name}_job.json"

def run_torchrun(d: Path, name: str, strategy: str, micro: int, train_json: str = "train.json"):
    base = make_plan({k: v for k, v in MODEL.items() if k != "seed"}, context=T, global_batch=8, n_devices=2,
                       device="cpu", memory_limit_gb=1, measure=False)
    plan = dataclasses.replace(base, strategy=strategy, micro_batch_size=micro, grad_accum_steps=4 // micro)
    write_plan(plan, d / f"{name}_plan.json")
    job = TrainingJob(TrainConfig.from_dict(json.loads((d / train_json).read_text()), device="cpu"),
                      out_dir=d / f"{name}_model", train_file=d / "tok.npy", val_file=d / "tok.npy",
                      start={"build": MODEL}, ckpt_dir=d / f"{name}_ck", plan_file=d / f"{name}_plan.json",
                      ledger_file=d / f"{name}.csv", summary_file=d / f"{name}.json")
    (d / f"{name}_job.json").write_text(job.to_json())
    cmd = standalone_command(2, d / f"{name}_job.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=d)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def check_same_curve(d: Path, name: str, dense_log_steps: int = TRAIN["dense_log_steps"]):
    ref, got = losses(d / "ref.csv"), losses(d / f"{name}.csv")
    # the reference logs every step; a run with fewer dense rows must match it on those it has
    ref = [r for r in ref if r[1] == "val_loss" or r[0] <= dense_log_steps or r[0] % TRAIN["eval_interval"] == 0
           or r[0] == TRAIN["tokens"] // (TRAIN["batch_size"] * TRAIN["context"])]
    assert [(s, c) for s, c, _ in got] == [(s, c) for s, c, _ in ref]
    for (step, col, a), (_, _, b) in zip(ref, got):
        assert b == pytest.approx(a, rel=REL), (name, step, col, a, b)
    summary = json.loads((d / f"{name}.json").read_text())
    ref_rows = list(csv.DictReader(open(d / "ref.csv")))
    assert summary["world"] == 2 and summary["flops"] == int(ref_rows[-1]["flops"])  # FLOPs of the global batch


def check_rank_0_wrote(d: Path, name: str, output: str):
    """Rank 0 alone wrote: one ledger, whole checkpoints, one saved model that loads without torchrun; the
    checkpoint is strategy-independent: a single process resumes from it, bit-for-bit the state."""
    from growlm import checkpoint
    from growlm.train import make_optimizer

    assert output.count("step 10/10") == 1
    assert sorted(p.name for p in (d / f"{name}_ck").iterdir()) == ["step_00000004", "step_00000008"]
    assert not list((d / f"{name}_ck").glob(".tmp*"))
    model = load_model(d / f"{name}_model")
    assert (d / f"{name}_model" / "ledger.csv").is_file()
    spec = dict(MODEL)
    fresh = build_model(seed=99, **{k: v for k, v in spec.items() if k != "seed"})
    state = checkpoint.load_latest(d / f"{name}_ck", fresh, make_optimizer(fresh, TrainConfig(**TRAIN)),
                                   log=lambda s: None)
    assert state["step"] == 8
    assert any(p.abs().sum() > 0 for p in fresh.parameters())
    assert model.config.n_embd == MODEL["n_embd"]


def test_two_processes_match_one(setup):
    """FSDP2 (micro-batches of 4) under one torchrun agent: every step's loss is the one-process
    reference's. DDP's run is test_two_node_agents_meet_at_one_rendezvous_and_match_one_process."""
    d = setup
    proc = run_torchrun(d, "fsdp", "fsdp", 4)
    check_same_curve(d, "fsdp")
    check_rank_0_wrote(d, "fsdp", proc.stdout)


def test_launch_command():
    """torchrun on one machine goes through growlm's agent, which names itself to its workers."""
    from growlm.node_agent import torchrun_args

    cmd = standalone_command(4, "ck/job.json", python="/usr/bin/python3")
    assert cmd == ["/usr/bin/python3", "-m", "growlm.node_agent", "--standalone", "--nproc-per-node", "4", "ck/job.json"]
    assert torchrun_args(nnodes=1, nproc_per_node=4, endpoint=None, rdzv_id=None, node_index=0, job="ck/job.json") \
        == ["--standalone", "--nproc-per-node=4", "--max-restarts=0", "-m", "growlm.torchrun", "ck/job.json"]
    with pytest.raises(Exception):
        standalone_command(0, "ck/job.json")


def test_training_job_launches_torchrun_when_asked_for_several_processes(tmp_path, monkeypatch):
    """A workflow training job with several processes goes through torchrun (gloo on the CPU here)
    and leaves the same files as a one-process job: model, ledger, plan, cost."""
    from growlm.jobs.train import train_model
    from growlm.tokenizer import fit_tokenizer

    text = tmp_path / "train.txt"
    text.write_text("\n".join(["the cat sat on the mat", "see the dog run", "a red hen"] * 50))
    fit_tokenizer([text], tmp_path / "tok", vocab_size=300)
    tokens = np.random.default_rng(0).integers(0, 256, 20000).astype(np.uint16)
    np.save(tmp_path / "t.npy", tokens)
    train = TrainConfig(tokens=8 * 16 * 6, batch_size=8, context=16, lr=1e-3, warmup_steps=1, eval_interval=3,
                        eval_tokens=256, checkpoint_every=3, dense_log_steps=0, seed=1).run_settings()
    model = {"n_embd": 16, "n_layer": 1, "n_positions": 16, "head_dim": 8, "tie_word_embeddings": True}
    monkeypatch.setenv("GROWLM_NPROC", "2")
    out = tmp_path / "results" / "models" / "small" / "m1"
    train_model(train=train, model=model, init_seed=1, role="test", train_file=tmp_path / "t.npy",
                val_file=tmp_path / "t.npy", tokenizer_dir=tmp_path / "tok", out_dir=out)
    meta = json.loads((out / "growlm.json").read_text())
    assert meta["processes"] == 2 and meta["train"]["flops"] > 0
    assert json.loads((out / "plan.json").read_text())["n_devices"] == 2
    assert (out / "ledger.csv").read_text().count("\n") >= 3
    load_model(out)


def test_two_node_agents_meet_at_one_rendezvous_and_match_one_process(setup):
    """Two torchrun agents, as srun starts one on each node of a job across nodes (`growlm.node_agent`,
    `--nnodes 2`, a c10d rendezvous), here both on 127.0.0.1 without SLURM: one world of two processes under
    DDP (two micro-batches of 2 a step), which follows the one-process curve with the same global batch;
    growlm.json says where each rank ran (two node ranks), and the interface variable reaches every process.
    Rank 0 alone writes (check_rank_0_wrote). The run reads the losses every third step (sync_every 3): the
    ranks' losses are read and all-reduced three steps at a time (one collective for the pending steps and
    the stop decision); the dense rows of steps 1-2, the running average at every evaluation and the
    validation losses are those of the one-process reference."""
    from growlm.launch import free_port

    d, name = setup, "nodes"
    (d / "train_sync3.json").write_text(json.dumps({**TRAIN, "dense_log_steps": 2, "sync_every": 3}))
    base = make_plan({k: v for k, v in MODEL.items() if k != "seed"}, context=T, global_batch=8, n_devices=2,
                     device="cpu", memory_limit_gb=1, measure=False)
    write_plan(dataclasses.replace(base, strategy="ddp", micro_batch_size=2, grad_accum_steps=2), d / "nodes_plan.json")
    job = TrainingJob(TrainConfig.from_dict(json.loads((d / "train_sync3.json").read_text()), device="cpu"),
                      out_dir=d / "nodes_model", train_file=d / "tok.npy", val_file=d / "tok.npy",
                      start={"build": MODEL}, ckpt_dir=d / "nodes_ck", plan_file=d / "nodes_plan.json",
                      ledger_file=d / "nodes.csv", summary_file=d / "nodes.json")
    (d / "nodes_job.json").write_text(job.to_json())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "GLOO_SOCKET_IFNAME": "lo"}
    endpoint = f"127.0.0.1:{free_port()}"
    agents = [subprocess.Popen([sys.executable, "-m", "growlm.node_agent", "--nnodes", "2", "--nproc-per-node", "1",
                                "--endpoint", endpoint, "--rdzv-id", "test-two-nodes", "--node-index", str(i),
                                str(d / "nodes_job.json")], cwd=d, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True) for i in (1, 0)]  # the host need not start first
    outputs = [a.communicate(timeout=240)[0] for a in agents]
    assert all(a.returncode == 0 for a in agents), "\n".join(o[-3000:] for o in outputs)
    check_same_curve(d, name, dense_log_steps=2)
    assert [int(r["step"]) for r in csv.DictReader(open(d / "nodes.csv"))] == [0, 1, 2, 5, 10]
    check_rank_0_wrote(d, name, "".join(outputs))
    where = json.loads((d / "nodes_model" / "growlm.json").read_text())["where"]
    assert where["world"] == 2 and sorted(r["node_rank"] for r in where["ranks"]) == [0, 1]
    assert sorted(r["rank"] for r in where["ranks"]) == [0, 1]
    assert all(r["interfaces"] == {"GLOO_SOCKET_IFNAME": "lo"} for r in where["ranks"])


def test_a_job_across_nodes_starts_one_agent_per_node_with_srun():
    """The srun line of a two-node job (what tests/test_slurm.py runs for real): one task per node with its
    CPUs and GPUs, an agent each, the rendezvous on the first node; outside SLURM it stops at once."""
    from growlm.errors import GrowlmError
    from growlm.launch import Allocation, node_command, rendezvous_endpoint, slurm_allocation

    alloc = Allocation("42", ["n1", "n2"], ["10.0.0.1", "10.0.0.2"])
    cmd = node_command(alloc, nproc_per_node=4, cpus_per_task=16, gpus_per_node=4, job_file="ck/job.json",
                       endpoint="10.0.0.1:29400", python="py")
    assert cmd[:cmd.index("py")] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                                     "--jobid=42", "--cpus-per-task=16", "--gres=gpu:4"]
    assert cmd[cmd.index("py"):] == ["py", "-m", "growlm.node_agent", "--nnodes", "2", "--nproc-per-node", "4",
                                     "--endpoint", "10.0.0.1:29400", "--rdzv-id", "growlm-42", "--srun-task",
                                     "ck/job.json"]
    assert rendezvous_endpoint(alloc, 29400) == "10.0.0.1:29400"
    with pytest.raises(GrowlmError, match="a loopback address"):  # each node would wait in a world of its own
        rendezvous_endpoint(Allocation("42", ["n1", "n2"], ["localhost", "10.0.0.2"]), 29400)
    assert rendezvous_endpoint(Allocation("7", ["a", "b"], ["127.0.0.1", "127.0.0.1"]), 5) == "127.0.0.1:5"
    # Debian and Ubuntu map a host's own name to 127.0.1.1: on the first node its name resolves to loopback,
    # on the others to its address; the name is passed on for them to resolve
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("socket.gethostbyname", lambda host: "127.0.1.1" if host == "n1" else "10.0.0.2")
        assert rendezvous_endpoint(Allocation("42", ["n1", "n2"], ["n1", "n2"]), 29400) == "n1:29400"
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("SLURM_JOB_ID", raising=False)
        with pytest.raises(GrowlmError, match="outside a SLURM allocation"):
            slurm_allocation()


def test_a_rendezvous_port_taken_before_the_first_agent_binds_it_is_tried_again(setup, tmp_path, monkeypatch):
    """The port is picked free, then bound by the first node's agent moments later: when another process took
    it meanwhile, the agent says so and the job launches again on another port, instead of failing (and
    spending its one retry). Here one node, with an srun that runs its command as that node's task."""
    import socket

    from growlm import launch

    d = setup
    srun = tmp_path / "bin" / "srun"
    srun.parent.mkdir()
    srun.write_text('#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\nSLURM_NODEID=0 exec "$@"\n')
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{srun.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    one_process_job(d, "port")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = [taken.getsockname()[1]]
        monkeypatch.setattr(launch, "free_port", lambda host="": ports.pop() if ports else socket_port())
        said = []
        rc = launch.run_across_nodes(launch.Allocation("5", ["n1"], ["127.0.0.1"]), job_file=d / "port_job.json",
                                     work_dir=tmp_path, log=said.append, nproc_per_node=1, cpus_per_task=0,
                                     gpus_per_node=0)
    assert rc == 0, said
    assert sum("launching 1 processes on SLURM nodes n1" in s for s in said) == 2, said
    assert any("was taken on n1 when its agent bound it" in s for s in said), said
    assert (d / "port_model" / "model.safetensors").is_file()


def socket_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes_with(text: str) -> dict[int, int]:
    """{pid: parent pid} of the processes whose command line holds `text`."""
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                stat = (proc / "stat").read_text()
                found[int(proc.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
        except OSError:
            continue
    return found


KILLED_JOB = r"""
import os, sys
from growlm.gpus import claim
from growlm.jobs.train import train_model
claim(2, who="test job", log=lambda line: None)
print("GOT", os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
train_model(**__import__("json").loads(sys.argv[1]))
"""


def _start_killed_job(tmp_path: Path):
    """A job on two fake GPUs with two processes under torchrun (gloo on the CPU), in a session of its own:
    (job, env, {worker pid: agent pid}) once both workers train."""
    from growlm.tokenizer import fit_tokenizer

    text = tmp_path / "train.txt"
    text.write_text("\n".join(["the cat sat on the mat", "see the dog run", "a red hen"] * 50))
    fit_tokenizer([text], tmp_path / "tok", vocab_size=300)
    np.save(tmp_path / "t.npy", np.random.default_rng(0).integers(0, 256, 20000).astype(np.uint16))
    train = TrainConfig(tokens=8 * 16 * 100000, batch_size=8, context=16, lr=1e-3, warmup_steps=1,
                        eval_interval=1000000, eval_tokens=256, checkpoint_every=1000000, dense_log_steps=0,
                        seed=1).run_settings()
    out = tmp_path / "results" / "models" / "small" / "m1"
    kw = dict(train=train, model={"n_embd": 16, "n_layer": 1, "n_positions": 16, "head_dim": 8,
                                  "tie_word_embeddings": True},
              init_seed=1, role="test", train_file=str(tmp_path / "t.npy"), val_file=str(tmp_path / "t.npy"),
              tokenizer_dir=str(tmp_path / "tok"), out_dir=str(out), gpus=2)
    env = {**os.environ, "GROWLM_GPUS": "0,1", "GROWLM_GPU_LOCKS": str(tmp_path / "locks"), "GROWLM_GPU_SLOTS": "1",
           "GROWLM_NPROC": "2",
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(Path(__file__).parents[1] / "workflow"
                                                                                / "scripts")}
    env.pop("GROWLM_PARENT_PID", None)
    job = subprocess.Popen([sys.executable, "-c", KILLED_JOB, json.dumps(kw)], env=env, cwd=tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    workers: dict[int, int] = {}
    assert job.stdout.readline().startswith("GOT 0,1")
    deadline = time.monotonic() + 120
    while len(workers) < 2 and time.monotonic() < deadline:  # the agent has started both workers
        workers = {p: pp for p, pp in _processes_with("growlm.torchrun").items()
                   if str(tmp_path) in (cmd := Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace"))
                   and "torch.distributed.run" not in cmd and "growlm.node_agent" not in cmd}  # not their agent
        time.sleep(0.2)
    return job, env, workers


def _holds_locks(pid: int, locks: Path) -> int:
    """How many GPU lock files of `locks` process `pid` has open."""
    held = 0
    for fd in Path(f"/proc/{pid}/fd").glob("*"):
        with contextlib.suppress(OSError):
            held += os.readlink(fd).startswith(str(locks))
    return held


NEXT_JOB = "from growlm.gpus import claim\nclaim(2, who='next job')\nprint('GOT', flush=True)"


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux's /proc")
def test_kill_9_of_the_torchrun_agent_leaves_no_worker_and_no_device_to_another_job_before_they_end(tmp_path):
    """The job's torchrun agent is killed with SIGKILL mid-training. Its workers stop (they asked for SIGTERM
    at their agent's death), and no other job gets the devices before the last of them is gone."""
    job, env, workers = _start_killed_job(tmp_path)
    try:
        assert len(workers) == 2, "the workers did not start"
        time.sleep(3)  # training
        (agent,) = set(workers.values())
        os.kill(agent, signal.SIGKILL)
        other = subprocess.Popen([sys.executable, "-c", NEXT_JOB], env=env, stdout=subprocess.PIPE, text=True)
        while not (said := other.stdout.readline()).startswith("GOT"):  # until the devices were released
            assert said, "the next job ended without its devices"
        running = [w for w in workers if alive(w)]
        assert not running, f"workers {running} still ran when the next job got their devices"
        other.wait(timeout=30)
        job.wait(timeout=60)
    finally:
        for pid in [job.pid, *workers]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        job.wait()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux's /proc")
def test_kill_9_of_the_jobs_process_group_leaves_the_devices_to_its_workers_until_they_end(tmp_path):
    """The job and its torchrun agent are killed together (SIGKILL to the job's process group; torch starts the
    workers in sessions of their own, so they are not in it, and the job's lock files close with it). Every
    worker holds the job's GPU locks itself, so the next job gets the devices only once the workers have
    ended, and they do end: SIGTERM at their agent's death."""
    job, env, workers = _start_killed_job(tmp_path)
    other = None
    try:
        assert len(workers) == 2, "the workers did not start"
        (agent,) = set(workers.values())
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(_holds_locks(w, tmp_path / "locks") == 2 for w in workers):
            time.sleep(0.2)
        assert all(_holds_locks(w, tmp_path / "locks") == 2 for w in workers), "a worker holds no lock of the job's GPUs"
        os.killpg(job.pid, signal.SIGKILL)  # the job and its agent, as kill -9 of the job's process group
        job.wait()
        other = subprocess.Popen([sys.executable, "-c", NEXT_JOB], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        while not (said := other.stdout.readline()).startswith("GOT"):  # until the devices were released
            assert said, "the next job ended without its devices"
        running = [w for w in workers if alive(w)]
        assert not running, f"workers {running} still ran when the next job got their devices"
        assert not alive(agent)
        other.wait(timeout=30)
    finally:
        for pid in [*workers]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        if other:
            other.kill()
            other.wait()


HOOK = r"""
import os, socket, sys
import growlm.node_agent as agent

real, held = agent.torchrun, []


def take_the_port_first(args):  # another process binds the port after whatever the agent checked, before torch
    port = int(next(a for a in args if a.startswith("--rdzv-endpoint=")).rsplit(":", 1)[1])
    if not os.path.exists(os.environ["TAKEN_ONCE"]):
        open(os.environ["TAKEN_ONCE"], "w").close()
        s = socket.socket()
        s.bind(("127.0.0.1", port))
        s.listen()
        held.append(s)
    return real(args)


agent.torchrun = take_the_port_first
sys.exit(agent.main(sys.argv[3:]))  # after `-m growlm.node_agent`
"""


def test_a_rendezvous_port_taken_between_the_agents_check_and_torchs_bind_is_tried_again(setup, tmp_path,
                                                                                           monkeypatch):
    """Another process binds the rendezvous port in the moment between the agent's start and torch's own bind:
    torch's bind failure itself (EADDRINUSE) makes the agent say the port was taken, and the job launches again
    on another port instead of failing."""
    from growlm import launch

    d = setup
    srun = tmp_path / "bin" / "srun"
    srun.parent.mkdir()
    srun.write_text('#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\nSLURM_NODEID=0 exec "$@"\n')
    srun.chmod(0o755)
    (tmp_path / "hook.py").write_text(HOOK)
    monkeypatch.setenv("PATH", f"{srun.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("TAKEN_ONCE", str(tmp_path / "taken-once"))
    python = tmp_path / "bin" / "python-hooked"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "hook.py"} "$@"\n')
    python.chmod(0o755)
    one_process_job(d, "window")
    said = []
    rc = launch.run_across_nodes(launch.Allocation("6", ["n1"], ["127.0.0.1"]), job_file=d / "window_job.json",
                                 work_dir=tmp_path, log=said.append, nproc_per_node=1, cpus_per_task=0,
                                 gpus_per_node=0, python=str(python))
    assert (tmp_path / "taken-once").is_file(), "the hook did not run"
    assert rc == 0, said
    assert sum("launching 1 processes on SLURM nodes n1" in s for s in said) == 2, said
    assert any("was taken on n1 when its agent bound it" in s and "EADDRINUSE" in s for s in said), said
    assert (d / "window_model" / "model.safetensors").is_file()
