"""Benchmarks of the corpus-curation compute, printed (never asserted):

1. embedding throughput (images/s) of the two appendix D.1 encoders at full size, random weights: CLIP ViT-L/14
   (open_clip ``ViT-L-14``, QuickGELU as the ``openai`` tag sets) and DINOv2 ViT-L/14 (timm
   ``vit_large_patch14_dinov2`` at 224 px), forward only under ``torch.inference_mode``, after one warm-up batch;
2. pre-training steps/s of ``namc_base`` (random weights) at batch 4, forward + backward + Adam, with the frozen
   VQGAN and ResNet-101 running on the images, and with their outputs given (precomputed targets, as
   ``namc data precompute`` writes them).

    nice -n 10 python benchmarks/bench_embed.py --threads 1 --batch 4 --steps 2

Prints the torch thread count and the 1-minute load average, since the figures depend on them.
"""

from __future__ import annotations

import argparse
import os
import time

import torch


def _load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def bench_encoders(batch: int, batches: int) -> None:
    from namc.curate.encoders import build_clip, build_dino

    for name, build in (("CLIP ViT-L/14", lambda: build_clip(None)), ("DINOv2 ViT-L/14", lambda: build_dino(None))):
        enc = build()
        x = torch.rand(batch, 3, 224, 224)
        with torch.inference_mode():
            enc.model(x)  # warm-up
            t0 = time.perf_counter()
            for _ in range(batches):
                f = enc.model(x)
            dt = time.perf_counter() - t0
        n = sum(p.numel() for p in enc.model.parameters())
        print(
            f"{name:<16} {n / 1e6:6.1f}M params, dim {f.shape[1]}: {batch * batches / dt:6.2f} images/s "
            f"(batch {batch}, {batches} batches, {dt:.1f} s; load {_load()})"
        )
        del enc


def _batch(model: torch.nn.Module, batch: int) -> dict:
    from namc.data.collate import PretrainCollator

    g = torch.Generator().manual_seed(0)
    items = [
        {
            "image1": torch.rand(3, 224, 224, generator=g),
            "image2": torch.rand(3, 224, 224, generator=g),
            "verb1": "shows",
            "desc1": "a red cube left of a small grey sphere on a table",
            "verb2": "shows",
            "desc2": "a blue cube left of a small grey sphere on a table",
            "id": str(i),
        }
        for i in range(batch)
    ]
    return PretrainCollator(model.tokenizer, 77, model.config.max_caption_len)(items)


def bench_pretrain(batch: int, steps: int) -> None:
    from namc.models import create_model
    from namc.objectives import pretrain_step

    model = create_model("namc_base").train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-5)
    b = _batch(model, batch)
    with torch.no_grad():
        images = torch.cat([b["image1"], b["image2"]])
        codes, grids = model.vqgan(images), model.grid(images).half().float()
    B = batch
    pre = {**b, "codes1": codes[:B], "codes2": codes[B:], "grid1": grids[:B], "grid2": grids[B:]}
    for label, data in (("images (frozen VQGAN + ResNet-101 run)", b), ("precomputed codes + grids", pre)):
        times = []
        for i in range(steps + 1):  # the first is a warm-up
            t0 = time.perf_counter()
            out = pretrain_step(model, data, torch.Generator().manual_seed(i))
            opt.zero_grad()
            out["loss"].backward()
            opt.step()
            times.append(time.perf_counter() - t0)
        dt = sum(times[1:]) / steps
        print(
            f"namc_base pre-training, batch {batch}, {label}: {1 / dt:.3f} steps/s ({dt:.1f} s/step over {steps} "
            f"steps; load {_load()})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--batches", type=int, default=2, help="timed embedding batches per model")
    parser.add_argument("--steps", type=int, default=2, help="timed pre-training steps per setting")
    parser.add_argument("--skip", choices=("embed", "pretrain"), default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {os.cpu_count()} CPUs, load {_load()}")
    if args.skip != "embed":
        bench_encoders(args.batch, args.batches)
    if args.skip != "pretrain":
        bench_pretrain(args.batch, args.steps)


if __name__ == "__main__":
    main()
