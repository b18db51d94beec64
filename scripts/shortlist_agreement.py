"""What a shortlist of the training captions' tokens changes: test captions with it against without, per precision.

For every test pair of a benchmark, decodes greedily over the whole vocabulary and over the shortlist of the
benchmark's training captions (the model's ``training_shortlist``, else :meth:`NAMC.shortlist
<namc.models.namc.NAMC.shortlist>` of the datamodule's), in each precision, and prints the shortlist's size and the
share of identical captions (a caption differs only where a step's top token is not in the list, or, in fp32 and
bf16, where a product over fewer rows rounds a near-tie the other way).

    OMP_WAIT_POLICY=PASSIVE python scripts/shortlist_agreement.py --model runs/demo/runs/finetune/model \\
        --root runs/demo/data/clevr_change --image-size 64
"""

from __future__ import annotations

import argparse

import _eval_split  # scripts/_eval_split.py
import torch

import namc
from namc.backends.precision import PRECISIONS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _eval_split.add_arguments(p)
    p.add_argument("--precisions", nargs="+", default=list(PRECISIONS))
    args = p.parse_args()
    model, dm, loader = _eval_split.load(args)
    short = model.training_shortlist or model.shortlist(dm.vocabulary_texts())  # the training captions' tokens
    same, outside, n = dict.fromkeys(args.precisions, 0), dict.fromkeys(args.precisions, 0), 0
    listed = set(short.ids.tolist()) | {model.fdg.pad_id}
    for batch in loader:
        for q in args.precisions:
            captioner = namc.compile(model, "cpu", q)
            full = captioner.generate_ids(batch["image1"], batch["image2"])
            restricted = captioner.generate_ids(batch["image1"], batch["image2"], vocabulary=short)
            T = max(full.shape[1], restricted.shape[1])
            full, restricted = (
                torch.nn.functional.pad(x, (0, T - x.shape[1]), value=model.fdg.pad_id) for x in (full, restricted)
            )
            same[q] += int((full == restricted).all(1).sum())
            outside[q] += sum(not set(row) <= listed for row in full.tolist())
        n += batch["image1"].shape[0]
    print(f"{args.model}: {n} {args.split} pairs; shortlist {len(short)} of {short.vocab_size} tokens")
    for q in args.precisions:
        print(
            f"  {q}: identical {same[q] / n:.1%}; full-vocabulary captions with a token outside the list {outside[q]}"
        )


if __name__ == "__main__":
    main()
