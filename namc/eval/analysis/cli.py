"""``namc analyze``: Table 9 and Figures 6-8 for a pre-trained model.

::

    namc analyze reconstruction --model PRETRAINED --corpus MANIFEST --vqgan last.ckpt [--batches 8] [--out DIR]
    namc analyze relevance --model PRETRAINED A.png B.png --description "The difference ..." [--out fig.png]

``reconstruction`` decodes MIR's predicted codes and the VQGAN's own codes with the decoder half of the VQGAN
checkpoint and prints PSNR / SSIM of the masked patches (also written to ``DIR/table9.json``); the model must be a
pre-training one (NIM, VQGAN and MIR's head: a pre-training ``last.ckpt`` or its ``model/`` export).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]

logger = logging.getLogger(__name__)


def _reconstruction(args: argparse.Namespace) -> int:
    import torch
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm

    from namc.data.collate import PretrainCollator
    from namc.data.corpus import CorpusDataset
    from namc.eval.analysis.reconstruction import TABLE9_ROWS, VQGANDecoder, mir_codes, reconstruction_table
    from namc.models import load_model

    model = load_model(args.model).eval()
    c = model.config
    vqgan = args.vqgan or c.vqgan_pretrained
    if vqgan is None:
        print(
            "namc analyze reconstruction: the VQGAN checkpoint is needed (--vqgan): taming-transformers' "
            "vqgan_imagenet_f16_16384/checkpoints/last.ckpt, the file the model's tokenizer was loaded from",
            file=sys.stderr,
        )
        return 2
    decoder = VQGANDecoder(c.vqgan_ddconfig, c.vqgan_n_embed, c.vqgan_embed_dim, vqgan)
    collate = PretrainCollator(model.tokenizer, model.nim.context_length, c.max_caption_len)
    loader = DataLoader(CorpusDataset(args.corpus, c.image_size), batch_size=args.batch_size, collate_fn=collate)
    g = torch.Generator().manual_seed(args.seed)
    sums: dict[str, dict[str, float]] = {}
    for i, batch in enumerate(tqdm(loader, total=args.batches, desc="table 9", unit="batch")):
        if i >= args.batches:
            break
        out = mir_codes(model, batch, g)
        for row, m in reconstruction_table(decoder, out["images"], out["vqgan"], out["mir"], out["mask"]).items():
            acc = sums.setdefault(row, {"psnr": 0.0, "ssim": 0.0, "patches": 0})
            for k in ("psnr", "ssim"):
                acc[k] += m[k] * m["patches"]
            acc["patches"] += m["patches"]
    table = {
        row: {k: (v["psnr" if k == "psnr" else "ssim"] / max(v["patches"], 1)) for k in ("psnr", "ssim")}
        | {"patches": v["patches"]}
        for row, v in sums.items()
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "table9.json").write_text(json.dumps(table, indent=2) + "\n")
    print("| reconstructed | reference | PSNR | SSIM | patches |\n|---|---|---|---|---|")
    for a, b in TABLE9_ROWS:
        m = table.get(f"{a}_vs_{b}", {"psnr": float("nan"), "ssim": float("nan"), "patches": 0})
        print(f"| {a} | {b} | {m['psnr']:.2f} | {m['ssim']:.3f} | {m['patches']} |")
    return 0


def _relevance(args: argparse.Namespace) -> int:
    from namc.eval.analysis.relevance import pair_batch, pair_maps, plot_pair
    from namc.models import load_model

    model = load_model(args.model).eval()
    if model.nim is None:
        print(
            f"namc analyze relevance: {args.model} has no NIM module (a fine-tuned model): pass a pre-trained one",
            file=sys.stderr,
        )
        return 2
    batch = pair_batch(model, args.image1, args.image2, args.description, model.nim.context_length)
    maps = pair_maps(model, batch)
    path = plot_pair(maps, [batch["image1"][0], batch["image2"][0]], args.out, args.description)
    print(path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``namc analyze``."""
    parser = argparse.ArgumentParser(prog="namc analyze", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("reconstruction", help="Table 9: PSNR / SSIM of MIR's and the VQGAN's masked patches")
    rec.add_argument("--model", required=True, help="a pre-training model folder or .ckpt")
    rec.add_argument("--corpus", required=True, help="a corpus manifest or shards (held-out pairs)")
    rec.add_argument("--vqgan", default=None, help="taming VQGAN last.ckpt (default: the model's vqgan_pretrained)")
    rec.add_argument("--batches", type=int, default=8)
    rec.add_argument("--batch-size", type=int, default=16)
    rec.add_argument("--seed", type=int, default=0, help="seed of NIM's masks")
    rec.add_argument("--out", default="runs/analysis")
    rel = sub.add_parser("relevance", help="Figures 6-8: relevance heat maps, word bars, co-attention maps")
    rel.add_argument("--model", required=True, help="a pre-training model folder or .ckpt (NIM needed)")
    rel.add_argument("image1")
    rel.add_argument("image2")
    rel.add_argument("--description", required=True, help="an implicit-change description (the template)")
    rel.add_argument("--out", default="runs/analysis/relevance.png")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from namc.text.template import TemplateError

    try:
        return _reconstruction(args) if args.command == "reconstruction" else _relevance(args)
    except (FileNotFoundError, TemplateError, ValueError) as err:
        print(f"namc analyze {args.command}: error: {err}", file=sys.stderr)
        return 2
