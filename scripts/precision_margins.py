"""Which captions a lower precision changes: the fp32 decoder's margin where the two captions part.

For every test pair of a benchmark, decodes greedily in fp32 and in each lower precision, and for each changed
caption takes the margin of fp32's choice at the first step where they differ: the gap between fp32's top two
log-probabilities there (teacher-forced on fp32's own caption). Prints the share of identical captions and the
margin quantiles at the changed captions' parting steps against those of every step of every fp32 caption: if the
rounding only flips near-ties, the first are far smaller. With ``--thresholds`` also the share of fp32 captions
whose smallest margin falls under each threshold (how many captions sit on a near-tie at all).

    OMP_WAIT_POLICY=PASSIVE python scripts/precision_margins.py --model runs/demo/runs/finetune/model \\
        --root runs/demo/data/clevr_change --image-size 64
"""

from __future__ import annotations

import argparse

import _eval_split  # scripts/_eval_split.py
import torch

import namc
from namc.backends.precision import PRECISIONS


def _margins(model: namc.NAMC, batch: dict, ids: torch.Tensor) -> torch.Tensor:
    """(B, T) fp32 top-1 minus top-2 log-probability at each step of the captions ``ids`` (NaN after EOS)."""
    fdg = model.fdg
    bos = torch.full((ids.shape[0], 1), fdg.bos_id, dtype=ids.dtype)
    with torch.inference_mode():
        memory = model.encode_pair(batch["image1"], batch["image2"])
        logp = fdg(torch.cat([bos, ids[:, :-1]], 1), memory).log_softmax(-1)  # (B, T, V)
    top = logp.topk(2, dim=-1).values
    margin = top[..., 0] - top[..., 1]
    ended = (ids == fdg.eos_id).cumsum(1) - (ids == fdg.eos_id).long() > 0  # steps after the EOS
    return margin.masked_fill(ended | (ids == fdg.pad_id), float("nan"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _eval_split.add_arguments(p)
    p.add_argument("--precisions", nargs="+", default=[q for q in PRECISIONS if q != "fp32"])
    p.add_argument("--thresholds", nargs="*", type=float, default=[0.01, 0.05, 0.1, 0.5])
    args = p.parse_args()
    model, _, loader = _eval_split.load(args)
    all_margins, smallest, parted = [], [], {q: [] for q in args.precisions}
    same = dict.fromkeys(args.precisions, 0)
    n = 0
    for batch in loader:
        ref = model.generate_ids(batch["image1"], batch["image2"])  # (B, T)
        margin = _margins(model, batch, ref)
        all_margins.append(margin[~margin.isnan()])
        smallest.append(torch.nan_to_num(margin, nan=float("inf")).min(1).values)
        n += ref.shape[0]
        for q in args.precisions:
            low = namc.compile(model, "cpu", q).generate_ids(batch["image1"], batch["image2"])
            T = max(ref.shape[1], low.shape[1])
            a = torch.nn.functional.pad(ref, (0, T - ref.shape[1]), value=model.fdg.pad_id)
            b = torch.nn.functional.pad(low, (0, T - low.shape[1]), value=model.fdg.pad_id)
            differ = a != b
            changed = differ.any(1)
            same[q] += int((~changed).sum())
            first = differ.float().argmax(1)[changed]  # the first step where the captions part
            parted[q].append(margin[changed, first.clamp(max=margin.shape[1] - 1)])
    every = torch.cat(all_margins)
    quant = torch.tensor([0.1, 0.5, 0.9])
    fmt = "  ".join
    print(
        f"{n} pairs; fp32 margins over all {every.numel()} steps: quantiles 10/50/90% "
        f"{fmt(f'{v:.3f}' for v in every.quantile(quant).tolist())}"
    )
    low_min = torch.cat(smallest)
    print(
        "fp32 captions whose smallest margin is under "
        + ", ".join(f"{t}: {100 * float((low_min < t).float().mean()):.1f}%" for t in args.thresholds)
    )
    for q in args.precisions:
        m = torch.cat(parted[q]) if parted[q] else torch.empty(0)
        line = f"{q}: {same[q]} of {n} identical ({100 * same[q] / n:.1f}%)"
        if m.numel():
            line += (
                f"; fp32 margin where the {m.numel()} changed captions part: quantiles 10/50/90% "
                f"{fmt(f'{v:.3f}' for v in m.quantile(quant).tolist())}, max {m.max():.3f}"
            )
        print(line)


if __name__ == "__main__":
    main()
