"""Inference throughput: generated tokens/s at each batch size and level, and the naive decoders timed beside them.

Dimension letters: B pairs, N grid positions, C grid channels, D width, T generated tokens.

Levels (``mode``), each timed after warm-up over several repeats:

- ``decode``: FDG generation from precomputed MIR memory E_MIR (B, N, D); includes FDG's once-per-pair
  cross-attention key/value projection of the memory;
- ``grid``: MIR interaction + FDG from precomputed ResNet grid features (the paper pre-extracts them, appendix E.2);
- ``e2e``: from pixels, the ResNet grid included.

Naive decoder (:mod:`.baselines`): ``reference="decode"`` runs :func:`generate_uncached` from the same memory; the
speed-up is the ratio of median times; ``tokens_match`` says whether both decoders produced the same ids.

The CLIP4IDC peer (:mod:`.clip4idc`, ``reference="clip4idc"``): its decode-only (from its visual memory) and
end-to-end (from the same pixels) calls, each interleaved with namc's call of the same level in one loop (namc,
peer, namc, peer, ...) so that both see the same machine load; the speed-up is the ratio of the two medians of that
loop. Both generate the same number of tokens per pair (``fixed`` disables [EOS] in both) at the run's precision.

Precision (``settings.precision``): on a CPU every namc call runs the :func:`~namc.backends.precision.inference_copy`
of that precision (inputs cast to its dtype), the peer a copy converted the same way (:func:`.clip4idc.peer_at`).

Length modes: with random weights, generation stops at arbitrary lengths, so ``fixed`` (the default) disables [EOS]
for the run and every row generates exactly ``max_new_tokens`` tokens; ``eos`` stops at [EOS] as in real use and
counts the tokens generated up to and including each row's first [EOS].
"""

from __future__ import annotations

import contextlib
import functools
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from namc.backends.precision import run_context
from namc.backends.static_decode import StaticDecoder
from namc.eval.throughput.baselines import generate_uncached
from namc.eval.throughput.clip4idc import EOS_ID, CLIP4IDCPeer
from namc.eval.throughput.flops import decoder_flops, fdg_shape
from namc.eval.throughput.settings import LENGTH_MODES, SHORTLIST_OF_MODEL, BenchmarkInputError, BenchmarkSettings
from namc.eval.throughput.timing import peak_memory, summarize, synchronize, time_calls
from namc.models.namc import NAMC
from namc.models.shortlist import Shortlist

__all__ = [
    "decoding_shortlist",
    "flops_entry",
    "generated_lengths",
    "length_mode",
    "peer_calls",
    "peer_length",
    "random_shortlist",
    "run_inference",
    "time_level",
    "time_peer",
]

logger = logging.getLogger(__name__)

# settings.reference -> the naive decoders / peer levels it times
_NAIVE = {"none": (), "decode": ("decode",), "clip4idc": (), "all": ("decode",)}
_PEER = {
    "none": (),
    "decode": (),
    "clip4idc": ("clip4idc_decode", "clip4idc_e2e"),
    "all": ("clip4idc_decode", "clip4idc_e2e"),
}
# naive decoder or peer level -> the optimised level it is compared with
_COMPARED_WITH = {"decode": "decode", "clip4idc_decode": "decode", "clip4idc_e2e": "e2e"}

Call = Callable[[], torch.Tensor]


@contextlib.contextmanager
def length_mode(model: NAMC, mode: str) -> Iterator[None]:
    """``fixed``: [EOS] is disabled for the duration (FDG's and the tokenizer's ``eos_id`` are set to -1, an id
    no token has), so every row generates exactly ``max_new_tokens``; ``eos``: unchanged. Restored on exit."""
    if mode not in LENGTH_MODES:
        raise ValueError(f"length mode must be one of {LENGTH_MODES}, got {mode!r}")
    if mode == "eos":
        yield
        return
    saved = model.fdg.eos_id, model.tokenizer.eos_id
    model.fdg.eos_id = -1
    model.tokenizer.eos_id = -1
    try:
        yield
    finally:
        model.fdg.eos_id, model.tokenizer.eos_id = saved


def generated_lengths(ids: torch.Tensor, eos_id: int, max_new_tokens: int, mode: str) -> list[int]:
    """Tokens each row generated: ``max_new_tokens`` in ``fixed`` mode; in ``eos`` mode up to and including the
    row's first [EOS] (``max_new_tokens`` when it produced none).

    Args:
        ids: (B, T) generated ids.
        eos_id: the real [EOS] id.
        max_new_tokens: the generation limit.
        mode: ``fixed`` or ``eos``.
    """
    if mode == "fixed":
        return [max_new_tokens] * ids.shape[0]
    out = []
    for row in ids.tolist():
        out.append(row.index(eos_id) + 1 if eos_id in row else max_new_tokens)
    return out


def random_shortlist(vocab_size: int, eos_id: int, size: int, seed: int) -> Shortlist:
    """``size`` ids of a ``vocab_size`` vocabulary, [EOS] and ``size - 1`` others drawn with ``seed`` (the whole
    vocabulary where ``size`` reaches it): with random weights which tokens are listed changes no timing."""
    others = torch.arange(vocab_size)
    others = others[others != eos_id]
    pick = torch.randperm(others.numel(), generator=torch.Generator().manual_seed(seed))[: max(size - 1, 0)]
    return Shortlist(others[pick], vocab_size, eos_id)


def decoding_shortlist(model: NAMC, settings: BenchmarkSettings) -> Shortlist | None:
    """The list ``settings.shortlist`` has namc decode over: None (the whole vocabulary), ``random_shortlist`` of
    that many ids, or the model's own ``training_shortlist`` (``"model"``: a one-line error where it has none)."""
    if settings.shortlist == SHORTLIST_OF_MODEL:
        if model.training_shortlist is None:
            raise BenchmarkInputError(
                f"--shortlist model: {settings.model} has no shortlist of its own (a folder that `namc fit` "
                "fine-tuned keeps one in shortlist.json); give a token count for a random list instead"
            )
        return model.training_shortlist
    if settings.shortlist:  # [EOS] is listed even where the length mode disables it
        vocab = model.fdg.tok.weight.shape[0]
        return random_shortlist(vocab, model.tokenizer.eos_id, settings.shortlist, settings.seed)
    return None


def run_inference(
    model: NAMC,
    settings: BenchmarkSettings,
    device: torch.device,
    matmul_flops: float | None,
    peer: CLIP4IDCPeer | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Time every (batch size, mode), the naive decoder and the peer; returns (inference, reference) entries.

    ``model`` is what runs (already the precision copy), ``peer`` the CLIP4IDC peer at the same precision (None
    unless ``settings.reference`` asks for it).
    """
    inference: list[dict[str, Any]] = []
    reference: list[dict[str, Any]] = []
    gen = torch.Generator().manual_seed(settings.seed)
    short = decoding_shortlist(model, settings)  # one list for every batch size: its rows are gathered once
    for batch in settings.batch_sizes:
        entries, refs = _run_batch(model, settings, device, batch, gen, matmul_flops, peer, short)
        inference += entries
        reference += refs
    return inference, reference


def _decoders(
    model: NAMC,
    settings: BenchmarkSettings,
    device: torch.device,
    batch: int,
    gen: torch.Generator,
    peer: CLIP4IDCPeer | None,
    short: Shortlist | None,
) -> tuple[dict[str, Call], dict[str, Call]]:
    """Random images of ``batch`` pairs; the optimised call of each level and the naive decoders / peer levels
    (namc's decoding over ``short`` where the settings ask for a shortlist)."""
    size = model.config.image_size
    pair = torch.rand(2, batch, 3, size, size, generator=gen)  # (2, B, 3, H, W) in [0, 1]
    img1, img2 = (x.to(device, model.fdg.pos.dtype) for x in pair)
    ctx = functools.partial(run_context, settings.precision, device)
    n_new = settings.max_new_tokens
    with torch.inference_mode(), ctx():
        grid = model.grid(torch.cat([img1, img2]))  # (2B, N, C)
        grid1, grid2 = grid[:batch], grid[batch:]
        memory = model.encode_pair(None, None, grid1, grid2)  # (B, N, D)
    if settings.static_decode:  # one decoder per batch size: its buffers (and CUDA graph) serve all three levels
        decode = StaticDecoder(model.fdg, n_new, vocabulary=short)
        encode = torch.inference_mode()(model.encode_pair)  # as generate_ids runs it
        optimised = {
            "decode": _within(ctx, lambda: decode(memory)),
            "grid": _within(ctx, lambda: decode(encode(None, None, grid1, grid2))),
            "e2e": _within(ctx, lambda: decode(encode(img1, img2))),
        }
    else:
        optimised = {
            "decode": _within(ctx, lambda: model.fdg.generate(memory, n_new, vocabulary=short)),
            "grid": _within(
                ctx, lambda: model.generate_ids(None, None, n_new, grid_1=grid1, grid_2=grid2, vocabulary=short)
            ),
            "e2e": _within(ctx, lambda: model.generate_ids(img1, img2, n_new, vocabulary=short)),
        }
    naive = {"decode": _within(ctx, lambda: generate_uncached(model.fdg, memory, n_new, vocabulary=short))}
    if peer is not None:
        naive |= peer_calls(peer, img1, img2, n_new)
    return optimised, naive


def peer_calls(peer: CLIP4IDCPeer, img1: torch.Tensor, img2: torch.Tensor, n_new: int) -> dict[str, Call]:
    """The peer's ``clip4idc_decode`` (from its visual memory of the pairs) and ``clip4idc_e2e`` (from the pixels)
    calls for (B, 3, H, W) images in [0, 1], resized to the peer's 224 px where they are smaller."""
    dtype = peer.clip.token_embedding.weight.dtype
    p1, p2 = img1.to(dtype), img2.to(dtype)
    if p1.shape[-1] != peer.image_size:  # a small preset: the same images, resized to the peer's 224 px
        p1, p2 = (F.interpolate(x, size=peer.image_size, mode="bilinear") for x in (p1, p2))
    with torch.inference_mode():
        peer_memory = peer.encode(p1, p2)  # (B, 100, 512)
    return {
        "clip4idc_decode": lambda: peer.decode(peer_memory, n_new),
        "clip4idc_e2e": lambda: peer.generate_ids(p1, p2, n_new),
    }


def _within(ctx: Callable[[], contextlib.AbstractContextManager], call: Call) -> Call:
    """``call`` run inside a fresh ``ctx()`` (the precision's autocast on CUDA) each time."""

    def run() -> torch.Tensor:
        with ctx():
            return call()

    return run


def _run_batch(
    model: NAMC,
    settings: BenchmarkSettings,
    device: torch.device,
    batch: int,
    gen: torch.Generator,
    matmul_flops: float | None,
    peer: CLIP4IDCPeer | None,
    short: Shortlist | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    optimised, naive = _decoders(model, settings, device, batch, gen, peer, short)
    eos_id = model.tokenizer.eos_id  # the real one: length_mode("fixed") hides it
    entries: list[dict[str, Any]] = []
    refs: list[dict[str, Any]] = []
    timed: dict[str, tuple[dict[str, Any], torch.Tensor]] = {}
    with length_mode(model, settings.length_mode):
        for mode in settings.modes:
            logger.info("inference: batch %d, %s", batch, mode)
            entry, ids, lengths = time_level(settings, device, batch, mode, optimised[mode], eos_id)
            if mode == "decode":
                entry["flops"] = flops_entry(model, short, lengths, entry["time_s"]["median"], matmul_flops)
            entries.append(entry)
            timed[mode] = (entry, ids)
        for ref in _NAIVE[settings.reference]:
            logger.info("reference decoder: batch %d, %s", batch, ref)
            against = _COMPARED_WITH[ref]
            opt, opt_ids = timed.get(against, (None, None))
            entry, ids = _time_reference(settings, device, batch, ref, naive[ref], eos_id, opt)
            if opt_ids is None:  # the optimised level was not timed: still compare the tokens
                opt_ids = optimised[against]()
            entry["tokens_match"] = bool(opt_ids.shape == ids.shape and torch.equal(opt_ids, ids))
            refs.append(entry)
        for level in _PEER[settings.reference] if peer is not None else ():
            logger.info("CLIP4IDC peer: batch %d, %s (interleaved with namc)", batch, level)
            with peer_length(peer, settings.length_mode):
                refs.append(time_peer(settings, device, batch, level, optimised[_COMPARED_WITH[level]], naive[level]))
    return entries, refs


@contextlib.contextmanager
def peer_length(peer: CLIP4IDCPeer, mode: str) -> Iterator[None]:
    """:func:`length_mode` for the peer."""
    saved = peer.eos_id
    if mode == "fixed":
        peer.eos_id = -1
    try:
        yield
    finally:
        peer.eos_id = saved


def time_peer(
    settings: BenchmarkSettings, device: torch.device, batch: int, level: str, ours: Call, theirs: Call
) -> dict[str, Any]:
    """One ``reference`` entry for a peer level: namc's and the peer's calls interleaved (``warmup`` untimed rounds,
    then ``reference_repeats`` timed rounds), the speed-up the ratio of the two medians of this loop."""
    ours_t: list[float] = []
    theirs_t: list[float] = []
    for i in range(settings.warmup + settings.reference_repeats):
        for fn, out in ((ours, ours_t), (theirs, theirs_t)):
            synchronize(device)
            start = time.perf_counter()
            ids = fn()
            synchronize(device)
            if i >= settings.warmup:
                out.append(time.perf_counter() - start)
    lengths = [settings.max_new_tokens] * batch if settings.length_mode == "fixed" else None
    if lengths is None:  # eos mode: the peer's own lengths (its [EOS] is CLIP's)
        lengths = generated_lengths(ids, EOS_ID, settings.max_new_tokens, "eos")
    tokens = sum(lengths)
    return {
        "batch_size": batch,
        "mode": level,
        "compared_with": _COMPARED_WITH[level],
        "length_mode": settings.length_mode,
        "max_new_tokens": settings.max_new_tokens,
        "tokens_per_call": tokens,
        "time_s": summarize(theirs_t),
        "tokens_per_s": summarize([tokens / t for t in theirs_t]),
        "speedup": statistics.median(theirs_t) / statistics.median(ours_t),
        "tokens_match": None,
        "namc_time_s": summarize(ours_t),
    }


def time_level(
    settings: BenchmarkSettings, device: torch.device, batch: int, mode: str, call: Call, eos_id: int
) -> tuple[dict[str, Any], torch.Tensor, list[int]]:
    """One ``inference`` entry (``flops`` left None), the ids of the last timed call and each row's length."""
    times, ids = time_calls(call, device, settings.warmup, settings.repeats)
    with peak_memory(device) as mem:
        call()
    lengths = generated_lengths(ids, eos_id, settings.max_new_tokens, settings.length_mode)
    tokens = sum(lengths)
    entry = {
        "batch_size": batch,
        "mode": mode,
        "length_mode": settings.length_mode,
        "max_new_tokens": settings.max_new_tokens,
        "tokens_per_call": tokens,
        "time_s": summarize(times),
        "tokens_per_s": summarize([tokens / t for t in times]),
        "pairs_per_s": summarize([batch / t for t in times]),
        "latency_s_per_pair": statistics.median(times) / batch,
        "peak_memory": mem,
        "flops": None,
    }
    return entry, ids, lengths


def flops_entry(
    model: NAMC, short: Shortlist | None, lengths: list[int], median_s: float, matmul_flops: float | None
) -> dict[str, Any]:
    """The decode FLOP efficiency of a ``decode`` call: analytic FLOPs per second over the matmul's FLOP/s (the
    vocabulary projection over the shortlist's rows where there is one)."""
    shape = fdg_shape(model)
    if short is not None:
        shape["vocab_size"] = len(short)
    fl = decoder_flops(**shape, lengths=lengths)
    achieved = fl["total"] / median_s
    return {
        "per_call": fl["total"],
        "prefill_per_call": fl["prefill"],
        "per_token_mean": fl["per_token_mean"],
        "achieved_per_s": achieved,
        "matmul_per_s": matmul_flops,
        "efficiency": achieved / matmul_flops if matmul_flops else None,
    }


def _time_reference(
    settings: BenchmarkSettings,
    device: torch.device,
    batch: int,
    ref: str,
    call: Call,
    eos_id: int,
    optimised: dict[str, Any] | None,
) -> tuple[dict[str, Any], torch.Tensor]:
    """One ``reference`` entry but ``tokens_match``, and the ids: the naive decoder ``ref`` (no warm-up) against
    the optimised level's entry (None when that level was not timed: no speed-up then)."""
    times, ids = time_calls(call, device, 0, settings.reference_repeats)
    lengths = generated_lengths(ids, eos_id, settings.max_new_tokens, settings.length_mode)
    tokens = sum(lengths)
    entry = {
        "batch_size": batch,
        "mode": ref,
        "compared_with": _COMPARED_WITH[ref],
        "length_mode": settings.length_mode,
        "max_new_tokens": settings.max_new_tokens,
        "tokens_per_call": tokens,
        "time_s": summarize(times),
        "tokens_per_s": summarize([tokens / t for t in times]),
        "speedup": statistics.median(times) / optimised["time_s"]["median"] if optimised else None,
        "namc_time_s": None,
    }
    return entry, ids
