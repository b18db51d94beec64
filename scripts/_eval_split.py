"""What the caption-comparison tools share: a saved model and one split of a benchmark, from the command line."""

from __future__ import annotations

import argparse

import torch

import namc
from namc.lit.datamodules import BenchmarkDataModule


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``--model --root --benchmark --image-size --split --threads``."""
    p.add_argument("--model", required=True, help="a save_pretrained folder")
    p.add_argument("--root", required=True, help="the benchmark's root (CLEVR-Change layout)")
    p.add_argument("--benchmark", default="clevr_change")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--split", default="test")
    p.add_argument("--threads", type=int, default=1)


def load(args: argparse.Namespace) -> tuple[namc.NAMC, BenchmarkDataModule, torch.utils.data.DataLoader]:
    """The model (eval mode), the data module and the split's loader (batches of 100), on ``--threads`` threads."""
    torch.set_num_threads(args.threads)
    model = namc.from_pretrained(args.model).eval()
    dm = BenchmarkDataModule(
        args.benchmark, args.root, eval_batch_size=100, num_workers=0, image_size=args.image_size, tokenizer=args.model
    )
    dm.setup(args.split)
    loader = dm.test_dataloader() if args.split == "test" else dm.val_dataloader()
    return model, dm, loader
