"""Two-process CPU DDP (Lightning ``ddp_spawn``, gloo): the NIM loss sees the other rank's negatives, the corpus is
split over ranks, and one step's gradients equal those of a single process on the same global batch."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from namc.data.synthetic import make_pair, render_scene
from namc.lit import PretrainModule
from namc.lit.datamodules import CorpusDataModule
from namc.objectives import pretrain_step
from namc.ops.distributed import all_gather_with_grad

warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")
logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)

COLORS = ("red", "blue", "green", "yellow", "purple", "cyan", "brown", "gray")
GLOBAL_BATCH = 8


def _corpus(root: Path) -> Path:
    """Eight pairs whose descriptions all have the same length (so per-rank token means average to the global one)."""
    (root / "images").mkdir(parents=True)
    lines = []
    for i in range(GLOBAL_BATCH):
        pair = make_pair(0, i)
        render_scene(pair.before, 64).save(root / "images" / f"{i}_1.png")
        render_scene(pair.after, 64).save(root / "images" / f"{i}_2.png")
        c1, c2 = COLORS[i], COLORS[(3 * i + 1) % len(COLORS)]
        text = (
            f"The difference between the two images is that the first image shows a {c1} cube, while the second "
            f"image shows a {c2} cube."
        )
        lines.append(
            {
                "id": f"p{i}",
                "source": "test",
                "image1": f"images/{i}_1.png",
                "image2": f"images/{i}_2.png",
                "description": text,
            }
        )
    manifest = root / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return manifest


class Recorder(pl.Callback):
    """Writes each rank's NIM loss, batch ids and (DDP-averaged) gradients after the first backward."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.record: dict = {}

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: dict, idx: int) -> None:
        self.record["ids"] = list(batch["ids"])

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer) -> None:
        grads = {n: p.grad.detach().clone() for n, p in pl_module.model.named_parameters() if p.grad is not None}
        self.record["grads"] = grads

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, idx) -> None:
        self.record["nim"] = float(outputs["nim"])
        self.record["world"] = trainer.world_size
        torch.save(self.record, Path(self.out) / f"rank{trainer.global_rank}.pt")


def _module(dm: CorpusDataModule) -> PretrainModule:
    pl.seed_everything(0)  # the same initial weights in every run
    return PretrainModule(
        "namc_tiny",
        tokenizer=dm.caption_tokenizer,
        masking="random",
        p_img=0.0,
        p_txt=0.0,
        overrides={"dim": 32, "heads": 2, "dropout": 0.0},
    )


def _fit(manifest: Path, out: Path, devices: int) -> None:
    out.mkdir()
    dm = CorpusDataModule(
        str(manifest),
        batch_size=GLOBAL_BATCH // devices,
        num_workers=0,
        image_size=64,
        max_text_len=48,
        max_caption_len=64,
        shuffle_buffer=0,
    )
    module = _module(dm)  # no masks and no dropout: nothing random in the step
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp_spawn" if devices > 1 else "auto",
        max_steps=1,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Recorder(str(out))],
    )
    trainer.fit(module, datamodule=dm)


@pytest.mark.slow  # two spawned ranks
@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_ddp_gathers_negatives_and_matches_a_single_process(tmp_path: Path) -> None:
    manifest = _corpus(tmp_path / "corpus")
    _fit(manifest, tmp_path / "single", devices=1)
    _fit(manifest, tmp_path / "ddp", devices=2)
    single = torch.load(tmp_path / "single" / "rank0.pt", weights_only=True)
    ranks = [torch.load(tmp_path / "ddp" / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert single["world"] == 1 and ranks[0]["world"] == 2

    # the corpus is split over ranks: disjoint halves that together are the single process's batch
    assert not set(ranks[0]["ids"]) & set(ranks[1]["ids"])
    assert sorted(ranks[0]["ids"] + ranks[1]["ids"]) == sorted(single["ids"])

    # each rank's SDM loss is the loss of the whole global batch (the other rank's pairs are its negatives) ...
    for r in ranks:
        assert r["nim"] == pytest.approx(single["nim"], rel=1e-5, abs=1e-5)
    # ... and not the loss of its own half alone
    local = _local_nim_loss(manifest, ranks[0]["ids"])
    assert abs(local - single["nim"]) > 1e-3

    # DDP-averaged gradients equal the single-process gradients of the global batch
    assert ranks[0]["grads"].keys() == single["grads"].keys()
    for name, g in single["grads"].items():
        scale = float(g.abs().max())
        for r in ranks:  # float32 sums in another order: equal up to rounding, relative to the gradient's scale
            assert (r["grads"][name] - g).abs().max() <= 1e-4 * scale + 1e-9, name


def _local_nim_loss(manifest: Path, ids: list[str]) -> float:
    dm = CorpusDataModule(
        str(manifest),
        batch_size=GLOBAL_BATCH,
        num_workers=0,
        image_size=64,
        max_text_len=48,
        max_caption_len=64,
        shuffle_buffer=0,
    )
    module = _module(dm)
    batch = next(iter(dm.train_dataloader()))
    keep = [i for i, k in enumerate(batch["ids"]) if k in ids]
    half = {k: (v[keep] if isinstance(v, torch.Tensor) else [v[i] for i in keep]) for k, v in batch.items()}
    with torch.no_grad():
        return float(pretrain_step(module.model, half)["nim"])


def _gather_worker(rank: int, world: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        x = torch.full((rank + 1, 3 + rank), float(rank + 1), requires_grad=True)  # uneven rows and widths
        y = all_gather_with_grad(x)  # (1 + 2, 4) after padding the width
        (y * torch.arange(1.0, y.shape[0] + 1)[:, None]).sum().backward()
        torch.save({"shape": tuple(y.shape), "y": y.detach(), "grad": x.grad}, Path(out) / f"g{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned ranks
def test_all_gather_with_grad_pads_and_routes_gradients(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_gather_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"g{r}.pt", weights_only=True) for r in (0, 1))
    assert r0["shape"] == r1["shape"] == (3, 4)
    expected = torch.tensor([[1.0, 1, 1, 0], [2, 2, 2, 2], [2, 2, 2, 2]])  # rank 0's row padded with a zero
    assert torch.equal(r0["y"], expected) and torch.equal(r1["y"], expected)
    # every rank's loss weights gathered row j by j + 1; a rank's rows get the sum over both ranks' losses
    assert torch.equal(r0["grad"], torch.full((1, 3), 2.0))
    assert torch.equal(r1["grad"], torch.tensor([[4.0] * 4, [6.0] * 4]))


@pytest.mark.slow  # two spawned ranks
def test_ddp_validation_metrics_equal_a_single_process(tmp_path: Path) -> None:
    from namc.data.synthetic import generate_benchmark
    from namc.lit import FinetuneModule
    from namc.lit.datamodules import BenchmarkDataModule

    generate_benchmark(tmp_path / "bench", 30, image_size=32, seed=0, n_captions=2)

    def validate(devices: int) -> dict[str, float]:
        # 3 validation pairs over 2 ranks: the DistributedSampler repeats one, which scoring must count once
        dm = BenchmarkDataModule(
            "clevr_change",
            str(tmp_path / "bench"),
            batch_size=2,
            num_workers=0,
            image_size=32,
            include_distractors=False,
        )
        pl.seed_everything(0)
        module = FinetuneModule(
            "namc_tiny", tokenizer=dm.caption_tokenizer, overrides={"image_size": 32, "dim": 32, "heads": 2}
        )
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=devices,
            strategy="ddp_spawn" if devices > 1 else "auto",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=str(tmp_path),
        )
        return trainer.validate(module, datamodule=dm, verbose=False)[0]

    single, ddp = validate(1), validate(2)
    assert "val/cider" in single
    for key in ("val/cider", "val/bleu4", "val/meteor", "val/rouge_l"):
        assert ddp[key] == pytest.approx(single[key], abs=1e-6), key


def test_ddp_ranks_start_their_workers_from_a_fork_server() -> None:
    """A rank's threads (gloo's, Lightning's observer) make a plain fork of its DataLoader workers unsafe (a worker
    once hung inside os.fork() in tests/test_resume.py): under DDP workers come from a fork server that has torch and
    namc's data modules preloaded; one process keeps fork, and no workers need no context."""
    from namc.data.views import loader_workers

    assert loader_workers(2, 1) == {"num_workers": 2} and loader_workers(0, 2) == {"num_workers": 0}
    args = loader_workers(2, 2)
    assert args["num_workers"] == 2 and args["multiprocessing_context"].get_start_method() == "forkserver"
