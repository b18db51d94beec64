"""Decoding restricted to a shortlist of tokens (namc.models.shortlist): the greedy pick over the list's logits,
mapped back to the full vocabulary, on every path that decodes (eager fused step, the module step, beam search, an
int8 or bf16 copy, the static decoder), and the prepared vocabulary rows kept only while valid."""

from __future__ import annotations

import copy
import gc
import json
import pickle
import re
import weakref

import pytest
import torch

import namc
from namc.backends import onednn
from namc.backends.static_decode import StaticDecoder
from namc.backends.step import FusedFDG as FDG
from namc.backends.step import first_max_index, shortlist_head
from namc.models.fdg import FDGConfig
from namc.models.files import ConfigError
from namc.models.shortlist import SHORTLIST_FILE, Shortlist

V, D, EOS, PAD = 300, 32, 2, 0


def _fdg(eos_id: int = EOS) -> FDG:
    torch.manual_seed(5)
    config = FDGConfig(vocab_size=V, dim=D, heads=4, layers=2, max_len=16, eos_id=eos_id, pad_id=PAD, dropout=0.0)
    return FDG(config).eval()


def _memory(rows: int = 6) -> torch.Tensor:
    return torch.randn(rows, 5, D, generator=torch.Generator().manual_seed(1))


@torch.inference_mode()
def _reference(fdg: FDG, memory: torch.Tensor, ids: torch.Tensor, steps: int) -> torch.Tensor:
    """Greedy decoding from the teacher-forced logits of the whole prefix (no cache), the logits outside ``ids``
    masked: what a shortlist means, computed without any of the decoding paths under test."""
    B = memory.shape[0]
    allowed = torch.full((V,), float("-inf"))
    allowed[ids] = 0.0
    tokens = torch.full((B, 1), fdg.bos_id, dtype=torch.long)
    finished = torch.zeros(B, dtype=torch.bool)
    out = []
    for _ in range(steps):
        nxt = (fdg(tokens, memory)[:, -1] + allowed).argmax(-1).masked_fill(finished, PAD)
        out.append(nxt)
        finished |= nxt == EOS
        tokens = torch.cat([tokens, nxt[:, None]], 1)
        if bool(finished.all()):
            break
    out = torch.stack(out, 1)
    return out[:, : int((out != PAD).sum(1).max())]


def _shortlist(size: int = 40, seed: int = 0) -> Shortlist:
    ids = torch.randperm(V, generator=torch.Generator().manual_seed(seed))[:size]
    return Shortlist(ids, V, EOS)


def test_greedy_picks_the_best_listed_token_on_the_fused_and_the_module_step():
    fdg, memory = _fdg(), _memory()
    short = _shortlist()
    expected = _reference(fdg, memory, short.ids, 12)
    assert set(expected.unique().tolist()) <= set(short.ids.tolist()) | {PAD}
    assert not torch.equal(expected, _reference(fdg, memory, torch.arange(V), 12))  # the list changes the captions
    torch.testing.assert_close(fdg.generate(memory, 12, vocabulary=short), expected, rtol=0, atol=0)  # fused
    fdg.train()  # dropout 0: the module step, which takes the full logits' columns
    torch.testing.assert_close(fdg.generate(memory, 12, vocabulary=short), expected, rtol=0, atol=0)


def test_a_list_holding_the_full_vocabularys_picks_changes_nothing():
    fdg, memory = _fdg(), _memory()
    full = fdg.generate(memory, 12)
    listed = torch.cat([full.flatten(), _shortlist(20).ids])
    torch.testing.assert_close(fdg.generate(memory, 12, vocabulary=listed), full, rtol=0, atol=0)
    torch.testing.assert_close(fdg.generate(memory, 12, vocabulary=range(V)), full, rtol=0, atol=0)


@torch.inference_mode()
def test_int8_rows_are_the_full_projections_to_the_bit():
    fdg = _fdg()
    fdg.pack_step("int8")
    short = _shortlist()
    full = fdg.step_weights()[-1].vocab
    head = fdg.shortlisted(fdg.step_weights(), short)[-1].vocab
    x = torch.randn(7, D)
    assert torch.equal(onednn.dense(x, *head), onednn.dense(x, *full)[:, short.ids])
    memory = _memory()
    ids = fdg.generate(memory, 12)
    listed = torch.cat([ids.flatten(), short.ids])
    assert torch.equal(fdg.generate(memory, 12, vocabulary=listed), ids)


@pytest.mark.skipif(
    not (onednn.linear_available() and onednn.bf16_supported()), reason="needs oneDNN's linear kernels in bf16"
)
@torch.inference_mode()
def test_a_bf16_copy_projects_onto_prepacked_rows():
    fdg = _fdg().to(torch.bfloat16)  # as the bf16 inference copy (namc.backends.precision)
    fdg.pack_step("bf16")
    short = _shortlist()
    head = fdg.shortlisted(fdg.step_weights(), short)[-1].vocab
    assert onednn.is_packed(head[0])
    x = torch.randn(9, D, dtype=torch.bfloat16)
    full = onednn.dense(x, *fdg.step_weights()[-1].vocab)[:, short.ids].float()
    torch.testing.assert_close(onednn.dense(x, *head).float(), full, rtol=1e-2, atol=1e-2)
    out = fdg.generate(_memory().bfloat16(), 12, vocabulary=short)
    assert set(out.unique().tolist()) <= set(short.ids.tolist()) | {PAD}


def test_beam_search_stays_in_the_list_and_a_whole_list_changes_nothing():
    fdg, memory = _fdg(), _memory(3)
    short = _shortlist(15)
    out = fdg.generate(memory, 10, num_beams=3, vocabulary=short)
    assert set(out.unique().tolist()) <= set(short.ids.tolist()) | {PAD}
    full = fdg.generate(memory, 10, num_beams=3)
    torch.testing.assert_close(fdg.generate(memory, 10, num_beams=3, vocabulary=range(V)), full, rtol=0, atol=0)
    # one beam is greedy: the same as the greedy path over the same list
    torch.testing.assert_close(
        fdg.generate(memory, 10, num_beams=1, vocabulary=short), _reference(fdg, memory, short.ids, 10)
    )


def test_static_decoder_takes_the_list():
    fdg, memory = _fdg(), _memory()
    short = _shortlist()
    decode = StaticDecoder(fdg, 12, vocabulary=short)
    torch.testing.assert_close(decode(memory), fdg.generate(memory, 12, vocabulary=short), rtol=0, atol=0)


def test_prepared_rows_are_kept_until_the_matrix_changes():
    fdg = _fdg()
    short = _shortlist()
    first = shortlist_head(short, fdg.step_weights()[-1].vocab, fdg.tok.weight)
    assert shortlist_head(short, fdg.step_weights()[-1].vocab, fdg.tok.weight) is first
    with torch.no_grad():
        fdg.tok.weight.mul_(2.0)  # in place (an optimiser step): a new version
    again = shortlist_head(short, fdg.step_weights()[-1].vocab, fdg.tok.weight)
    assert again is not first
    torch.testing.assert_close(again[0], fdg.tok.weight[short.ids])
    twin = copy.deepcopy(fdg)
    twin.pack_step("int8")
    packed = shortlist_head(short, twin.step_weights()[-1].vocab, twin.tok.weight)
    assert shortlist_head(short, twin.step_weights()[-1].vocab, twin.tok.weight) is packed  # built once per copy
    gone = weakref.ref(twin.tok.weight)
    del twin
    gc.collect()
    assert gone() is None  # the list keeps its rows, not the copy's matrices


def test_bad_lists_are_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"shortlist id 300 is outside the vocabulary \[0, 300\)"):
        Shortlist([5, 300], V, EOS)
    with pytest.raises(ValueError, match="1-D integer token ids"):
        Shortlist(torch.tensor([1.0, 2.0]), V, EOS)
    with pytest.raises(ValueError, match="1-D integer token ids"):
        Shortlist(torch.tensor([[1, 2]]), V, EOS)
    short = Shortlist([9, 7, 9], V, EOS)
    assert short.ids.tolist() == [EOS, 7, 9] and len(short) == 3 and "3 of 300" in repr(short)
    fdg, memory = _fdg(), _memory(2)
    with pytest.raises(ValueError, match="built for a vocabulary of 301 ids, this model's has 300"):
        fdg.generate(memory, max_new_tokens=3, vocabulary=Shortlist([7, 9], V + 1, EOS))  # another model's list


def test_a_models_captions_make_its_shortlist():
    torch.manual_seed(0)
    model = namc.create_model("namc_tiny", pretraining=False).eval()
    tok = model.tokenizer
    words = tok.decode(list(range(5, 12))).split()
    short = model.shortlist([" ".join(words[:4]), " ".join(words[3:])])
    assert short.ids.tolist() == sorted({*range(5, 12), tok.eos_id})
    images = torch.rand(2, 3, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    for caption in model.generate(images[0], images[1], vocabulary=short):
        assert set(caption.split()) <= set(words)
    with pytest.raises(ValueError, match="no tokens"):
        model.shortlist(["", "  "])


def test_a_saved_model_keeps_its_training_shortlist(tmp_path, caplog: pytest.LogCaptureFixture):
    torch.manual_seed(0)
    model = namc.create_model("namc_tiny", pretraining=False).eval()
    assert model.training_shortlist is None
    model.save_pretrained(tmp_path / "none")
    assert not (tmp_path / "none" / SHORTLIST_FILE).exists()
    model.training_shortlist = model.shortlist(["the red cube moved", "a sphere appeared"])
    folder = model.save_pretrained(tmp_path / "m")
    again = namc.NAMC.from_pretrained(folder)
    assert again.training_shortlist.ids.tolist() == model.training_shortlist.ids.tolist()
    model.training_shortlist = None
    model.save_pretrained(folder)  # a save without a list removes the earlier one
    assert not (folder / SHORTLIST_FILE).exists()

    # copies share it (inference copies, deepcopy); a pickle carries the ids, not the prepared rows
    short = again.training_shortlist
    assert copy.deepcopy(again).training_shortlist is short
    namc.compile(again, "cpu", "int8").generate(*torch.rand(2, 1, 3, 64, 64), vocabulary=short)
    assert short._heads
    clone = pickle.loads(pickle.dumps(short))
    assert clone.ids.tolist() == short.ids.tolist() and not clone._heads

    # a damaged or foreign file: one error naming it (the digest check first, the content unchecked files)
    data = short.to_dict()
    bad = folder / SHORTLIST_FILE
    cases = [
        ({**data, "format": "x"}, "not a namc shortlist"),
        ({**data, "ids": [1, "2"]}, "'ids' must be a list of integer token ids"),
        ({**data, "vocab_size": 49409}, f"made for a vocabulary of 49409 ids; this model's has {data['vocab_size']}"),
        ({**data, "ids": [data["vocab_size"]]}, "is outside the vocabulary"),
    ]
    for content, message in cases:
        bad.write_text(json.dumps(content))
        with pytest.raises(ConfigError, match=re.escape(f"{bad}: ") + ".*" + re.escape(message)):
            namc.NAMC.from_pretrained(folder, verify=False)
    bad.write_bytes(b'{"ids": [\xff]}')
    with pytest.raises(ConfigError, match=re.escape(f"{bad}: not UTF-8")):
        namc.NAMC.from_pretrained(folder, verify=False)
    with caplog.at_level("WARNING"):  # a list config.json does not record (copied in after the save) is ignored
        assert namc.NAMC.from_pretrained(tmp_path / "none").training_shortlist is None
        bad.rename(tmp_path / "none" / SHORTLIST_FILE)
        assert namc.NAMC.from_pretrained(tmp_path / "none").training_shortlist is None
    assert "shortlist.json is not recorded in config.json: ignored" in caplog.text


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("columns", [49409, 8192, 5000])
def test_the_greedy_pick_is_maxs_first_index(dtype: torch.dtype, columns: int):
    """The pick (blocked for fp32) gives ``max``'s indices: ties (the first wins, across blocks and in the columns
    after the last whole block), NaNs (the first), rows of -inf, a row's largest in the last column, strided rows."""
    g = torch.Generator().manual_seed(columns)
    x = torch.randint(0, 40, (33, columns), generator=g).to(dtype)  # many ties in every row
    x[1], x[2], x[3] = float("-inf"), 0.0, float("-inf")
    x[3, -1] = 1.0  # the largest only in the columns after the last whole block
    x[4, -1] = 40.0  # strictly larger there
    x[5, 7], x[5, 3000] = float("nan"), float("nan")
    x[6, -1] = float("nan")
    x[7, 300], x[7, -1] = 40.0, 40.0  # a tie between a block and the last columns: the block's is first
    cases = [x, x[::2], x.unsqueeze(1).expand(33, 3, columns)[:, 1], torch.cat([x, x], 1)[:, 5 : 5 + columns]]
    for logits in cases:
        picked = first_max_index(logits)
        assert torch.equal(picked, logits.max(dim=-1).indices)
        assert torch.equal(picked, logits.float().nan_to_num(nan=float("inf")).argmax(dim=-1))
    assert torch.equal(first_max_index(x[:1]), x[:1].max(dim=-1).indices)  # one row: max itself
