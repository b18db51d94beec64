"""Make the golden artefacts that pin behaviour across refactors (run once; the outputs are committed).

- ``namc_tiny/``: a small namc_tiny (pre-training modules included), trained a few steps so that greedy decoding
  writes varied words, saved by ``save_pretrained``.
- ``pretrain.ckpt``: a Lightning pre-training checkpoint of a few steps (PretrainModule + CorpusDataModule).
- ``expected.json``: the ids ``generate`` gives on fixed inputs for both, and the pre-training losses of one step.

Run from the repository root: ``python tests/data/golden/make_golden.py``; it rewrites the artefacts only if asked
with ``--write``, which a change that keeps old files loading never needs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
OVERRIDES = dict(dim=32, heads=2, dropout=0.0, grid_kwargs={"layers": [1, 1, 1, 1]}, max_caption_len=32)


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(123)
    return torch.rand(3, 3, 64, 64, generator=g), torch.rand(3, 3, 64, 64, generator=g)


def build(out: Path) -> dict:
    import lightning.pytorch as pl

    import namc
    from namc.data.synthetic import generate_corpus
    from namc.lit import PretrainModule
    from namc.lit.datamodules import CorpusDataModule
    from namc.models import load_model
    from namc.objectives import finetune_step, pretrain_step

    torch.manual_seed(0)
    work = Path(tempfile.mkdtemp(prefix="namc-golden-"))
    generate_corpus(work / "corpus", 16, image_size=64, seed=0, noise_rate=0.3)
    dm = CorpusDataModule(
        train=str(work / "corpus" / "manifest.jsonl"),
        batch_size=8,
        num_workers=0,
        image_size=64,
        max_text_len=48,
        max_caption_len=32,
        shuffle_buffer=8,
    )
    module = PretrainModule(model="namc_tiny", overrides=OVERRIDES, seed=0, warmup_steps=0)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=4,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(work),
    )
    trainer.fit(module, datamodule=dm)
    trainer.save_checkpoint(out / "pretrain.ckpt")

    model = module.model
    x1, x2 = inputs()
    # one pre-training step on a fixed batch with a fixed mask generator: pins the objectives
    batch = next(iter(dm.train_dataloader()))
    batch = {k: (v[:2] if torch.is_tensor(v) else v[:2]) for k, v in batch.items()}
    tensors = {k: v.contiguous() for k, v in batch.items() if torch.is_tensor(v)}
    from safetensors.torch import save_file

    save_file(tensors, str(out / "pretrain_batch.safetensors"))
    torch.manual_seed(0)
    with torch.no_grad():
        losses = pretrain_step(model.train(), tensors, generator=torch.Generator().manual_seed(7))
    # a few fine-tuning steps on the batch's own descriptions, so that greedy decoding writes varied words
    opt = torch.optim.Adam([p for g in model.param_groups().values() for p in g], lr=3e-3)
    for _ in range(60):
        opt.zero_grad()
        finetune_step(model, tensors)["loss"].backward()
        opt.step()
    model.eval()
    model.save_pretrained(out / "namc_tiny")
    with torch.no_grad():
        memory = model.encode_pair(x1, x2)
    ckpt_model = load_model(str(out / "pretrain.ckpt")).eval()
    expected = {
        "batch_ids": model.generate_ids(tensors["image1"], tensors["image2"]).tolist(),
        "batch_captions": model.generate(tensors["image1"], tensors["image2"]),
        "losses": {k: float(v) for k, v in losses.items()},
        "memory_sum": float(memory.double().sum()),
        "memory_abs_sum": float(memory.double().abs().sum()),
        "ids": model.generate_ids(x1, x2).tolist(),
        "captions": model.generate(x1, x2),
        "ckpt_ids": ckpt_model.generate_ids(x1, x2).tolist(),
        "ckpt_memory_sum": float(ckpt_model.encode_pair(x1, x2).double().sum()),
        "num_parameters": model.num_parameters(),
        "namc_version": namc.__version__,
    }
    return expected


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="overwrite the committed artefacts")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = HERE if args.write else Path(tempfile.mkdtemp(prefix="namc-golden-out-"))
    expected = build(out)
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
