"""The extension points: MIR fusion blocks (a registry), objectives over a NAMC, and per-sequence log-probabilities
(checked against hand computations)."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import namc
from namc import ops
from namc.data.collate import CaptionCollator
from namc.lit import FinetuneModule, PretrainModule
from namc.models import create_fusion, list_fusions, register_fusion
from namc.models.fdg import FDG, FDGConfig
from namc.models.mir import MIR, MIRConfig
from namc.objectives import finetune_step, optimizer_groups, sequence_logprob
from namc.objectives.optim import FINETUNE_LR, PRETRAIN_LR

TINY = dict(dim=32, heads=2, dropout=0.0, pretraining=False)


@register_fusion("test_difference")
class DifferenceFusion(nn.Module):
    """A fusion block of the test's own: FC over [x1; x2; x1 - x2]."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(3 * dim, dim)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.cat([x1, x2, x1 - x2], dim=-1))


@register_fusion("test_multi_scale")
class MeanOfLayers(nn.Module):
    """A multi-scale block: the mean over MIR's layers of (x1 + x2) / 2, then an FC; records what it was given."""

    multi_scale = True

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.seen: list[int] = []

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, layers: list[tuple[torch.Tensor, torch.Tensor]]):
        self.seen.append(len(layers))
        mean = torch.stack([(a + b) / 2 for a, b in layers]).mean(0)
        return self.proj(mean + (x1 + x2) / 2)


def _pair_batch(model: namc.NAMC, n: int = 4) -> dict:
    g = torch.Generator().manual_seed(0)
    items = [
        {
            "id": str(i),
            "image1": torch.rand(3, 64, 64, generator=g),
            "image2": torch.rand(3, 64, 64, generator=g),
            "captions": ["the red cube has moved"],
            "change_type": None,
        }
        for i in range(n)
    ]
    return CaptionCollator(model.tokenizer, model.config.max_caption_len)(items)


# ------------------------------------------------------------------------------------------------ fusion registry


def test_the_default_fusion_is_the_papers_fc_with_the_saved_parameter_names() -> None:
    assert "concat" in list_fusions()
    fuse = create_fusion("concat", 8)
    assert isinstance(fuse, nn.Linear) and fuse.weight.shape == (8, 16)
    assert sorted(n for n, _ in fuse.named_parameters()) == ["bias", "weight"]
    x1, x2 = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    assert torch.equal(fuse(x1, x2), F.linear(torch.cat([x1, x2], -1), fuse.weight, fuse.bias))
    model = namc.create_model("namc_tiny", **TINY)
    assert {"mir.fuse.weight", "mir.fuse.bias"} <= set(model.state_dict())


def test_unknown_and_duplicate_fusions_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown MIR fusion 'nope'"):
        namc.create_model("namc_tiny", fusion="nope", **TINY)
    with pytest.raises(ValueError, match="already registered"):
        register_fusion("concat")(DifferenceFusion)


def test_a_registered_fusion_trains_and_loads_strictly(tmp_path) -> None:
    torch.manual_seed(0)
    model = namc.create_model("namc_tiny", fusion="test_difference", **TINY)
    assert isinstance(model.mir.fuse, DifferenceFusion)
    batch = _pair_batch(model)
    loss = finetune_step(model, batch)["loss"]
    loss.backward()
    assert model.mir.fuse.proj.weight.grad is not None and model.mir.fuse.proj.weight.grad.abs().sum() > 0
    model.eval()
    ids = model.generate_ids(batch["image1"], batch["image2"], max_new_tokens=6)
    again = namc.from_pretrained(model.save_pretrained(tmp_path / "m"))
    assert again.config.fusion == "test_difference"
    assert torch.equal(again.generate_ids(batch["image1"], batch["image2"], max_new_tokens=6), ids)


def test_a_multi_scale_fusion_gets_every_layer() -> None:
    torch.manual_seed(0)
    model = namc.create_model("namc_tiny", fusion="test_multi_scale", mir_layers=3, **TINY)
    batch = _pair_batch(model, 2)
    finetune_step(model, batch)["loss"].backward()
    assert model.mir.fuse.seen == [3]
    _, weights = model.mir.interact(
        model.mir.embed(model.grid(batch["image1"])), model.mir.embed(model.grid(batch["image2"])), return_weights=True
    )
    assert len(weights) == 3 and weights[0]["cross"].shape[-1] == model.grid_size**2


def test_mir_and_fdg_are_built_from_small_configs() -> None:
    mir = MIR(MIRConfig(in_channels=16, num_positions=9, dim=8, heads=2, layers=1))
    assert mir.head is None and mir.text_proj is None and mir.pos.shape == (9, 8)
    fdg = FDG(FDGConfig(vocab_size=11, dim=8, heads=2, layers=1, max_len=6))
    assert fdg.tok.weight.shape == (11, 8) and fdg.max_len == 6 and fdg.lm_head is None


def test_return_weights_does_not_change_the_output() -> None:
    torch.manual_seed(0)
    mir = MIR(MIRConfig(in_channels=16, num_positions=9, dim=8, heads=2, layers=2, dropout=0.0))
    x1, x2 = torch.randn(2, 9, 8), torch.randn(2, 9, 8)
    m1 = torch.zeros(2, 9, dtype=torch.bool)
    m1[0, :3] = True
    plain = mir.interact(x1, x2, m1, None)
    with_weights, weights = mir.interact(x1, x2, m1, None, return_weights=True)
    torch.testing.assert_close(with_weights, plain, rtol=1e-5, atol=1e-6)
    assert weights[0]["self"][0, :, :, :3].abs().max() == 0  # masked cells of image 1 are never attended


# ------------------------------------------------------------------------------------------------ sequences


def test_first_index_and_next_token_targets_by_hand() -> None:
    ids = torch.tensor([[1, 5, 6, 2, 0, 0], [1, 7, 2, 9, 2, 0], [1, 5, 5, 5, 5, 5]])  # [BOS]=1 [EOS]=2 pad=0
    assert ops.first_index(ids, 2).tolist() == [3, 2, 5]  # absent: the last position
    inputs, targets = ops.next_token_targets(ids, eos_id=2)
    assert inputs.tolist() == [[1, 5, 6, 2, 0], [1, 7, 2, 9, 2], [1, 5, 5, 5, 5]]
    assert targets.tolist() == [[5, 6, 2, -100, -100], [7, 2, -100, -100, -100], [5, 5, 5, 5, 5]]
    ignore = torch.zeros_like(ids, dtype=torch.bool)
    ignore[0, 2] = True  # the 6 of row 0 is not a target
    _, targets = ops.next_token_targets(ids, eos_id=2, ignore=ignore)
    assert targets[0].tolist() == [5, -100, 2, -100, -100]
    assert ops.used_length(torch.tensor([[4, 0, 0], [4, 4, 0]]), 0) == 2


def test_sequence_logprobs_by_hand() -> None:
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.8, 0.1]], [[0.2, 0.2, 0.6], [0.3, 0.3, 0.4]]]))
    targets = torch.tensor([[0, 1], [2, -100]])
    expected = torch.tensor([math.log(0.5) + math.log(0.8), math.log(0.6)])
    torch.testing.assert_close(ops.sequence_logprobs(logits, targets), expected)
    torch.testing.assert_close(ops.sequence_logprobs(logits, targets, normalize=True), expected / torch.tensor([2, 1]))
    assert ops.token_logprobs(logits, targets)[1, 1] == 0


def test_sequence_logprob_of_the_model_matches_the_caption_loss() -> None:
    torch.manual_seed(0)
    model = namc.create_model("namc_tiny", **TINY).eval()
    batch = _pair_batch(model, 3)
    memory = model.encode_pair(batch["image1"], batch["image2"])
    ids = batch["caption"]
    logp = sequence_logprob(model, memory, ids)  # (B,)
    # by hand: log-softmax of FDG's logits at every target position up to and including [EOS]
    logits = model.fdg(ids[:, :-1], memory).log_softmax(-1).detach()
    hand = []
    for b in range(ids.shape[0]):
        row, total = ids[b].tolist(), 0.0
        for t in range(1, row.index(model.tokenizer.eos_id) + 1):
            total += float(logits[b, t - 1, row[t]])
        hand.append(total)
    torch.testing.assert_close(logp, torch.tensor(hand), rtol=1e-5, atol=1e-5)
    counts = (ids[:, 1:] != model.tokenizer.pad_id).sum(1)
    # the caption loss is the token-mean negative log-likelihood of the same targets
    loss = finetune_step(model, batch)["loss"]
    torch.testing.assert_close(loss, -logp.sum() / counts.sum(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sequence_logprob(model, memory, ids, normalize=True), logp / counts)
    logp.sum().backward()
    assert model.fdg.tok.weight.grad is not None  # differentiable, as preference training needs


# ------------------------------------------------------------------------------------------------ optimisation


def test_the_papers_learning_rates_are_stated_once() -> None:
    assert (PRETRAIN_LR["nim"].lr, PRETRAIN_LR["nim"].min_lr) == (1e-4, 1e-5)  # appendix F
    assert (PRETRAIN_LR["mir_fdg"].lr, PRETRAIN_LR["mir_fdg"].min_lr) == (3e-4, 1e-4)
    assert FINETUNE_LR["mir_fdg"].lr == 2e-4
    model = namc.create_model("namc_tiny", **TINY)  # no NIM: its group is left out
    groups = optimizer_groups(model.param_groups(), PRETRAIN_LR)
    assert [(g["name"], g["lr"]) for g in groups] == [("mir_fdg", 3e-4)]
    pre = inspect.signature(PretrainModule.__init__).parameters
    assert (pre["lr_nim"].default, pre["lr"].default, pre["min_lr"].default) == (1e-4, 3e-4, 1e-4)
    assert inspect.signature(FinetuneModule.__init__).parameters["lr"].default == 2e-4
