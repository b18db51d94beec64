"""namc_tiny end to end: pre-training step, gradients, overfitting, attention masking, persistence, registry."""

import json

import open_clip
import pytest
import torch

import namc
from namc.data.collate import CaptionCollator, PretrainCollator
from namc.models import NAMC, load_model
from namc.models.encoders import ClipDualEncoder
from namc.models.io import WeightsError, checkpoint_entry, load_strict
from namc.models.skip_init import skip_random_init
from namc.objectives import finetune_step, pretrain_step
from namc.text.tokenizer import ClipBPETokenizer, WordTokenizer, load_tokenizer

COLORS = ["red", "blue", "green", "gray", "cyan", "purple", "brown", "yellow"]


def _items(n: int, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    items = []
    for i in range(n):
        c1, c2 = COLORS[i % 8], COLORS[(i + 3) % 8]
        items.append(
            dict(
                id=str(i),
                image1=torch.rand(3, 64, 64, generator=g),
                image2=torch.rand(3, 64, 64, generator=g),
                verb1="shows",
                desc1=f"a small {c1} metal cube left of a large gray rubber sphere",
                verb2="depicts",
                desc2=f"a small {c2} metal cube left of a large gray rubber sphere",
                noise1=[0] * 12,
                noise2=[0] * 11 + [1],
            )
        )
    return items


@pytest.fixture(scope="module")
def tokenizer():
    texts = [f"{it['desc1']} {it['desc2']} shows depicts" for it in _items(8)]
    texts.append("the difference between the two images is that first image , while second . changed to")
    return WordTokenizer.build(texts)


@pytest.fixture()
def model(tokenizer):
    torch.manual_seed(0)
    return namc.create_model("namc_tiny", tokenizer=tokenizer)


@pytest.fixture(scope="module")
def batch(tokenizer):
    return PretrainCollator(tokenizer, max_text_len=48, max_caption_len=64)(_items(8))


def test_registry_lists_and_rejects_unknown():
    assert {"namc_base", "namc_tiny"} <= set(namc.list_models())
    assert namc.list_models("*tiny") == ["namc_tiny"]
    with pytest.raises(ValueError, match="unknown model"):
        namc.create_model("namc_huge")
    with pytest.raises(ValueError, match="unknown overrides"):
        namc.create_model("namc_tiny", dimm=3)
    with pytest.raises(ValueError, match="unknown tokenizer kind 'clip-bpe'"):  # not silently the word vocabulary
        namc.create_model("namc_tiny", tokenizer="clip-bpe")


def test_three_grids_must_agree():
    with pytest.raises(ValueError, match="share one grid"):
        namc.create_model("namc_tiny", image_size=128, grid_out_index=3)
    with pytest.raises(ValueError, match="CLIP image tower has 64 patch positions .* 72 px has 9 x 9"):
        namc.create_model("namc_tiny", image_size=72)  # three 9 x 9 grids, but NIM's tower was built for 8 x 8
    namc.create_model("namc_tiny", image_size=72, pretraining=False)  # no NIM: any size with agreeing grids


def test_base_config_is_the_paper():
    cfg = namc.model_config("namc_base")
    assert (cfg.image_size, cfg.dim, cfg.heads, cfg.mir_layers, cfg.fdg_layers) == (224, 768, 12, 2, 2)  # appx. F
    assert (cfg.p_img, cfg.p_txt, cfg.max_new_tokens, cfg.vqgan_n_embed) == (0.2, 0.15, 23, 16384)


def test_pretrain_step_losses_and_gradients(model, batch):
    model.train()
    out = pretrain_step(model, batch, generator=torch.Generator().manual_seed(0))
    for key in ("loss", "nim", "mir", "fdg"):
        assert torch.isfinite(out[key]), key
        assert out[key] > 0, key
    assert 0.05 < out["img_mask_frac"] < 0.4
    out["loss"].backward()
    frozen = {n for n, _ in model.named_parameters() if n.startswith(("grid.", "vqgan."))}
    assert frozen, "the ResNet grid and the VQGAN must be part of the model"
    for name, p in model.named_parameters():
        if name in frozen:
            assert not p.requires_grad and p.grad is None, name
        elif name == "nim.clip.logit_scale":
            assert not p.requires_grad
        else:
            assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient reached {name}"
    assert not model.grid.training and not model.vqgan.training  # frozen parts stay in eval mode


@pytest.mark.slow  # 40 training steps
def test_overfit_one_batch(model, batch):
    torch.manual_seed(0)
    batch = dict(batch, codes1=model.vqgan(batch["image1"]), codes2=model.vqgan(batch["image2"]))  # precomputed
    opt = torch.optim.Adam([p for g in model.param_groups().values() for p in g], lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    model.train()
    losses = []
    for _ in range(40):
        out = pretrain_step(model, batch, generator=gen)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        losses.append(out["loss"].item())
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < 0.6 * first, (first, last)


def test_masks_are_reproducible(model, batch):
    images = torch.cat([batch["image1"], batch["image2"]])
    text = torch.cat([batch["desc1"], batch["desc2"]])
    a = model.noise_masks(images, text, torch.Generator().manual_seed(3))
    b = model.noise_masks(images, text, torch.Generator().manual_seed(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    words, _ = model.text_masks(text)
    assert not a[1][~words].any()  # [SOS], [EOS] and padding are never masked


def test_denoised_caption_uses_mask_token(model, batch, tokenizer):
    # caption_src points at the description token each caption word copies
    for half in ("1", "2"):
        src, desc = batch["caption_src" + half], batch["desc" + half]
        hit = src >= 0
        assert hit.any()
        assert torch.equal(batch["caption"][hit], desc.gather(1, src.clamp_min(0))[hit])


@pytest.mark.parametrize(
    "ablation",
    [
        dict(nim_loss="infonce"),
        dict(rec_loss="l2"),
        dict(masking="random"),
        dict(use_nim=False),
        dict(use_mir=False, denoised_text=False),
    ],
)
def test_ablations_run(tokenizer, batch, ablation):
    m = namc.create_model("namc_tiny", tokenizer=tokenizer, **ablation)
    out = pretrain_step(m, batch, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(out["loss"])
    if ablation.get("use_nim") is False:
        assert out["nim"] == 0
    if ablation.get("use_mir") is False:
        assert out["mir"] == 0


@pytest.mark.parametrize("rec_loss", ["l1", "l2"])
def test_regression_target_is_fixed_when_the_grid_trains(tokenizer, batch, rec_loss):
    """Table 7's L1 / L2 reconstruction regresses onto the grid features X: with a trainable grid encoder, no
    gradient may reach it through the target (only through MIR's input)."""
    from namc.objectives.pretrain import mir_term

    m = namc.create_model("namc_tiny", tokenizer=tokenizer, grid_trainable=True, rec_loss=rec_loss).train()
    images = torch.cat([batch["image1"], batch["image2"]])
    text = torch.cat([batch["desc1"], batch["desc2"]])
    _, real = m.text_masks(text)
    img_mask, _ = m.noise_masks(images, text, torch.Generator().manual_seed(0))
    _, txt_tok = m.nim.encode_text(text, tokenizer.eos_id)
    grid = m.grid(images)
    assert grid.requires_grad
    x = m.mir.embed(grid.detach(), img_mask)  # MIR's input cut: what reaches the grid now came through the target
    loss = mir_term(m, x, grid, images, img_mask, txt_tok.detach(), real, None)
    loss.backward()
    assert loss > 0 and all(p.grad is None for p in m.grid.parameters())


def test_coattention_never_attends_masked_positions(model):
    model.eval()
    B, N, D = 2, model.grid_size**2, model.config.dim
    x1, x2 = torch.randn(B, N, D), torch.randn(B, N, D)
    m1 = torch.rand(B, N, generator=torch.Generator().manual_seed(0)) < 0.3
    m2 = torch.rand(B, N, generator=torch.Generator().manual_seed(1)) < 0.3
    fused, weights = model.mir.interact(x1, x2, m1, m2, return_weights=True)
    keys_self = torch.cat([m1, m2])  # (2B, N): stream rows 0..B-1 are image 1
    keys_cross = torch.cat([m2, m1])  # stream 1 reads image 2 and back
    for layer in weights:
        w_self, w_cross = layer["self"], layer["cross"]  # (2B, H, N, N)
        assert w_self.shape == (2 * B, model.config.heads, N, N)
        assert w_self.masked_select(keys_self[:, None, None, :].expand_as(w_self)).abs().max() == 0
        assert w_cross.masked_select(keys_cross[:, None, None, :].expand_as(w_cross)).abs().max() == 0
        torch.testing.assert_close(w_self.sum(-1), torch.ones_like(w_self.sum(-1)))
    # the weights path and the fast (SDPA) path agree
    torch.testing.assert_close(fused, model.mir.interact(x1, x2, m1, m2), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("fusion", ["concat", "difference", "mdp"])
def test_fused_memory_never_reads_masked_content(tokenizer, fusion):
    """Section 3.2.2: masked positions are never attended, fusion included. New content at the masked positions
    (another e_M) leaves E_MIR unchanged wherever both images are unmasked, and at those positions only."""
    m = namc.create_model("namc_tiny", tokenizer=tokenizer, fusion=fusion).eval()
    B, N = 4, m.grid_size**2
    g = torch.Generator().manual_seed(1)
    grid = torch.randn(2 * B, N, m.grid.out_channels, generator=g)
    mask = torch.rand(2 * B, N, generator=g) < 0.3
    with torch.no_grad():
        before = m.mir.interact(*m.mir.embed(grid, mask).chunk(2), mask[:B], mask[B:])
        m.mir.e_m.add_(torch.randn(m.mir.e_m.shape, generator=g))
        after = m.mir.interact(*m.mir.embed(grid, mask).chunk(2), mask[:B], mask[B:])
    clean = ~mask[:B] & ~mask[B:]
    assert clean.any() and (~clean).any()
    torch.testing.assert_close(after[clean], before[clean], atol=1e-6, rtol=1e-5)
    assert (after[~clean] - before[~clean]).abs().amax(-1).min() > 0


def test_difference_fusion_is_med_eq7_and_runs_in_int8(tokenizer):
    """MED's Eq. 7 as MIR's fusion: E_MIR is an FC of the co-attended streams' difference (identical streams give the
    bias alone at every position), it saves and loads, and the int8 copy quantises it as the concat FC."""
    from namc.backends.precision import inference_copy, mir_in_bf16
    from namc.backends.qlinear import Int8DifferenceFusion
    from namc.models.fusion import DifferenceFusion

    m = namc.create_model("namc_tiny", tokenizer=tokenizer, fusion="difference").eval()
    fuse = m.mir.fuse
    assert isinstance(fuse, DifferenceFusion) and fuse.weight.shape == (m.config.dim, m.config.dim)
    g = torch.Generator().manual_seed(2)
    y1, y2 = torch.randn(2, 2, 5, m.config.dim, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(fuse(y1, y2), (y1 - y2) @ fuse.weight.T + fuse.bias)
        assert torch.equal(fuse(y1, y1), fuse.bias.expand_as(y1))
    int8 = inference_copy(m, "int8")
    if not mir_in_bf16(m.mir, int8=True):  # on AMX the int8 copy runs MIR in bf16
        assert isinstance(int8.mir.fuse, Int8DifferenceFusion)
    x = torch.rand(2, 3, 64, 64, generator=g)
    assert int8.fdg.generate(int8.encode_pair(x, x.flip(0)), 4).shape[0] == 2


def test_generate_checks_its_inputs(model):
    model.eval()
    x = torch.rand(2, 3, 64, 64)
    for runner in (model, namc.compile(model, "cpu", "int8")):  # int8 must not broadcast (2, 1) against (1, 2)
        with pytest.raises(ValueError, match="different numbers of pairs"):
            runner.generate(x, x[:1])
        assert runner.generate(x[:0], x[:0]) == []
    with pytest.raises(ValueError, match=r"images_2 must be \(B, 3, 64, 64\) for this model, got \(2, 3, 32, 32\)"):
        model.generate(x, torch.rand(2, 3, 32, 32))
    with pytest.raises(ValueError, match="floats in \\[0, 1\\], got torch.uint8"):
        model.generate((x * 255).to(torch.uint8), x)
    with pytest.raises(ValueError, match="at least 1"):
        model.generate(x, x, max_new_tokens=0)
    with pytest.raises(ValueError, match="at least 1"):
        model.generate(x, x, num_beams=0)
    assert model.generate(x.double(), x, max_new_tokens=3) == model.generate(x, x, max_new_tokens=3)


def test_finetune_step_and_generate(model, tokenizer):
    items = [
        dict(
            id=str(i),
            image1=torch.rand(3, 64, 64),
            image2=torch.rand(3, 64, 64),
            captions=["the small red cube changed to blue", "someone changed the cube"],
        )
        for i in range(4)
    ]
    b = CaptionCollator(tokenizer, max_caption_len=32)(items)
    model.drop_pretraining_modules().train()
    out = finetune_step(model, b)
    out["loss"].backward()
    assert torch.isfinite(out["loss"])
    assert model.nim is None and model.vqgan is None
    model.eval()
    caps = model.generate(b["image1"], b["image2"], max_new_tokens=5)
    assert len(caps) == 4 and all(isinstance(c, str) for c in caps)
    caps_beam = model.generate(b["image1"], b["image2"], max_new_tokens=5, num_beams=3)
    assert len(caps_beam) == 4


@pytest.mark.parametrize("pretraining", [True, False])
def test_save_load_round_trip(model, tmp_path, pretraining):
    if not pretraining:
        model.drop_pretraining_modules()
    model.eval()
    x1, x2 = torch.rand(3, 3, 64, 64), torch.rand(3, 3, 64, 64)
    before = model.generate_ids(x1, x2, max_new_tokens=12)
    model.save_pretrained(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
    loaded = namc.from_pretrained(tmp_path)
    assert not loaded.training
    assert loaded.config == model.config
    assert torch.equal(loaded.generate_ids(x1, x2, max_new_tokens=12), before)
    assert (loaded.nim is None) is (not pretraining)
    same = namc.create_model("namc_tiny", pretrained=tmp_path)
    assert torch.equal(same.generate_ids(x1, x2, max_new_tokens=12), before)


def test_loading_draws_no_random_weights(model, tmp_path):
    """A saved folder and a namc .ckpt are built under skip_random_init (no random draws, which were most of a load)
    and then loaded strictly: the result equals the model built the usual way and loaded, every parameter and every
    buffer, the buffers no state dict carries included (the grid's ImageNet mean and std, CLIP's causal mask)."""
    model.eval()
    model.save_pretrained(tmp_path / "folder")
    entry = checkpoint_entry(model.config, model.tokenizer, namc.__version__)
    state = {f"model.{key}": value for key, value in model.state_dict().items()}
    torch.save({"state_dict": state, "namc": entry}, tmp_path / "model.ckpt")

    reference = NAMC(model.config, model.tokenizer)  # built with random weights, then overwritten
    load_strict(reference, model.state_dict(), what="reference")
    expected = {**dict(reference.named_parameters()), **dict(reference.named_buffers())}
    assert {"grid.mean", "nim.clip.attn_mask"} <= expected.keys() - reference.state_dict().keys()
    for path in (tmp_path / "folder", tmp_path / "model.ckpt"):
        before = torch.random.get_rng_state()
        loaded = load_model(path)
        assert torch.equal(torch.random.get_rng_state(), before), f"{path.name}: random numbers were drawn"
        got = {**dict(loaded.named_parameters()), **dict(loaded.named_buffers())}
        assert got.keys() == expected.keys()
        assert all(torch.equal(got[key], expected[key]) for key in expected), path.name
    before = torch.random.get_rng_state()
    NAMC(model.config, model.tokenizer)
    assert not torch.equal(torch.random.get_rng_state(), before)  # the checks above can fail: a usual build draws
    with skip_random_init():
        bare = NAMC(model.config, model.tokenizer)
    assert torch.equal(bare.grid.std, reference.grid.std)  # constant buffers are built as usual
    with pytest.raises(WeightsError, match="missing"):  # and a load that misses a weight is refused
        load_strict(bare, {k: v for k, v in model.state_dict().items() if k != "fdg.tok.weight"}, what="partial")


def test_from_pretrained_errors(model, tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        namc.from_pretrained(tmp_path / "nothing")
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["dim"] = 64  # weights no longer fit
    cfg["heads"] = 4
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightsError, match="mir"):
        namc.from_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(WeightsError, match="model.safetensors"):
        namc.from_pretrained(tmp_path)


def test_clip_checkpoint_in_open_clip_layout_loads(tmp_path, tokenizer):
    """A tiny CLIP written as an open_clip state dict loads through the same path as the ViT-B/16 preset."""
    ClipDualEncoder("namc-tiny-clip", 10)  # registers namc's open_clip configs
    cfg = open_clip.get_model_config("namc-tiny-clip")
    cfg["text_cfg"]["vocab_size"] = tokenizer.vocab_size - 1  # a checkpoint without our [MASK] row
    ref = open_clip.CLIP(**cfg)
    path = tmp_path / "clip.pt"
    torch.save(ref.state_dict(), path)
    m = namc.create_model("namc_tiny", tokenizer=tokenizer, clip_pretrained=str(path))
    ours = m.nim.clip.state_dict()
    for key, value in ref.state_dict().items():
        if key == "token_embedding.weight":
            assert torch.equal(ours[key][: value.shape[0]], value)
        else:
            assert torch.equal(ours[key], value), key
    # our pooled features equal open_clip's own encode_image / encode_text on the same weights
    images = torch.rand(2, 3, 64, 64)
    ref.eval(), m.eval()
    norm = (images - m.nim.mean) / m.nim.std
    torch.testing.assert_close(m.nim.encode_image(images)[0], ref.encode_image(norm), atol=1e-5, rtol=1e-4)
    top = tokenizer.vocab_size - 2  # eos = the largest id, so open_clip's argmax pooling finds it too
    ids = torch.zeros(1, 48, dtype=torch.long)  # open_clip's encode_text wants the full context length
    ids[0, :5] = torch.tensor([1, 5, 6, 7, top])
    torch.testing.assert_close(m.nim.encode_text(ids, eos_id=top)[0], ref.encode_text(ids), atol=1e-5, rtol=1e-4)
    # a mismatched checkpoint names the offending key
    sd = ref.state_dict()
    sd["visual.conv1.weight"] = torch.zeros(3, 3)
    torch.save(sd, path)
    with pytest.raises(WeightsError, match="visual.conv1.weight"):
        namc.create_model("namc_tiny", tokenizer=tokenizer, clip_pretrained=str(path))
    with pytest.raises(FileNotFoundError, match="namc convert-clip"):
        namc.create_model("namc_tiny", tokenizer=tokenizer, clip_pretrained=str(tmp_path / "missing.safetensors"))


def test_word_tokenizer_round_trip(tmp_path, tokenizer):
    ids = tokenizer.encode("The small red metal cube, left of a sphere.")
    assert tokenizer.decode([tokenizer.bos_id, *ids, tokenizer.eos_id]) == "the small red metal cube, left of a sphere."
    assert tokenizer.encode("zebra") == [tokenizer.unk_id]
    tokenizer.save(tmp_path)
    again = load_tokenizer(tmp_path)
    assert again.words == tokenizer.words
    assert WordTokenizer.build(["b a", "a"]).words == WordTokenizer.build(["a", "b a"]).words


def test_clip_bpe_tokenizer_mask_and_round_trip(tmp_path):
    tok = ClipBPETokenizer()
    assert (tok.bos_id, tok.eos_id, tok.mask_id, tok.vocab_size) == (49406, 49407, 49408, 49409)
    ids = tok.encode("a small red cube")
    assert tok.decode([tok.bos_id, ids[0], tok.mask_id, *ids[2:], tok.eos_id]) == "a [MASK] red cube"
    tok.save(tmp_path)
    assert load_tokenizer(tmp_path).encode("a small red cube") == ids
    again = load_tokenizer(tmp_path)  # its BPE file is the folder's own: saving there again keeps it
    again.save(tmp_path)
    assert load_tokenizer(tmp_path).encode("a small red cube") == ids


def test_a_clip_bpe_model_saves_again_into_its_own_folder(tmp_path):
    """The README's calibrate_int8-then-save flow on a loaded namc_base-style model (CLIP BPE): the second save into
    the folder it was loaded from replaces it consistently."""
    model = namc.create_model("namc_tiny", tokenizer="clip_bpe").eval()
    model.save_pretrained(tmp_path)
    loaded = namc.from_pretrained(tmp_path)
    namc.compile(loaded, "cpu", "int8").calibrate_int8([torch.rand(2, 3, 64, 64)])
    with torch.no_grad():
        loaded.fdg.tok.weight[0, 0] += 1
    loaded.save_pretrained(tmp_path)
    again = namc.from_pretrained(tmp_path)
    assert torch.equal(again.fdg.tok.weight, loaded.fdg.tok.weight)
    assert (tmp_path / "int8_calibration.json").is_file() and not list(tmp_path.glob(".*partial"))


def test_describe_image_files(model, tmp_path):
    from PIL import Image

    model.drop_pretraining_modules().save_pretrained(tmp_path / "m")
    Image.new("RGBA", (80, 50), (255, 0, 0, 128)).save(tmp_path / "a.png")  # other mode and size: converted
    Image.new("L", (64, 64), 90).save(tmp_path / "b.png")
    one = namc.describe(tmp_path / "m", tmp_path / "a.png", tmp_path / "b.png", max_new_tokens=4)
    assert isinstance(one, str)
    many = namc.describe(model, [tmp_path / "a.png"] * 3, [tmp_path / "b.png"] * 3, max_new_tokens=4, batch_size=2)
    assert many == [one] * 3
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    with pytest.raises(OSError):
        namc.describe(model, tmp_path / "bad.png", tmp_path / "b.png")
    with pytest.raises(ValueError, match="first images"):
        namc.describe(model, [tmp_path / "a.png"], [])
    for first, second in ((["a.png"], "b.png"), ("a.png", ["b.png"])):
        with pytest.raises(ValueError, match="not one image and a list"):
            namc.describe(model, first, second)


def test_grid_trainable_option(tokenizer, batch):
    m = namc.create_model("namc_tiny", tokenizer=tokenizer, grid_trainable=True)
    grid_params = {id(p) for p in m.grid.parameters()}
    assert grid_params <= {id(p) for p in m.param_groups()["mir_fdg"]}
    pretrain_step(m, batch, generator=torch.Generator().manual_seed(0))["loss"].backward()
    assert all(p.grad is not None for p in m.grid.parameters() if p.requires_grad)


def test_nim_token_loss_trains_every_nim_parameter_and_keeps_masks(tokenizer, batch):
    torch.manual_seed(0)
    m = namc.create_model("namc_tiny", tokenizer=tokenizer, nim_token_loss=2.0)
    plain = namc.create_model("namc_tiny", tokenizer=tokenizer)
    assert m.nim.token_logit is not None and plain.nim.token_logit is None
    out = pretrain_step(m, batch, generator=torch.Generator().manual_seed(0))
    out["loss"].backward()
    assert m.nim.token_logit.grad is not None and m.nim.token_logit.grad.abs().sum() > 0
    for name, p in m.nim.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    # the relevance computed once for the loss gives the masks noise_masks would draw itself
    images = torch.cat([batch["image1"], batch["image2"]])
    text = torch.cat([batch["desc1"], batch["desc2"]])
    with torch.no_grad():
        _, hi = m.nim.encode_image(images)
        _, ht = m.nim.encode_text(text, tokenizer.eos_id)
        rel = namc.ops.token_relevance(hi, ht, m.text_masks(text)[0])
    a = m.noise_masks(images, text, torch.Generator().manual_seed(5), rel)
    b = m.noise_masks(images, text, torch.Generator().manual_seed(5))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_nim_token_ngram_switch_reaches_the_loss(tokenizer, batch):
    torch.manual_seed(0)
    m = namc.create_model("namc_tiny", tokenizer=tokenizer, nim_token_loss=1.0)
    assert m.config.nim_token_ngram == 2
    losses = {}
    for n in (None, 1, 2):
        m.config.nim_token_ngram = n
        out = pretrain_step(m, batch, generator=torch.Generator().manual_seed(0))
        losses[n] = float(out["nim"])
    assert len({round(v, 6) for v in losses.values()}) == 3, losses


def test_wrong_image_size_is_named(model):
    s = model.config.image_size
    with pytest.raises(ValueError, match="image size"):
        model.encode_pair(torch.rand(1, 3, 2 * s, 2 * s), torch.rand(1, 3, 2 * s, 2 * s))
