"""Exact resume: a run killed with SIGKILL at any step and resumed from its last checkpoint ends bit-identical
(``torch.equal`` on every tensor of the final weights) to an uninterrupted run; checkpoints are written atomically;
a DDP rank that raises ends the whole job.

The runs are real ``python -m namc fit`` subprocesses, as a user runs them: under namc's supervisor, which runs the
job in a session of its own. A callback of this module (``KillAt``, named in the run's config) SIGKILLs the job's
process group (ranks and DataLoader workers) in the middle of the training step after the checkpoint of step
``$NAMC_TEST_KILL_AT`` is on disk; each segment of a chain resumes with ``--ckpt_path last.ckpt`` and is killed
further on. After every run, no process of the job may be left.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import re
import resource
import signal
import subprocess
import sys
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from _jobprocs import kill_processes, processes_with_env

from namc.data.corpus import pack_corpus
from namc.data.synthetic import generate_benchmark, generate_corpus
from namc.lit.callbacks import AtomicCheckpointIO
from namc.lit.datamodules import BenchmarkDataModule, CorpusDataModule

warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)

TESTS = Path(__file__).resolve().parent
KILL_ENV = "NAMC_TEST_KILL_AT"  # optimizer step after whose checkpoint KillAt kills the job
FAIL_ENV = "NAMC_TEST_FAIL_AT"  # "rank:step": FailAt raises there
FSIZE_ENV = "NAMC_TEST_FSIZE_AT"  # "step:bytes": LimitFileSize kills the checkpoint write of that step
JOB_ENV = "NAMC_TEST_JOB"  # a token every process of one run inherits: how the test finds them
TIMEOUT = 240  # seconds for one run: a hang fails the test instead of blocking the suite

# Every process of a job imports this module (its callbacks are named in the run's config) before it starts
# training, and DataLoader workers fork after that: a SIGUSR1 to the job (``_dump_job_stacks``, on a timeout)
# makes each print where its threads wait, so a hang fails with a diagnosis rather than a bare timeout.
faulthandler.register(signal.SIGUSR1, all_threads=True)


# ------------------------------------------------------------------------------------------------ callbacks


class KillAt(pl.Callback):
    """SIGKILLs the whole job during the optimizer step that follows step ``$NAMC_TEST_KILL_AT`` (whose checkpoint
    is on disk by then): the gradients are computed, the weights not yet updated, the workers are prefetching."""

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        at = os.environ.get(KILL_ENV)
        if at is not None and trainer.global_step == int(at):
            os.killpg(os.getpgid(0), signal.SIGKILL)


class FailAt(pl.Callback):
    """Raises on rank ``r`` at the start of the batch after step ``s`` (``$NAMC_TEST_FAIL_AT = "r:s"``)."""

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, idx: int) -> None:
        spec = os.environ.get(FAIL_ENV)
        if spec:
            rank, step = (int(v) for v in spec.split(":"))
            if trainer.global_rank == rank and trainer.global_step == step:
                raise RuntimeError(f"injected fault on rank {rank} after step {step}")


class LimitFileSize(pl.Callback):
    """When step ``s`` ends, before its checkpoint is written (checkpoint callbacks run last), no file may grow past
    ``b`` bytes any more (``$NAMC_TEST_FSIZE_AT = "s:b"``) and the kernel's SIGXFSZ, which Python ignores by
    default, kills the process: the save of step ``s`` dies part way through its write, a real kill at a known
    byte."""

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        spec = os.environ.get(FSIZE_ENV)
        if spec:
            step, size = (int(v) for v in spec.split(":"))
            if trainer.global_step == step:
                signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
                resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


# ------------------------------------------------------------------------------------------------ data, configs


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tar shards of 40 shapes-world pairs (3 with a truncated image: skipped, so a reader's units and samples
    differ and short shares restart) and a 36-pair benchmark, stored at 32 px (pre-training reads them at 64)."""
    root = tmp_path_factory.mktemp("resume-data")
    generate_corpus(root / "raw", 40, image_size=32, seed=0, noise_rate=0.2)
    lines = (root / "raw" / "manifest.jsonl").read_text().splitlines()
    for i in (3, 17, 18):
        image = root / "raw" / json.loads(lines[i])["image2"]
        image.write_bytes(image.read_bytes()[:60])
    pack_corpus(root / "raw" / "manifest.jsonl", root / "shards", shard_size=5, verify_images=False, progress=False)
    generate_benchmark(root / "bench", 36, image_size=32, seed=0, n_captions=2)
    return {"shards": root / "shards", "bench": root / "bench"}


def pretrain_config(data: dict[str, Path], workers: int = 2) -> dict[str, Any]:
    """namc_tiny (dim 32, dropout on) on the shards; 2 workers per rank, shuffle buffer, image swapping."""
    return {
        "model": {
            "class_path": "namc.lit.PretrainModule",
            "init_args": {
                "model": "namc_tiny",
                "overrides": {"dim": 32, "heads": 2, "dropout": 0.1},
                "warmup_steps": 1,
            },
        },
        "data": {
            "class_path": "namc.lit.datamodules.CorpusDataModule",
            "init_args": {
                "train": str(data["shards"]),
                "batch_size": 3,
                "num_workers": workers,
                "shuffle_buffer": 4,
                "swap_prob": 0.5,
            },
        },
    }


def finetune_config(data: dict[str, Path], workers: int = 2) -> dict[str, Any]:
    """namc_tiny from scratch (32 px, dropout on) on the benchmark; 2 workers per rank, no validation."""
    return {
        "model": {
            "class_path": "namc.lit.FinetuneModule",
            "init_args": {
                "model": "namc_tiny",
                "overrides": {"dim": 32, "heads": 2, "dropout": 0.1, "image_size": 32},
                "warmup_steps": 1,
            },
        },
        "data": {
            "class_path": "namc.lit.datamodules.BenchmarkDataModule",
            "init_args": {
                "name": "clevr_change",
                "root": str(data["bench"]),
                "batch_size": 3,
                "num_workers": workers,
                "include_distractors": False,
            },
        },
    }


def write_config(
    run_dir: Path, stage: dict[str, Any], devices: int = 1, max_epochs: int = 2, atomic: bool = True
) -> Path:
    """A ``namc fit`` config: checkpoint after every step (``last.ckpt``), the test callbacks, CPU, no logger."""
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": devices,
        "strategy": "ddp" if devices > 1 else "auto",
        "max_epochs": max_epochs,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
        "limit_val_batches": 0,
        "default_root_dir": str(run_dir),
        "callbacks": [
            {
                "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                "init_args": {
                    "dirpath": str(run_dir / "ckpt"),
                    "every_n_train_steps": 1,
                    "save_top_k": 0,
                    "save_last": True,
                },
            },
            {"class_path": "test_resume.KillAt"},
            {"class_path": "test_resume.FailAt"},
            {"class_path": "test_resume.LimitFileSize"},
        ],
    }
    if atomic:
        trainer["plugins"] = [{"class_path": "namc.lit.callbacks.AtomicCheckpointIO"}]
    path = run_dir / "config.json"
    path.write_text(json.dumps({"seed_everything": 0, "trainer": trainer, **stage}, indent=1))
    return path


# ------------------------------------------------------------------------------------------------ runs


@dataclass
class Run:
    returncode: int
    output: str
    survivors: list[str]  # processes of the job still alive when ``namc fit`` returned (killed since)


def run_fit(
    config: Path, ckpt_path: str | None = None, env: dict[str, str] | None = None, timeout: float = TIMEOUT
) -> Run:
    """``python -m namc fit --config config [--ckpt_path ...]`` in its own session, as a user runs it (under
    namc's supervisor, which runs the job in a session of its own); every process of the job (found by a token in
    its environment, which ranks, workers, the fork server and the resource tracker all inherit) that is still alive
    when the command has returned is reported and killed."""
    cmd = [sys.executable, "-m", "namc", "fit", "--config", str(config)]
    if ckpt_path is not None:
        cmd += ["--ckpt_path", ckpt_path]
    path = os.pathsep.join(p for p in (os.environ.get("NAMC_TEST_PYTHONPATH"), str(TESTS)) if p)
    token = uuid.uuid4().hex
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, JOB_ENV: token, **(env or {})}
    full_env.pop("NAMC_SUPERVISED", None)
    proc = subprocess.Popen(
        cmd,
        cwd=config.parent,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stacks = _dump_job_stacks(proc.pid, token)
        _kill_group(proc.pid)
        kill_processes(processes_with_env(JOB_ENV, token))
        out, _ = proc.communicate()
        log = config.parent / f"hang-{time.strftime('%H%M%S')}.log"
        log.write_text(out)
        raise AssertionError(
            f"namc fit did not end within {timeout} s; processes of the job: {stacks}; whole output in {log}:\n"
            f"{out[-12000:]}"
        ) from None
    survivors = processes_with_env(JOB_ENV, token)
    kill_processes(survivors)
    _kill_group(proc.pid)
    return Run(proc.returncode, out, survivors)


def _dump_job_stacks(pgid: int, token: str) -> list[str]:
    """SIGUSR1 to the command, which passes it on to its job: every process of the job prints the Python stack of
    each of its threads to the job's output (the handler registered at the top of this module); returns the job's
    processes, listed first."""
    members = processes_with_env(JOB_ENV, token)
    try:
        os.killpg(pgid, signal.SIGUSR1)
    except ProcessLookupError:
        return members
    time.sleep(3)  # the dumps reach the pipe
    return members


def _kill_group(pgid: int) -> bool:
    """SIGKILL what is left of a process group; whether anything was left."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def load_ckpt(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


def tensor_diffs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """Names of the tensors that are not ``torch.equal`` (both sides hold the same names)."""
    assert a.keys() == b.keys()
    return [k for k in a if not torch.equal(a[k], b[k])]


def uninterrupted(run_dir: Path, stage: dict[str, Any], devices: int = 1) -> dict[str, Any]:
    res = run_fit(write_config(run_dir, stage, devices))
    assert res.returncode == 0, res.output[-4000:]
    assert not res.survivors, res.survivors
    return load_ckpt(run_dir / "ckpt" / "last.ckpt")


def killed_chain(run_dir: Path, stage: dict[str, Any], kills: list[int], devices: int = 1) -> dict[str, Any]:
    """Run, SIGKILL after the checkpoint of each step of ``kills`` in turn (resuming from ``last.ckpt`` each
    time), then run to the end; returns the final checkpoint."""
    config = write_config(run_dir, stage, devices)
    last = run_dir / "ckpt" / "last.ckpt"
    for i, step in enumerate(kills):
        res = run_fit(config, str(last) if i else None, env={KILL_ENV: str(step)})
        assert res.returncode == -signal.SIGKILL, f"expected a SIGKILL at step {step}:\n{res.output[-4000:]}"
        assert not res.survivors, res.survivors
        assert load_ckpt(last)["global_step"] == step
    res = run_fit(config, str(last), env={})
    assert res.returncode == 0, res.output[-4000:]
    assert "dataloader is not resumable" not in res.output
    assert not res.survivors, res.survivors
    return load_ckpt(last)


def assert_bit_identical(resumed: dict[str, Any], full: dict[str, Any]) -> None:
    assert resumed["global_step"] == full["global_step"]
    diffs = tensor_diffs(resumed["state_dict"], full["state_dict"])
    assert not diffs, f"{len(diffs)} of {len(full['state_dict'])} tensors differ, e.g. {diffs[:5]}"
    for a, b in zip(resumed["optimizer_states"][0]["state"].values(), full["optimizer_states"][0]["state"].values()):
        assert torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])


# ------------------------------------------------------------------------------------------------ tests


def _corpus_dm(data: dict[str, Path], workers: int = 2) -> CorpusDataModule:
    return CorpusDataModule(
        str(data["shards"]),
        batch_size=3,
        num_workers=workers,
        image_size=32,
        max_text_len=48,
        max_caption_len=64,
        shuffle_buffer=4,
        swap_prob=0.5,
    )


def _bench_dm(data: dict[str, Path], workers: int = 2) -> BenchmarkDataModule:
    return BenchmarkDataModule(
        "clevr_change", str(data["bench"]), batch_size=3, num_workers=workers, image_size=32, include_distractors=False
    )


def _same_batches(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Every batch equal: the same keys, equal lists, ``torch.equal`` tensors."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.keys() != y.keys():
            return False
        for key in x:
            u, v = x[key], y[key]
            same = torch.equal(u, v) if isinstance(u, torch.Tensor) else u == v
            if not same:
                return False
    return True


@pytest.mark.slow  # every resume point of two epochs, with workers
@pytest.mark.parametrize("kind", ["corpus", "benchmark"])
def test_loader_resumes_after_every_batch(data: dict[str, Path], kind: str) -> None:
    """Stopped after any batch k of an epoch, a fresh loader given the saved state yields exactly the batches the
    uninterrupted loader yields after k (2 workers; the corpus with bad samples, a shuffle buffer and swapping)."""
    make = _corpus_dm if kind == "corpus" else _bench_dm
    for epoch in (0, 1):
        dm = make(data)
        loader = dm.train_dataloader()
        dm.set_epoch(epoch)
        full = list(loader)
        n = len(full)
        assert n == len(loader) > 4
        # every k in the corpus's first epoch; elsewhere the start, both ends and a worker's second turn
        for k in range(n + 1) if (kind, epoch) == ("corpus", 0) else (0, 1, 3, n - 1, n):
            dm = make(data)
            loader = dm.train_dataloader()
            dm.set_epoch(epoch)
            it = iter(loader)
            head = [next(it) for _ in range(k)]
            state = loader.state_dict()
            del it
            assert state["ranks"][0]["batches"] == k and (k == 0 or state["ranks"][0]["epoch"] == epoch)
            dm = make(data)
            resumed = dm.train_dataloader()
            dm.set_epoch(epoch)
            resumed.load_state_dict(state)
            tail = list(resumed)
            assert len(tail) == n - k and _same_batches(head + tail, full), (kind, epoch, k)
            assert resumed.batches == n


@pytest.mark.parametrize("kind", ["corpus", "benchmark"])
def test_loader_resumes_mid_epoch(data: dict[str, Path], kind: str) -> None:
    """The test above at two points of the first epoch: after one batch, and after half of them."""
    make = _corpus_dm if kind == "corpus" else _bench_dm
    dm = make(data)
    loader = dm.train_dataloader()
    dm.set_epoch(0)
    full = list(loader)
    n = len(full)
    for k in (1, n // 2):
        dm = make(data)
        loader = dm.train_dataloader()
        dm.set_epoch(0)
        it = iter(loader)
        head = [next(it) for _ in range(k)]
        state = loader.state_dict()
        del it
        assert state["ranks"][0]["batches"] == k and state["ranks"][0]["epoch"] == 0
        dm = make(data)
        resumed = dm.train_dataloader()
        dm.set_epoch(0)
        resumed.load_state_dict(state)
        tail = list(resumed)
        assert len(tail) == n - k and _same_batches(head + tail, full), (kind, k)


def test_loader_state_of_a_finished_epoch_or_another_setup_starts_the_epoch(data: dict[str, Path], caplog) -> None:
    dm = _corpus_dm(data)
    loader = dm.train_dataloader()
    full = list(loader)
    state = loader.state_dict()  # epoch 0, every batch consumed

    dm = _corpus_dm(data)
    nxt = dm.train_dataloader()
    dm.set_epoch(1)  # Lightning moved on to epoch 1: the saved position is of an epoch that is over
    nxt.load_state_dict(state)
    assert len(list(nxt)) == len(full)

    other = _corpus_dm(data, workers=1)
    other_loader = other.train_dataloader()
    with caplog.at_level(logging.WARNING, logger="namc.data.views"):
        other_loader.load_state_dict(state)
    assert "starts again" in caplog.text
    assert len(list(other_loader)) == len(other_loader)

    with pytest.raises(ValueError, match="malformed"):
        other_loader.load_state_dict({"format": 1})


# ------------------------------------------------------------------------------------------------ SIGKILL + resume

STAGES = {"pretrain": pretrain_config, "finetune": finetune_config}
# one process: 12 pre-training / 10 fine-tuning steps per epoch; DDP (2 ranks, 1 worker each): 6 / 5. The kill
# points fall inside epochs: mid epoch 0, in the first step after the checkpoint of epoch 0's last batch (Lightning's
# trickiest restart), and mid epoch 1 from a run that was itself resumed twice
KILLS = {
    ("pretrain", 1): [4, 12, 19],
    ("finetune", 1): [3, 10, 13],
    ("pretrain", 2): [2, 6, 9],
    ("finetune", 2): [2, 5, 7],
}


@pytest.fixture(scope="module")
def reference(data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The final checkpoint of an uninterrupted run, per (stage, devices), run once per module."""
    cache: dict[tuple[str, int], dict[str, Any]] = {}

    def get(stage: str, devices: int) -> dict[str, Any]:
        if (stage, devices) not in cache:
            run_dir = tmp_path_factory.mktemp(f"full-{stage}-{devices}")
            cache[stage, devices] = uninterrupted(run_dir, _stage(data, stage, devices), devices)
        return cache[stage, devices]

    return get


def _stage(data: dict[str, Path], stage: str, devices: int) -> dict[str, Any]:
    return STAGES[stage](data, workers=2 if devices == 1 else 1)


@pytest.mark.slow  # namc fit processes
@pytest.mark.parametrize("stage", ["pretrain", "finetune"])
def test_sigkill_mid_epoch_then_resume_is_bit_identical(data, reference, tmp_path: Path, stage: str) -> None:
    """One process, 2 DataLoader workers: killed three times, resumed three times, every final tensor equal."""
    full = reference(stage, 1)
    resumed = killed_chain(tmp_path, _stage(data, stage, 1), KILLS[stage, 1])
    assert_bit_identical(resumed, full)


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["pretrain", "finetune"])
def test_sigkill_mid_epoch_then_resume_is_bit_identical_under_ddp(data, reference, tmp_path: Path, stage: str) -> None:
    """Two CPU processes (gloo, Lightning's ddp re-running ``namc fit``): every rank's position comes back."""
    full = reference(stage, 2)
    resumed = killed_chain(tmp_path, _stage(data, stage, 2), KILLS[stage, 2], devices=2)
    assert_bit_identical(resumed, full)


# ------------------------------------------------------------------------------------------------ atomic checkpoints


@pytest.mark.slow  # namc fit processes
def test_a_kill_during_a_checkpoint_write_leaves_last_usable(data, reference, tmp_path: Path) -> None:
    """The save of step 5 dies 3 MB into its 7 MB write (SIGXFSZ): ``last.ckpt`` is still step 4's, whole; the
    partial file is one that ``--ckpt_path last`` does not pick, the resumed run removes it and ends bit-identical."""
    config = write_config(tmp_path, _stage(data, "pretrain", 1))
    ckpt = tmp_path / "ckpt"
    res = run_fit(config, env={FSIZE_ENV: "5:3000000"})
    assert res.returncode == -signal.SIGXFSZ, res.output[-4000:]
    partial = [p for p in ckpt.iterdir() if p.name != "last.ckpt"]
    assert len(partial) == 1 and re.fullmatch(r"\.last\.ckpt\.\d+\.partial", partial[0].name), partial
    assert partial[0].stat().st_size == 3_000_000
    assert load_ckpt(ckpt / "last.ckpt")["global_step"] == 4

    res = run_fit(config, "last")
    assert res.returncode == 0, res.output[-4000:]
    assert sorted(p.name for p in ckpt.iterdir()) == ["last.ckpt"]
    assert_bit_identical(load_ckpt(ckpt / "last.ckpt"), reference("pretrain", 1))


def test_atomic_checkpoint_io_keeps_the_previous_file_when_a_save_fails(tmp_path: Path) -> None:
    io = AtomicCheckpointIO()
    target = tmp_path / "sub" / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.arange(4.0)}, target)

    class Unpicklable:
        def __reduce__(self) -> Any:
            raise RuntimeError("cannot pickle this")

    with pytest.raises(RuntimeError, match="cannot pickle"):
        io.save_checkpoint({"step": 2, "w": torch.zeros(10**6), "x": Unpicklable()}, target)
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.ckpt"]  # no partial file left behind
    kept = io.load_checkpoint(target, weights_only=True)
    assert kept["step"] == 1 and torch.equal(kept["w"], torch.arange(4.0))
    (target.parent / ".last.ckpt.99999.partial").write_bytes(b"\0" * 10)  # a killed save's leftover
    io.save_checkpoint({"step": 3}, target)
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.ckpt"]
    assert io.load_checkpoint(target, weights_only=True) == {"step": 3}


# ------------------------------------------------------------------------------------------------ DDP faults


@pytest.mark.slow
def test_a_failing_rank_ends_the_ddp_job_and_the_resume_is_exact(data, reference, tmp_path: Path) -> None:
    """Rank 1 raises after step 3 (mid epoch 0): the whole job ends (no rank or worker left, well inside the
    test's bound, not gloo's 30-minute timeout) with rank 1's error in its output; resuming gives the
    uninterrupted run's weights."""
    stage = _stage(data, "pretrain", 2)
    config = write_config(tmp_path, stage, devices=2)
    start = time.monotonic()
    res = run_fit(config, env={FAIL_ENV: "1:3"}, timeout=120)
    assert time.monotonic() - start < 120
    assert res.returncode != 0 and not res.survivors, res.survivors
    assert "[rank1]: RuntimeError: injected fault on rank 1 after step 3" in res.output
    assert load_ckpt(tmp_path / "ckpt" / "last.ckpt")["global_step"] == 3

    res = run_fit(config, str(tmp_path / "ckpt" / "last.ckpt"))
    assert res.returncode == 0, res.output[-4000:]
    assert_bit_identical(load_ckpt(tmp_path / "ckpt" / "last.ckpt"), reference("pretrain", 2))


@pytest.mark.slow
def test_a_failing_rank_zero_ends_the_ddp_job(data, tmp_path: Path) -> None:
    config = write_config(tmp_path, _stage(data, "finetune", 2), devices=2)
    res = run_fit(config, env={FAIL_ENV: "0:2"}, timeout=120)
    assert res.returncode != 0 and not res.survivors, res.survivors
    assert "[rank0]: RuntimeError: injected fault on rank 0 after step 2" in res.output
