"""What a shortlist of the training captions' tokens changes: test captions with it against without, per precision.

For every test pair of a benchmark, decodes greedily over the whole vocabulary and over the shortlist of the
benchmark's training captions (:meth:`NAMC.shortlist <namc.models.namc.NAMC.shortlist>`), in each precision, and
prints the shortlist's size and the share of identical captions (a caption differs only where a step's top token is
not in the list, or, in fp32 and bf16, where a product over fewer rows rounds a near-tie the other way).

    OMP_WAIT_POLICY=PASSIVE python tools/shortlist_agreement.py --model runs/demo/runs/finetune/model \\
        --root runs/demo/data/clevr_change --image-size 64
"""

from __future__ import annotations

import argparse

import torch

import namc
from namc.lit.datamodules import BenchmarkDataModule
from namc.models.precision import PRECISIONS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a save_pretrained folder")
    p.add_argument("--root", required=True, help="the benchmark's root")
    p.add_argument("--benchmark", default="clevr_change")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--split", default="test")
    p.add_argument("--precisions", nargs="+", default=list(PRECISIONS))
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = namc.from_pretrained(args.model).eval()
    dm = BenchmarkDataModule(args.benchmark, args.root, eval_batch_size=100, num_workers=0,
                             image_size=args.image_size, tokenizer=args.model)  # fmt: skip
    short = model.shortlist(dm.vocabulary_texts())
    dm.setup(args.split)
    loader = dm.test_dataloader() if args.split == "test" else dm.val_dataloader()
    same, outside, n = dict.fromkeys(args.precisions, 0), dict.fromkeys(args.precisions, 0), 0
    listed = set(short.ids.tolist()) | {model.fdg.pad_id}
    for batch in loader:
        for q in args.precisions:
            full = model.generate_ids(batch["image1"], batch["image2"], precision=q)
            restricted = model.generate_ids(batch["image1"], batch["image2"], precision=q, vocabulary=short)
            T = max(full.shape[1], restricted.shape[1])
            full, restricted = (torch.nn.functional.pad(x, (0, T - x.shape[1]), value=model.fdg.pad_id)
                                for x in (full, restricted))  # fmt: skip
            same[q] += int((full == restricted).all(1).sum())
            outside[q] += sum(not set(row) <= listed for row in full.tolist())
        n += batch["image1"].shape[0]
    print(f"{args.model}: {n} {args.split} pairs; shortlist {len(short)} of {short.vocab_size} tokens")
    for q in args.precisions:
        print(f"  {q}: identical {same[q] / n:.1%}; full-vocabulary captions with a token outside the list "
              f"{outside[q]}")  # fmt: skip


if __name__ == "__main__":
    main()
