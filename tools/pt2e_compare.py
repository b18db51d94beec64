"""PyTorch's x86 int8 flow (PT2E) against namc's int8 copy: the encoder of a preset, or the CLIP4IDC peer's.

PT2E: ``torch.export`` of the part, torchao's ``X86InductorQuantizer`` (static: activation scales from calibration
batches; dynamic: per call), ``prepare_pt2e``, calibration, ``convert_pt2e``, then ``torch.compile`` with inductor's
freezing, which lowers the quantised convolutions and linear layers to oneDNN's int8 kernels and fuses the
quantisation into the operations around them. Against it, in one process, calls alternating: namc's own int8 copy
(``namc.models.precision.inference_copy``: static int8 ResNet blocks, dynamic int8 linear layers) or the peer's
(``peer_at(peer, "int8")``, every linear map in dynamic int8). Random weights and random images (uniform in [0, 1]); the
grid's static int8 and PT2E's static scales are calibrated on the same random images, other than the timed ones.
Prints the build time (export to the first compiled call), each output's relative L2 distance from fp32's, and the
median time of each over the rounds.

    pip install torchao   # torchao >= 0.18: PT2E moved there from torch.ao (torch >= 2.14 has no quantize_pt2e)
    OMP_WAIT_POLICY=PASSIVE python tools/pt2e_compare.py --part encoder --batch 32 --rounds 4
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch import nn

import namc
from namc.models.precision import inference_copy

PARTS = ("encoder", "grid", "mir", "peer")


class Part(nn.Module):
    """One part of a model as a module of two inputs, as ``torch.export`` takes it."""

    def __init__(self, model: nn.Module, part: str) -> None:
        super().__init__()
        self.model, self.part = model, part

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return run_part(self.model, self.part, x, y)


def run_part(model: nn.Module, part: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The part's output for a pair batch: images for ``encoder``, ``grid`` and ``peer``, grid features for ``mir``."""
    if part == "grid":
        return model.grid(torch.cat([x, y]))
    if part == "mir":
        return model.mir.interact(model.mir.embed(x), model.mir.embed(y))
    if part == "peer":
        return model.encode(x, y)
    return model.encode_pair(x, y)


def pt2e(model: nn.Module, part: str, inputs: tuple, calibration: list[tuple], dynamic: bool) -> Callable:
    """The part quantised by PT2E's x86 flow and compiled by inductor with freezing."""
    try:
        from torchao.quantization.pt2e import move_exported_model_to_eval
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
            X86InductorQuantizer,
            get_default_x86_inductor_quantization_config,
        )
    except ImportError as err:
        sys.exit(f"pt2e_compare: needs torchao >= 0.18 (pip install torchao): {err}")
    exported = torch.export.export(Part(copy.deepcopy(model), part).eval(), inputs).module()
    quantizer = X86InductorQuantizer()
    quantizer.set_global(get_default_x86_inductor_quantization_config(is_dynamic=dynamic))
    prepared = prepare_pt2e(exported, quantizer)
    for batch in calibration:
        prepared(*batch)
    converted = convert_pt2e(prepared)
    move_exported_model_to_eval(converted)
    torch._inductor.config.freezing = True  # the weights become constants inductor lays out and prepacks
    return torch.compile(converted)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="namc_base")
    p.add_argument("--part", choices=PARTS, default="encoder")
    p.add_argument("--batch", type=int, default=32, help="pairs per call")
    p.add_argument("--mode", choices=("static", "dynamic"), default="static")
    p.add_argument("--calibration-batches", type=int, default=2)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)

    def pairs(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.rand(n, 3, 224, 224), torch.rand(n, 3, 224, 224)

    calibration = [pairs(args.batch) for _ in range(args.calibration_batches)]
    timed = pairs(args.batch)
    with torch.no_grad():
        if args.part == "peer":
            from namc.eval.throughput.clip4idc import CLIP4IDCPeer, peer_at

            model = CLIP4IDCPeer().eval()
            ours = peer_at(model, "int8")
        else:
            model = namc.create_model(args.model).eval().drop_pretraining_modules()
            model.calibrate_int8([torch.cat(batch) for batch in calibration])
            ours = inference_copy(model, "int8")
            if args.part == "mir":  # MIR takes the grid's features
                calibration = [(model.grid(a), model.grid(b)) for a, b in calibration]
                timed = (model.grid(timed[0]), model.grid(timed[1]))
        reference = run_part(model, args.part, *timed)
        start = time.perf_counter()
        compiled = pt2e(model, args.part, timed, calibration, args.mode == "dynamic")
        theirs = compiled(*timed)
        build = time.perf_counter() - start

        def distance(out: torch.Tensor) -> float:
            return float((out.float() - reference).norm() / reference.norm())

        mine = run_part(ours, args.part, *timed)
        label = "peer int8" if args.part == "peer" else "namc int8"
        times: dict[str, list[float]] = {label: [], f"PT2E {args.mode}": []}
        calls = {label: lambda: run_part(ours, args.part, *timed), f"PT2E {args.mode}": lambda: compiled(*timed)}
        for _ in range(args.rounds):
            for name, call in calls.items():
                t = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - t)
    medians = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
    (a, ma), (b, mb) = medians.items()
    name = "CLIP4IDC peer" if args.part == "peer" else args.model
    print(f"{name} {args.part}, {args.batch} pairs, {args.threads} threads")
    print(f"PT2E build (export, calibrate, convert, first compiled call): {build:.1f} s")
    print(f"relative L2 from fp32: {a} {distance(mine):.4f}, {b} {distance(theirs):.4f}")
    print(f"median of {args.rounds}: {a} {ma:.1f} ms, {b} {mb:.1f} ms; {b} / {a} = {mb / ma:.2f}")
    for name, ts in times.items():
        print(f"  {name}: " + " ".join(f"{t * 1e3:.0f}" for t in ts) + " ms")


if __name__ == "__main__":
    main()
