"""Session 45, one process alternating (on a CPU with AMX; random weights):

- the int8 CLIP4IDC peer's decoding with its memory side (cross encoder, the decoder's keys / values of the memory) in
  dynamic int8, session 43's form, against bf16, session 45's (`clip4idc._memory_side_to_bf16`);
- namc_base's int8 prefill (`FDG.cross_kv`) and decoding with the cross-attention keys / values computed in dynamic
  int8 against bf16 (`FDG.pack_step` on AMX).

    OMP_WAIT_POLICY=PASSIVE python docs/measurements/xeon_amx_session45/alternate_memory_side.py
"""

import functools
import statistics
import time
from collections.abc import Callable

import torch

import namc
from namc.eval.throughput import clip4idc
from namc.models import onednn
from namc.models.precision import inference_copy, run_context
from namc.models.qlinear import int8_linear


def alternate(label: str, calls: dict[str, Callable[[], object]], rounds: int) -> None:
    """Median ms of each call, the calls taking turns for ``rounds`` rounds."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    (a_name, a), (b_name, b) = ((name, statistics.median(t) * 1e3) for name, t in times.items())
    print(f"{label}: {a_name} {a:.1f} ms, {b_name} {b:.1f} ms, {a / b:.2f}x", flush=True)


def peers() -> tuple[clip4idc.CLIP4IDCPeer, clip4idc.CLIP4IDCPeer]:
    """The int8 peer in session 43's form (only the ViT in bf16) and in session 45's."""
    torch.manual_seed(0)
    peer = clip4idc.CLIP4IDCPeer().eval()
    new = clip4idc.peer_at(peer, "int8")
    onednn._AMX_OK = False
    all_int8 = clip4idc.peer_at(peer, "int8")
    onednn._AMX_OK = True
    old = clip4idc.peer_at(peer, "int8")
    old.cross = all_int8.cross
    for layer, int8_layer in zip(old.decoder, all_int8.decoder, strict=True):
        layer.multihead_attn.kv = int8_layer.multihead_attn.kv
    return old, new


def main() -> None:
    torch.set_num_threads(2)
    if not onednn.amx_bf16():
        raise SystemExit("this measures the AMX rule: no AMX-BF16 on this CPU")
    old, new = peers()
    with torch.inference_mode():
        for batch in (32, 1):
            images = torch.rand(2, batch, 3, 224, 224)
            m_old, m_new = old.encode(images[0], images[1]), new.encode(images[0], images[1])
            calls = {
                "int8 memory side": functools.partial(old.decode, m_old, 23),
                "bf16 memory side": functools.partial(new.decode, m_new, 23),
            }
            alternate(f"peer decode batch {batch}", calls, 3 if batch > 1 else 9)
    base = namc.create_model("namc_base").eval()
    fdg = inference_copy(base, "int8").fdg
    fdg.eos_id = -1  # every call makes 23 tokens
    forms = {
        "int8": [int8_linear(b.cross_attn.kv.weight, b.cross_attn.kv.bias) for b in base.fdg.blocks],
        "bf16": [b.cross_attn.kv for b in fdg.blocks],
    }

    def using(form: str, call: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            for block, kv in zip(fdg.blocks, forms[form], strict=True):
                block.cross_attn.kv = kv
            return call()

        return run

    with torch.inference_mode(), run_context("int8", torch.device("cpu")):
        for batch in (32, 8, 1):
            memory = torch.randn(batch, 196, 768)
            prefill = {form: using(form, functools.partial(fdg.cross_kv, memory)) for form in forms}
            alternate(f"namc prefill batch {batch}", prefill, 9)
            decode = {form: using(form, functools.partial(fdg.generate, memory, 23)) for form in forms}
            alternate(f"namc decode batch {batch}", decode, 7 if batch > 1 else 15)


if __name__ == "__main__":
    main()
