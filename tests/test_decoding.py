"""Fast decoding (namc.models.fdg) against the naive decoders: identical tokens, rows finishing at different steps,
KV cache vs no cache, beam search.

The ``trained`` fixture fits namc_tiny's FDG for a few dozen steps on 8 image pairs whose captions have 1..8 words,
so greedy decoding ends each row at a different step (checked in ``test_rows_finish_at_different_steps``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import namc
from namc.backends import onednn, step
from namc.backends.step import FusedFDG as FDG
from namc.backends.step import InplaceGELU as GELU
from namc.backends.step import attend_one
from namc.data.collate import pad_sequences
from namc.eval.throughput.baselines import generate_reference, generate_uncached
from namc.models.fdg import FDGConfig
from namc.models.layers import Block, residual

PAIRS = 8


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors decode fastest on one thread (and do not wait for a busy second core); restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained(one_thread):
    """(model, images_1, images_2, captions): namc_tiny whose FDG reproduces caption i (i + 1 words) for pair i."""
    torch.manual_seed(0)
    model = namc.create_model("namc_tiny", pretraining=False, dropout=0.0).eval()
    tok = model.tokenizer
    gen = torch.Generator().manual_seed(0)
    images_1 = torch.rand(PAIRS, 3, 64, 64, generator=gen)
    images_2 = torch.rand(PAIRS, 3, 64, 64, generator=gen)
    with torch.no_grad():
        memory = model.encode_pair(images_1, images_2)  # (P, N, D)
    # caption i is the first i + 1 words of one shared sentence: whether a row stops or goes on at a step depends on
    # its memory only, so a row decoded against another row's memory (or cache) gets the wrong length
    words = list(range(5, 5 + PAIRS))  # ids after the specials
    captions = [words[: i + 1] + [tok.eos_id] for i in range(PAIRS)]
    ids = pad_sequences([[tok.bos_id, *c] for c in captions], tok.pad_id)  # (P, T)
    inputs, targets = ids[:, :-1], ids[:, 1:].masked_fill(ids[:, 1:] == tok.pad_id, -100)
    opt = torch.optim.Adam(model.fdg.parameters(), lr=3e-3)  # at 1e-2 it stalled at loss 0.16 on an AMX CPU
    model.fdg.train()
    for _ in range(600):
        logits = model.fdg(inputs, memory)  # (P, T - 1, V)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        # stop once every row is learned with a margin
        learned = bool(((logits.argmax(-1) == targets) | (targets == -100)).all())
        if loss.item() < 1e-3 and learned:
            break
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    return model, images_1, images_2, captions


def _finish_steps(ids: torch.Tensor, eos_id: int) -> list[int]:
    """Step (1-based) at which each row produced [EOS]; 0 when it did not."""
    return [row.index(eos_id) + 1 if eos_id in row else 0 for row in ids.tolist()]


@pytest.mark.slow  # the module's fixture trains a model
def test_rows_finish_at_different_steps(trained):
    model, im1, im2, captions = trained
    ids = model.generate_ids(im1, im2, max_new_tokens=23)
    steps = _finish_steps(ids, model.tokenizer.eos_id)
    assert steps == [len(c) for c in captions]  # 2, 3, ..., 9: every row stops at its own step
    assert len(set(steps)) == PAIRS
    for row, cap in zip(ids.tolist(), captions):
        assert row[: len(cap)] == cap
        assert all(t == model.tokenizer.pad_id for t in row[len(cap) :])


@pytest.mark.slow  # the trained fixture
@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("max_new_tokens", [1, 4, 23])
def test_optimised_equals_reference_decoder(trained, batch, max_new_tokens):
    model, im1, im2, _ = trained
    # pairs 8 - batch ... 7: the longest captions, so with 4 tokens some rows finish and others are cut
    sl = slice(PAIRS - batch, PAIRS) if batch < PAIRS else slice(None)
    fast = model.generate_ids(im1[sl], im2[sl], max_new_tokens=max_new_tokens)
    naive = generate_reference(model, im1[sl], im2[sl], max_new_tokens=max_new_tokens)
    assert fast.shape[1] <= max_new_tokens
    assert torch.equal(fast, naive)


@pytest.mark.slow  # the trained fixture
def test_reference_equality_with_mixed_lengths_in_one_batch(trained):
    """A batch that drops finished rows several times (the decoder compacts once a quarter of the rows ended)."""
    model, im1, im2, captions = trained
    order = torch.tensor([7, 0, 5, 2, 6, 1, 4, 3])
    fast = model.generate_ids(im1[order], im2[order])
    assert torch.equal(fast, generate_reference(model, im1[order], im2[order]))
    assert _finish_steps(fast, model.tokenizer.eos_id) == [len(captions[i]) for i in order.tolist()]


@pytest.mark.slow  # the trained fixture
def test_cached_equals_uncached_on_trained_model(trained):
    model, im1, im2, _ = trained
    memory = model.encode_pair(im1, im2)
    assert torch.equal(model.fdg.generate(memory, 23), generate_uncached(model.fdg, memory, 23))


@pytest.mark.parametrize("batch", [1, 5])
@pytest.mark.parametrize("max_new_tokens", [1, 7, 23])
def test_cached_equals_uncached_full_length(one_thread, batch, max_new_tokens):
    """Random weights with [EOS] unreachable: every row decodes all steps through the cache."""
    torch.manual_seed(1)
    fdg = FDG(FDGConfig(vocab_size=50, dim=32, heads=4, layers=2, max_len=32, eos_id=-1, dropout=0.0)).eval()
    memory = torch.randn(batch, 9, 32)
    cached = fdg.generate(memory, max_new_tokens)
    assert cached.shape == (batch, max_new_tokens)  # no [EOS]: every step ran
    assert torch.equal(cached, generate_uncached(fdg, memory, max_new_tokens))


@pytest.mark.parametrize("seed", [1, 2])
def test_cached_equals_uncached_random_weights_with_eos(one_thread, seed):
    """Random weights, rows ending at scattered steps: the decoder drops finished rows (and re-indexes its caches)
    several times. The [EOS] id is picked after a full-length run as the token whose first occurrences are the
    most scattered over the rows, so that the rows stop at many different steps."""
    torch.manual_seed(seed)
    fdg = FDG(
        FDGConfig(vocab_size=8, dim=32, heads=4, layers=2, max_len=32, eos_id=-1, dropout=0.0, tie_embeddings=False)
    )
    fdg.eval()
    memory = torch.randn(16, 9, 32)
    full = fdg.generate(memory, 20)
    fdg.eos_id = max(range(3, 8), key=lambda e: len(set(_finish_steps(full, e))))
    cached = fdg.generate(memory, 20)
    finish = _finish_steps(cached, fdg.eos_id)
    assert len({s for s in finish if s}) >= 5 and 0 in finish  # many different ends, and rows that never end
    assert torch.equal(cached, generate_uncached(fdg, memory, 20))


def test_cached_equals_uncached_with_memory_mask(one_thread):
    torch.manual_seed(2)
    fdg = FDG(FDGConfig(vocab_size=40, dim=32, heads=4, layers=2, max_len=32, eos_id=-1, dropout=0.0)).eval()
    memory = torch.randn(4, 12, 32)
    mask = torch.rand(4, 12) > 0.5
    mask[:, 0] = True  # every row keeps a key
    masked = fdg.generate(memory, 10, memory_mask=mask)
    assert torch.equal(masked, generate_uncached(fdg, memory, 10, memory_mask=mask))
    assert not torch.equal(masked, fdg.generate(memory, 10))  # the mask matters


def test_fused_step_equals_module_step(one_thread):
    """Eval mode takes the fused step; train mode (dropout 0 here) runs the blocks' modules: same tokens."""
    torch.manual_seed(3)
    fdg = FDG(FDGConfig(vocab_size=60, dim=48, heads=4, layers=2, max_len=32, eos_id=-1, dropout=0.0))
    memory = torch.randn(3, 10, 48)
    fused = fdg.eval().generate(memory, 12)
    modules = fdg.train().generate(memory, 12)
    assert torch.equal(fused, modules)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attend_one_matches_scaled_dot_product_attention(dtype):
    """The one-query attention of the bf16 decoding step: SDPA's maths, masked keys get no weight."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(5, 3, n, 16, generator=g).to(dtype) for n in (1, 40, 40))
    mask = torch.rand(5, 1, 1, 40, generator=g) > 0.3
    mask[..., 0] = True
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
    got = attend_one(q, k, v, mask)
    assert got.dtype == dtype and got.shape == (5, 3, 1, 16)
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16 rounds the scores and the weights
    assert torch.allclose(got.double(), exact, atol=tol)
    v2 = v.masked_fill(~mask[:, :, 0, :, None], 1e3)  # values of masked keys must not leak in
    assert torch.equal(attend_one(q, k, v2, mask), got)
    assert torch.allclose(attend_one(q, k, v).double(), F.scaled_dot_product_attention(q, k, v).double(), atol=tol)


@pytest.mark.parametrize(
    ("dtype", "keys", "batched"),
    [(torch.float32, 196, False), (torch.bfloat16, 196, True), (torch.bfloat16, 6, False), (torch.bfloat16, 600, True)],
)
@pytest.mark.parametrize("amx", [False, True])
def test_attend_step_takes_the_batched_products_for_large_low_precision_attention(
    dtype, keys, batched, amx, monkeypatch
):
    """A decoding step's attention: bf16 from ONE_QUERY_FUSED_FLOPS up runs attend_one (the same values to the bit),
    smaller ones and fp32 PyTorch's fused kernel (the same to the bit too), and so does every size on a CPU with AMX,
    where the fused kernel runs its bf16 products on the tiles; either way SDPA's maths. The CPU's AMX is set here
    both ways (the kernels are real either way)."""
    monkeypatch.setattr(onednn, "_AMX_OK", amx)
    batched = batched and not amx
    g = torch.Generator().manual_seed(5)
    rows = 3 if keys != 600 else 1
    q, k, v = (torch.randn(rows, 12, n, 64, generator=g).to(dtype) for n in (1, keys, keys))
    mask = torch.rand(rows, 1, 1, keys, generator=g) > 0.2
    mask[..., 0] = True
    assert (4.0 * q.numel() * keys >= step.ONE_QUERY_FUSED_FLOPS) == (keys != 6)
    got = step.attend_step(q, k, v, mask)
    kernel = attend_one(q, k, v, mask) if batched else F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(got, kernel)
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
    assert torch.allclose(got.double(), exact, atol=1e-5 if dtype == torch.float32 else 2e-2)


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_dense_matches_linear(rows):
    """The generation-time linear (on one thread where the product is small) equals F.linear up to rounding."""
    x, w, b = torch.randn(rows, 1024), torch.randn(1024, 1024) / 32, torch.randn(1024)
    with torch.inference_mode():
        assert torch.allclose(onednn.dense(x, w, b), F.linear(x, w, b), atol=1e-4, rtol=1e-4)
        small = torch.randn(16, 1024)
        assert torch.allclose(onednn.dense(x, small), F.linear(x, small), atol=1e-5)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_in_place_at_inference_only(approximate):
    """An inference copy's GELU (InplaceGELU) overwrites its input where autograd is off and leaves it, with
    PyTorch's gradient, where autograd is on. In place it gives PyTorch's values to the bit: for a small tensor those
    of ATen's own kernel (PyTorch's with oneDNN off, which differ from oneDNN's in the last bit), for a large one
    PyTorch's default."""
    g = torch.Generator().manual_seed(5)
    act, ref = GELU(approximate), torch.nn.GELU(approximate)
    large = torch.randn(2, 100, 96, generator=g) * 3  # over GELU.SERIAL_NUMEL elements
    for x in (torch.randn(4, 7, 96, generator=g) * 3, large, large.bfloat16()):
        with torch.backends.mkldnn.flags(enabled=x.numel() > act.SERIAL_NUMEL):  # small: ATen's kernel
            want = ref(x)
        for mode in (torch.no_grad, torch.inference_mode):
            y = x.clone()
            with mode():
                out = act(y)
            assert out.data_ptr() == y.data_ptr() and torch.equal(out, want) and torch.equal(y, want)
    x = torch.randn(4, 7, 96, generator=g) * 3
    want = ref(x)
    leaf = x.clone().requires_grad_()
    out = act(leaf)
    assert torch.equal(leaf.detach(), x) and torch.equal(out.detach(), want)
    out.sum().backward()
    twin = x.clone().requires_grad_()
    ref(twin).sum().backward()
    assert torch.equal(leaf.grad, twin.grad)
    block = Block(32, 2)  # the model core's GELU is PyTorch's; an inference copy's decoder runs this one
    assert type(block.ffn[1]) is torch.nn.GELU and block.ffn[1].approximate == "none"


def test_residual_in_place_at_inference_only():
    """The blocks' residual addition writes into the sub-layer's output where autograd is off, else (or where the
    addition would promote the dtype or broadcast) it is PyTorch's ``x + h``."""
    g = torch.Generator().manual_seed(6)
    x, h = torch.randn(3, 5, 8, generator=g), torch.randn(3, 5, 8, generator=g)
    want = x + h
    with torch.inference_mode():
        x2, h2 = x.clone(), h.clone()
        out = residual(x2, h2)
        assert out.data_ptr() == h2.data_ptr() and torch.equal(out, want) and torch.equal(x2, x)
        half = h.bfloat16()
        assert torch.equal(residual(x, half), x + half) and residual(x, half).dtype == torch.float32
        row = h[:, :1].clone()
        assert torch.equal(residual(x, row), x + row) and torch.equal(row, h[:, :1])
    leaf = h.clone().requires_grad_()
    out = residual(x, leaf)
    assert out.data_ptr() != leaf.data_ptr() and torch.equal(out.detach(), want)
    out.sum().backward()
    assert torch.equal(leaf.grad, torch.ones_like(h))
    block = Block(8, 2).eval()
    y, ctx = torch.randn(2, 4, 8, generator=g), torch.randn(2, 6, 8, generator=g)
    with torch.backends.mkldnn.flags(enabled=False):  # GELU: ATen's kernel either way
        with torch.inference_mode():
            fast = block(y, ctx)
        with torch.enable_grad():
            assert torch.equal(block(y, ctx), fast)  # the out-of-place path, the same values to the bit


@pytest.mark.slow  # the trained fixture
def test_beam_size_one_equals_greedy(trained):
    model, im1, im2, _ = trained
    memory = model.encode_pair(im1, im2)
    # generate(num_beams=1) dispatches to greedy, so call the beam search itself with one beam
    with torch.inference_mode():
        beam = model.fdg._beam_search(memory, 23, 1, None, 1.0)
    assert torch.equal(beam, model.fdg.generate(memory, 23))


def test_beam_size_one_equals_greedy_random_weights(one_thread):
    torch.manual_seed(4)
    fdg = FDG(FDGConfig(vocab_size=30, dim=32, heads=4, layers=2, max_len=32, eos_id=2, dropout=0.0)).eval()
    memory = torch.randn(6, 9, 32)
    with torch.inference_mode():
        beam = fdg._beam_search(memory, 15, 1, None, 1.0)
    assert torch.equal(beam, fdg.generate(memory, 15))


@pytest.mark.slow  # the trained fixture
@pytest.mark.parametrize("num_beams", [2, 4])
def test_beam_search_returns_valid_sequences(trained, num_beams):
    model, im1, im2, captions = trained
    tok = model.tokenizer
    ids = model.generate_ids(im1, im2, max_new_tokens=23, num_beams=num_beams)
    assert ids.shape[0] == PAIRS and 1 <= ids.shape[1] <= 23
    assert ids.min() >= 0 and ids.max() < tok.vocab_size
    for row in ids.tolist():
        if tok.eos_id in row:
            end = row.index(tok.eos_id)
            assert all(t == tok.pad_id for t in row[end + 1 :])  # only padding after [EOS]
            assert tok.bos_id not in row and tok.pad_id not in row[:end]
    # the memorised captions are near-certain under the model: beam search finds them too
    assert ids.tolist() == model.generate_ids(im1, im2, max_new_tokens=23).tolist()
    assert _finish_steps(ids, tok.eos_id) == [len(c) for c in captions]


def test_beam_search_on_random_weights_is_well_formed(one_thread):
    torch.manual_seed(5)
    fdg = FDG(FDGConfig(vocab_size=30, dim=32, heads=4, layers=2, max_len=32, eos_id=2, dropout=0.0)).eval()
    memory = torch.randn(4, 9, 32)
    ids = fdg.generate(memory, 10, num_beams=3)
    assert ids.shape[0] == 4 and ids.shape[1] <= 10
    for row in ids.tolist():
        if 2 in row:
            assert all(t == fdg.pad_id for t in row[row.index(2) + 1 :])


def test_generate_rejects_more_tokens_than_positions():
    fdg = FDG(FDGConfig(vocab_size=20, dim=16, heads=2, layers=1, max_len=8)).eval()
    memory = torch.randn(1, 4, 16)
    with pytest.raises(ValueError, match="positions"):
        fdg.generate(memory, 8)
    with pytest.raises(ValueError, match="positions"):
        generate_uncached(fdg, memory, 8)
