"""Preference fine-tuning (ADPO, seed paper 003): the DPO loss and its gradient, the retriever (positives excluded,
REINFORCE), rule-made counterfactuals, and PreferenceModule on a tiny shapes world (frozen reference, checkpoints,
``namc fit --config configs/preference/shapes.yaml``)."""

from __future__ import annotations

import json
import logging
import math
import warnings
from pathlib import Path

import pytest
import torch

from namc.data.synthetic import generate_benchmark
from namc.data.synthetic.counterfactuals import attribute_edits, counterfactuals, event_edits, parse_caption
from namc.models import create_model, load_model
from namc.objectives.caption import sequence_logprob
from namc.objectives.preference import (
    dpo_loss,
    dpo_margin,
    dpo_reward,
    leave_one_out_baseline,
    preference_logprobs,
    reinforce_loss,
)
from namc.objectives.retriever import NegativeRetriever
from namc.text.tokenizer import WordTokenizer

warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")
logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "preference" / "shapes.yaml"
COLOURS = "gray red blue green brown purple cyan yellow rubber metal cube sphere cylinder small large"


# ------------------------------------------------------------------------------------------------ pure functions


def test_dpo_loss_is_ln2_when_the_policy_is_the_reference() -> None:
    lp = torch.randn(2, 5) * 10  # any log-probabilities
    margin = dpo_margin(lp[0], lp[1], lp[0], lp[1], beta=0.1)
    assert torch.equal(margin, torch.zeros(5))
    assert torch.allclose(dpo_loss(margin), torch.full((5,), math.log(2)))
    # the margin is beta times the difference of the two log-ratios (Eq. 2), checked by hand
    m = dpo_margin(torch.tensor([-3.0]), torch.tensor([-5.0]), torch.tensor([-4.0]), torch.tensor([-4.5]), 0.5)
    assert m.item() == pytest.approx(0.5 * (-3 + 4) - 0.5 * (-5 + 4.5))
    assert dpo_reward(m).item() == pytest.approx(-math.log(1 / (1 + math.exp(-m.item()))))


def test_dpo_gradient_raises_the_true_caption_and_lowers_the_negative() -> None:
    pos = torch.tensor([-7.0, -2.0], requires_grad=True)
    neg = torch.tensor([-6.0, -9.0], requires_grad=True)
    dpo_loss(dpo_margin(pos, neg, torch.tensor([-7.0, -3.0]), torch.tensor([-6.0, -8.0]), 0.1)).sum().backward()
    assert (pos.grad < 0).all() and (neg.grad > 0).all()  # descent raises log pi(T), lowers log pi(T')


def _tokenizer(texts: list[str]) -> WordTokenizer:
    return WordTokenizer.build([*texts, COLOURS])


def test_dpo_step_on_a_model_widens_the_margin() -> None:
    torch.manual_seed(0)
    texts = ["the small red metal cube changed to blue", "the small red metal cube changed to green"]
    tok = _tokenizer(texts)
    policy = create_model("namc_tiny", tokenizer=tok, pretraining=False, image_size=32, dim=32, heads=2, dropout=0.0)
    reference = create_model("namc_tiny", tokenizer=tok, pretraining=False, image_size=32, dim=32, heads=2, dropout=0.0)
    reference.load_state_dict(policy.state_dict())
    reference.eval().requires_grad_(False)
    ids = [torch.tensor([[tok.bos_id, *tok.encode(t), tok.eos_id]]) for t in texts]
    batch = {"image1": torch.rand(1, 3, 32, 32), "image2": torch.rand(1, 3, 32, 32), "caption": ids[0]}
    opt = torch.optim.SGD(policy.parameters(), lr=0.5)
    lp = preference_logprobs(policy, reference, batch, ids[1])
    loss = dpo_loss(dpo_margin(lp["policy_pos"], lp["policy_neg"], lp["ref_pos"], lp["ref_neg"], 1.0)).mean()
    assert loss.item() == pytest.approx(math.log(2), abs=1e-6)
    loss.backward()
    opt.step()
    with torch.no_grad():
        memory = policy.encode_pair(batch["image1"], batch["image2"])
        after = [sequence_logprob(policy, memory, i).item() for i in ids]
    assert after[0] - after[1] > lp["policy_pos"].item() - lp["policy_neg"].item()


# ------------------------------------------------------------------------------------------------ retriever


def test_retriever_never_samples_a_positive() -> None:
    torch.manual_seed(0)
    retriever = NegativeRetriever(vocab_size=20, memory_dim=8, dim=8, pad_id=0, tau=0.05)  # sharp: tempts the max
    memory = torch.randn(3, 4, 8)
    candidates = torch.randint(1, 20, (3, 6, 5))
    valid = torch.tensor([[1, 0, 1, 0, 1, 1], [0, 0, 0, 0, 0, 1], [1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    logits = retriever.logits(memory, candidates, valid)
    logits = logits.masked_fill(~valid, float("-inf"))
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        index, log_q, entropy = retriever.sample(logits, g)
        assert valid[torch.arange(3), index].all()
        assert torch.isfinite(log_q).all() and (entropy >= 0).all()
    with pytest.raises(ValueError, match="no valid negative"):
        retriever.logits(memory, candidates, torch.zeros(3, 6, dtype=torch.bool))


def test_negative_pool_excludes_every_positive() -> None:
    from namc.lit.negatives import NegativePool

    positives = {
        "a": ["the small red metal cube changed to blue", "the small red metal cube became blue"],
        "b": ["no change was made", "nothing has changed"],
        "c": ["the large cyan rubber sphere moved"],
        "d": ["the scene remains the same"],
    }
    tok = _tokenizer([c for caps in positives.values() for c in caps])
    g = torch.Generator().manual_seed(0)
    no_change = {*positives["b"], *positives["d"]}  # "no change" captions are true of every distractor pair
    for source in ("captions", "counterfactuals", "both"):
        pool = NegativePool(positives, tok, 32, source, num_candidates=8, interchangeable=["b", "d"])
        for _ in range(20):
            ids, valid, is_cf = pool.candidates(["a", "b", "c", "d"], g)
            assert ids.shape[:2] == (4, 8) and valid.any(dim=1).all()
            for b, pid in enumerate("abcd"):
                texts = {tok.decode(ids[b, k].tolist()) for k in range(8) if valid[b, k]}
                assert not texts & (no_change if pid in "bd" else set(positives[pid])), (source, pid, texts)
            assert not is_cf[1].any()  # a "no change" pair has no counterfactual: it falls back to captions
            assert is_cf[0].any() == (source != "captions")


def test_reinforce_moves_the_retriever_towards_higher_reward() -> None:
    torch.manual_seed(0)
    K = 8
    retriever = NegativeRetriever(vocab_size=30, memory_dim=16, dim=16, pad_id=0, tau=2.0)
    memory = torch.randn(1, 4, 16).expand(16, 4, 16)  # one pair, 16 Monte Carlo samples per step
    candidates = torch.arange(1, K + 1)[:, None].repeat(1, 3)[None].expand(16, K, 3)  # candidate k: the word k+1
    valid = torch.ones(16, K, dtype=torch.bool)
    reward_of = torch.zeros(K)
    reward_of[5] = 1.0  # candidate 5 is the hard negative: the only one with a reward
    opt = torch.optim.Adam(retriever.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)

    def prob() -> float:
        with torch.no_grad():
            return retriever.logits(memory[:1], candidates[:1], valid[:1]).softmax(-1)[0, 5].item()

    before = prob()
    for _ in range(60):
        index, log_q, _ = retriever.sample(retriever.logits(memory, candidates, valid), g)
        reward = reward_of[index]
        loss = reinforce_loss(log_q, reward, leave_one_out_baseline(reward))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert before < 0.3 and prob() > 0.8


def test_leave_one_out_baseline() -> None:
    r = torch.tensor([1.0, 2.0, 6.0])
    assert torch.allclose(leave_one_out_baseline(r), torch.tensor([4.0, 3.5, 1.5]))
    assert torch.equal(leave_one_out_baseline(torch.tensor([3.0])), torch.zeros(1))


# ------------------------------------------------------------------------------------------------ counterfactuals


def test_counterfactuals_edit_one_detail() -> None:
    cap = "the small red metal cube changed to blue"
    assert parse_caption(cap) == ("color", 0, "small red metal cube", "blue")
    assert attribute_edits(cap, "size") == ["the large red metal cube changed to blue"]
    assert attribute_edits(cap, "material") == ["the small red rubber cube changed to blue"]
    assert attribute_edits("there is a big shiny ball", "shape") == [
        "there is a big shiny cube",
        "there is a big shiny cylinder",
    ]
    events = event_edits(cap)
    assert events["direction"] == ["the small blue metal cube changed to red"]
    assert "the small red metal cube is missing" in events["change_type"]
    assert event_edits("the large cyan rubber sphere has been newly placed")["direction"] == [
        "the large cyan rubber sphere is missing"
    ]
    edits = counterfactuals(cap, positives=["the small red metal cube became blue"])
    texts = [t for _, t in edits]
    assert cap not in texts and len(texts) == len(set(texts))
    assert {k for k, _ in edits} == {"colour", "shape", "material", "size", "direction", "change_type"}
    assert counterfactuals("no change was made") == []


# ------------------------------------------------------------------------------------------------ the Lightning stage


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("pref")
    bench = root / "clevr_change"
    generate_benchmark(bench, 10, image_size=32, seed=0, n_captions=2, splits=(0.6, 0.2, 0.2))
    caps = json.loads((bench / "change_captions.json").read_text())
    nocaps = json.loads((bench / "no_change_captions.json").read_text())
    tok = _tokenizer([c for d in (caps, nocaps) for cs in d.values() for c in cs])
    torch.manual_seed(0)
    model = create_model("namc_tiny", tokenizer=tok, pretraining=False, image_size=32, dim=32, heads=2, dropout=0.0)
    model.save_pretrained(root / "finetuned")
    return {"root": root, "bench": bench, "model": root / "finetuned"}


def _cli_args(world: dict, negatives: str) -> list[str]:
    return [
        "--config",
        str(CONFIG),
        "--model.init_args.pretrained",
        str(world["model"]),
        "--model.init_args.negatives",
        negatives,
        "--model.init_args.num_candidates",
        "8",
        "--model.init_args.cache_grids",
        "false",
        "--data.init_args.root",
        str(world["bench"]),
        "--data.init_args.batch_size",
        "4",
        "--data.init_args.eval_batch_size",
        "4",
        "--trainer.max_steps",
        "3",
        "--trainer.limit_val_batches",
        "0",
        "--trainer.enable_progress_bar",
        "false",
    ]


@pytest.mark.parametrize("negatives", ["pool", "retriever"])
def test_training_leaves_the_reference_unchanged(world: dict, negatives: str, tmp_path, monkeypatch) -> None:
    from namc.lit.cli import run_lightning

    monkeypatch.chdir(tmp_path)  # the config writes under runs/preference_shapes
    cli = run_lightning(_cli_args(world, negatives) + ["--trainer.logger", "false"], run=False)
    module = cli.model
    start = {k: v.clone() for k, v in load_model(world["model"]).state_dict().items()}
    cli.trainer.fit(module, datamodule=cli.datamodule)
    ref = module.reference.state_dict()
    assert all(torch.equal(ref[k], v) for k, v in start.items())
    assert not any(p.requires_grad for p in module.reference.parameters()) and not module.reference.training
    policy = module.model.state_dict()
    assert any(not torch.equal(policy[k], v) for k, v in start.items())  # the policy did train
    metrics = cli.trainer.callback_metrics
    for key in ("train/dpo", "train/margin", "train/reward", "train/pref_acc", "train/entropy"):
        assert key in metrics
    # the first step saw policy == reference: the mean entropy of a uniform pool of 8 is log 8
    if negatives == "pool":
        assert metrics["train/entropy"].item() == pytest.approx(math.log(8), abs=1e-5)


@pytest.mark.slow
def test_namc_fit_preference_config_runs_and_saves_the_reference_once(world: dict, tmp_path, monkeypatch) -> None:
    from namc.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["fit", *_cli_args(world, "retriever")]) == 0
    ckpt = tmp_path / "runs" / "preference_shapes" / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    keys = set(state["state_dict"])
    n_model = len(load_model(world["model"]).state_dict())
    assert sum(k.startswith("model.") for k in keys) == n_model
    assert {k.split(".")[0] for k in keys} == {"model", "retriever"}  # no second copy of the network
    assert len(state["namc_preference"]["reference_sha256"]) == 64
    exported = load_model(tmp_path / "runs" / "preference_shapes" / "model")  # strict load of the trained policy
    assert exported.config.name == "namc_tiny"
    assert load_model(ckpt).training_shortlist.ids.tolist() == exported.training_shortlist.ids.tolist()  # strict
    assert len(exported.training_shortlist) > 5  # this data's training captions' tokens, kept by both


@pytest.mark.slow  # two spawned processes: about 20 s alone (the single-process tests above cover the step)
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_preference_trains_under_ddp(world: dict, tmp_path) -> None:
    """Two CPU processes (``ddp_spawn``, gloo): every trainable parameter, the retriever's included, gets a gradient
    at every step (plain DDP fails otherwise), and the reference stays out of DDP."""
    import lightning.pytorch as pl

    from namc.lit import PreferenceModule
    from namc.lit.datamodules import BenchmarkDataModule

    dm = BenchmarkDataModule(
        "clevr_change",
        str(world["bench"]),
        batch_size=2,
        num_workers=0,
        image_size=32,
        tokenizer=str(world["model"]),
        max_caption_len=64,
    )
    module = PreferenceModule(str(world["model"]), tokenizer=dm.caption_tokenizer, num_candidates=8, seed=0)
    start = {k: v.clone() for k, v in module.retriever.state_dict().items()}
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_steps=2,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(module, datamodule=dm)  # ddp_spawn copies rank 0's weights back into this process's module
    assert any(not torch.equal(module.retriever.state_dict()[k], v) for k, v in start.items())
    ref = load_model(world["model"]).state_dict()
    assert all(torch.equal(module.reference.state_dict()[k], v) for k, v in ref.items())
