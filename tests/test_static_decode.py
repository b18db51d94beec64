"""Fixed-shape greedy decoding (namc.backends.static_decode) against FDG.generate: the same ids with rows ending at
scattered steps, a memory mask, the bf16 and int8 copies, buffers kept per shape; the CUDA graph where a GPU is."""

from __future__ import annotations

import pytest
import torch

import namc
from namc.backends import onednn
from namc.backends import step as fdg_module
from namc.backends.precision import inference_copy
from namc.backends.static_decode import StaticDecoder, StaticKVCache
from namc.backends.step import FusedFDG as FDG
from namc.models.fdg import FDGConfig


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _fdg(seed: int, vocab: int = 50, eos_id: int = -1, tie: bool = True) -> FDG:
    torch.manual_seed(seed)
    config = FDGConfig(vocab_size=vocab, dim=32, heads=4, layers=2, max_len=32, eos_id=eos_id, dropout=0.0)
    return FDG(config if tie else FDGConfig(**{**config.__dict__, "tie_embeddings": False})).eval()


@pytest.mark.parametrize("batch", [1, 5])
@pytest.mark.parametrize("max_new_tokens", [1, 7, 23])
def test_full_length_equals_generate(batch, max_new_tokens):
    fdg = _fdg(1)
    memory = torch.randn(batch, 9, 32)
    static = StaticDecoder(fdg, max_new_tokens)(memory)
    assert static.shape == (batch, max_new_tokens)
    assert torch.equal(static, fdg.generate(memory, max_new_tokens))


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("check_every", [1, 4])
def test_rows_ending_at_scattered_steps(seed, check_every):
    """The [EOS] id is the token whose first occurrences are the most scattered over the rows of a full-length run:
    FDG.generate drops finished rows several times, the static decoder keeps them and writes padding."""
    fdg = _fdg(seed, vocab=8, tie=False)
    memory = torch.randn(16, 9, 32)
    full = fdg.generate(memory, 20)

    def first(eos: int) -> list[int]:
        return [row.index(eos) + 1 if eos in row else 0 for row in full.tolist()]

    fdg.eos_id = max(range(3, 8), key=lambda e: len(set(first(e))))
    expected = fdg.generate(memory, 20)
    assert len(set(first(fdg.eos_id))) >= 5
    assert torch.equal(StaticDecoder(fdg, 20, check_every=check_every)(memory), expected)


def test_stops_once_every_row_ended():
    """Every row ends at the first step: one look at the flags after ``check_every`` steps stops the loop, and the
    ids are [EOS] then nothing."""
    fdg = _fdg(3)
    memory = torch.randn(1, 9, 32).expand(4, -1, -1).contiguous()  # one row four times: the same first token
    fdg.eos_id = int(fdg.generate(memory, 1)[0, 0])
    decoder = StaticDecoder(fdg, 23, check_every=2)
    calls = []
    step = decoder._step
    decoder._step = lambda s: (calls.append(1), step(s))
    ids = decoder(memory)
    assert ids.tolist() == [[fdg.eos_id]] * 4
    assert len(calls) == 2  # stopped at the first look


def test_memory_mask():
    fdg = _fdg(2, vocab=40)
    memory = torch.randn(4, 12, 32)
    mask = torch.rand(4, 12) > 0.5
    mask[:, 0] = True
    decoder = StaticDecoder(fdg, 10)
    masked = decoder(memory, mask)
    assert torch.equal(masked, fdg.generate(memory, 10, memory_mask=mask))
    assert torch.equal(decoder(memory), fdg.generate(memory, 10))  # a second shape: no mask
    assert not torch.equal(masked, decoder(memory))


def test_buffers_are_kept_per_shape():
    fdg = _fdg(4)
    decoder = StaticDecoder(fdg, 6, max_shapes=2)
    a, b = torch.randn(3, 9, 32), torch.randn(3, 9, 32)
    ids_a = decoder(a)
    state = next(iter(decoder._states.values()))
    assert torch.equal(decoder(b), fdg.generate(b, 6))  # the same buffers, refilled: nothing left from ``a``
    assert torch.equal(decoder(a), ids_a)
    assert list(decoder._states.values()) == [state]
    decoder(torch.randn(5, 9, 32))
    decoder(torch.randn(3, 7, 32))
    assert len(decoder._states) == 2 and state not in decoder._states.values()  # the oldest shape left


def test_rebuilt_after_the_weights_change():
    """An optimiser step changes the matrices the step reads (the stacked q/k/v is a copy): the decoder rebuilds."""
    fdg = _fdg(7)
    memory = torch.randn(3, 9, 32)
    decoder = StaticDecoder(fdg, 8)
    before = decoder(memory)
    state = next(iter(decoder._states.values()))
    assert torch.equal(decoder(memory), before) and next(iter(decoder._states.values())) is state
    opt = torch.optim.SGD(fdg.parameters(), lr=1.0)
    fdg.train()
    fdg(torch.full((3, 4), fdg.bos_id), memory).logsumexp(-1).sum().backward()
    opt.step()
    fdg.eval()
    after = fdg.generate(memory, 8)
    assert not torch.equal(after, before)  # the step changed the ids
    assert torch.equal(decoder(memory), after)
    assert next(iter(decoder._states.values())) is not state


@pytest.mark.parametrize("precision", ["bf16", "int8"])
@pytest.mark.parametrize("batch", [2, 32])
def test_precision_copies(precision, batch, monkeypatch):
    """The copies' own matrices (prepacked bf16, dynamic int8) and, at batch 32 (the threshold lowered to its
    memory), the int8 copy's bf16 cross keys / values read by two batched products; [EOS] out of reach, so
    FDG.generate keeps every row too."""
    torch.manual_seed(5)
    model = namc.create_model("namc_tiny", pretraining=False, dropout=0.0).eval()
    copy = inference_copy(model, precision)
    copy.fdg.eos_id = -1
    memory = torch.randn(batch, model.grid_size**2, model.config.dim)
    monkeypatch.setattr(fdg_module, "CROSS_KV_BF16_MIN", 32 * memory[0].numel())
    with torch.inference_mode():
        if precision == "int8" and onednn.bf16_supported():  # with AMX the prefill is bf16 at any size (pack_step)
            amx = isinstance(copy.fdg.blocks[0].cross_attn.kv, onednn.OneDNNLinear)
            assert copy.fdg.cross_kv(memory)[0][0].dtype == (torch.bfloat16 if batch == 32 or amx else torch.float32)
        assert torch.equal(StaticDecoder(copy.fdg, 12)(memory), copy.fdg.generate(memory, 12))
        if precision == "bf16" and onednn.bf16_supported():  # the copy's MIR writes bf16 memory (fp32 where oneDNN
            # has no bf16: an AVX2-only CPU); namc_tiny's decoder layers stay fp32 (2^17)
            memory = copy.mir.interact(memory.bfloat16(), memory.bfloat16())
            assert memory.dtype == torch.bfloat16
            assert torch.equal(StaticDecoder(copy.fdg, 12)(memory), copy.fdg.generate(memory, 12))


def test_refusals():
    fdg = _fdg(1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        StaticDecoder(fdg, 33)
    with pytest.raises(ValueError, match="CUDA device"):
        StaticDecoder(fdg, 5, graph=True)(torch.randn(1, 9, 32))
    with pytest.raises(ValueError, match=r"memory must be \(B, N, 32\), got \(9, 32\)"):
        StaticDecoder(fdg, 5)(torch.randn(9, 32))
    with pytest.raises(ValueError, match="memory_mask must be"):
        StaticDecoder(fdg, 5)(torch.randn(2, 9, 32), torch.ones(2, 8, dtype=torch.bool))
    with pytest.raises(RuntimeError, match="eval"):
        StaticDecoder(fdg.train(), 5)(torch.randn(1, 9, 32))
    cache = StaticKVCache(1, 4, 5, 8, torch.zeros(1, dtype=torch.long), torch.float32)
    with pytest.raises(NotImplementedError, match="keeps its rows"):
        cache.select(torch.zeros(1, dtype=torch.long))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "autocast"])
def test_cuda_graph_equals_eager(dtype):
    """The graph replays the eager step: a model in fp32 or bf16, or fp32 under bf16 autocast (captured with the
    cast cache off); rows ending at different steps."""
    amp = dtype == "autocast"
    dtype = torch.float32 if amp else dtype
    fdg = _fdg(6, vocab=8, tie=False).to("cuda", dtype)
    memory = torch.randn(64, 9, 32, device="cuda", dtype=dtype)
    fdg.eos_id = 5
    with torch.autocast("cuda", torch.bfloat16, enabled=amp):
        eager = StaticDecoder(fdg, 20, graph=False)(memory)
        graphed = StaticDecoder(fdg, 20)
        assert torch.equal(graphed(memory), eager)
        assert torch.equal(graphed(memory), eager)  # replayed on the same graph
        other = torch.randn_like(memory)
        assert torch.equal(graphed(other), StaticDecoder(fdg, 20, graph=False)(other))
    assert next(iter(graphed._states.values())).graph is not None
