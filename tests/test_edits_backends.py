"""The image backends of the edit-pair engines: Prompt-to-Prompt, the diffusers pipelines and the images endpoint.

The diffusers tests load tiny random pipelines (:mod:`edits_tiny`) through :func:`namc.curate.edits.backends.build`,
the code path of a user's weights; the remote tests talk to a real HTTP server on 127.0.0.1 (:mod:`images_server`).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import torch
from PIL import Image

pytest.importorskip("diffusers")
pytest.importorskip("transformers")
# the heavy imports happen at collection, so that no test is charged for them
from diffusers import AutoPipelineForText2Image, StableDiffusionInstructPix2PixPipeline  # noqa: E402, F401
from diffusers.models.attention_processor import Attention, AttnProcessor  # noqa: E402
from transformers import CLIPTextModel  # noqa: E402, F401

from namc.curate.edits.backends import build  # noqa: E402
from namc.curate.edits.base import BackendError, Editor, GenerationFailed, Inpainter, PairGenerator  # noqa: E402
from namc.curate.edits.p2p import P2PAttnProcessor, P2PController, P2PSettings, token_mapper  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import edits_tiny  # noqa: E402
from images_server import ImagesServer, edited_image, generated_image, prompt_colour  # noqa: E402

PAIR = ("a photo of a red cat", "a photo of a blue dog")


def _pixels(img: Image.Image) -> np.ndarray:
    return np.asarray(img.convert("RGB"), dtype=np.float64)


def _distance(a: Image.Image, b: Image.Image) -> float:
    """Mean absolute pixel difference, 0-255."""
    return float(np.abs(_pixels(a) - _pixels(b)).mean())


class _Folders(dict):  # type: ignore[type-arg]
    """The tiny pipelines, each built on first use (so no single test's setup pays for all of them)."""

    builders = {"t2i": edits_tiny.text_to_image, "inpaint": edits_tiny.inpainting, "ip2p": edits_tiny.instruct_pix2pix}

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, key: str) -> Path:
        self[key] = self.builders[key](self.root / key)
        return self[key]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _Folders(tmp_path_factory.mktemp("pipelines"))


@pytest.fixture(scope="module")
def generator(folders: dict[str, Path]) -> Any:
    return build({"backend": "diffusers", "model": str(folders["t2i"]), "steps": 2, "device": "cpu"}, "pairs")


# ------------------------------------------------------------------------------------------ the token mapper


def test_token_mapper_equal_prompts_map_one_to_one() -> None:
    weights, mapped = token_mapper([49406, 320, 2368, 49407, 49407], [49406, 320, 2368, 49407, 49407])
    assert torch.equal(weights, torch.eye(5))
    assert mapped.all()


def test_token_mapper_word_swap_of_one_token() -> None:
    # "<s> a cat </s>" -> "<s> a dog </s>": dog takes cat's map (position 2 -> 2)
    weights, mapped = token_mapper([0, 5, 7, 1], [0, 5, 9, 1])
    assert torch.equal(weights, torch.eye(4))
    assert mapped.tolist() == [True, True, True, True]


def test_token_mapper_spreads_a_word_over_more_tokens_and_keeps_inserted_words_own() -> None:
    # source "<s> a cat on </s> </s>" (cat = 1 token), target "<s> a ho rs e on </s>" (horse = 3 tokens)
    weights, mapped = token_mapper([0, 5, 7, 8, 1, 1], [0, 5, 20, 21, 22, 8])
    expected = torch.zeros(6, 6)
    expected[0, 0] = expected[1, 1] = expected[3, 5] = 1.0
    expected[2, 2:5] = 1.0 / 3  # the word's mass, evenly over its three tokens
    assert torch.allclose(weights[:4], expected[:4])
    assert mapped.tolist() == [True] * 6
    # an inserted word ("red") has no source: it keeps its own attention; its neighbours map one to one
    weights, mapped = token_mapper([0, 5, 7, 1], [0, 5, 30, 7])
    assert mapped.tolist() == [True, True, False, True]
    assert weights[2, 3] == 1.0 and weights[:, 2].sum() == 0


# --------------------------------------------------------------------------------- the attention processor


def _attention(cross: bool) -> Attention:
    torch.manual_seed(0)
    return Attention(query_dim=8, cross_attention_dim=6 if cross else None, heads=2, dim_head=4).eval()


def _reference_target(attn: Attention, x: torch.Tensor, ctx: torch.Tensor | None) -> torch.Tensor:
    """The target's output when it takes the source's map: softmax(q_src k_src^T) v_tgt, by hand."""
    ctx = x if ctx is None else ctx
    q, k, v = attn.to_q(x), attn.to_k(ctx), attn.to_v(ctx)  # (2, Q or K, H*d)
    split = lambda t: t.view(t.shape[0], t.shape[1], attn.heads, -1).transpose(1, 2)  # noqa: E731 (B, H, T, d)
    q, k, v = split(q), split(k), split(v)
    probs_source = (q[0] @ k[0].transpose(-1, -2) * attn.scale).softmax(-1)  # (H, Q, K)
    out = (probs_source @ v[1]).transpose(0, 1).reshape(x.shape[1], -1)  # (Q, H*d)
    return attn.to_out[0](out)


@pytest.mark.parametrize("cross", [True, False])
def test_processor_gives_the_target_the_source_map(cross: bool) -> None:
    attn = _attention(cross)
    x = torch.randn(2, 5, 8)  # (source, target), 5 pixels
    ctx = torch.randn(2, 4, 6) if cross else None  # 4 text tokens
    controller = P2PController(torch.eye(4)[None], torch.ones(1, 4, dtype=torch.bool), 10, P2PSettings(1.0, 1.0))
    attn.set_processor(P2PAttnProcessor(controller))
    with torch.no_grad():
        out = attn(x, encoder_hidden_states=ctx)
        plain = _attention(cross)
        plain.set_processor(AttnProcessor())
        expected_source = plain(x, encoder_hidden_states=ctx)[0]
        assert torch.allclose(out[0], expected_source, atol=1e-6)  # the source is untouched
        assert torch.allclose(out[1], _reference_target(attn, x, ctx), atol=1e-6)
        assert not torch.allclose(out[1], plain(x, encoder_hidden_states=ctx)[1], atol=1e-3)
        controller.step = 10  # past the window: plain attention (scaled_dot_product_attention)
        assert torch.allclose(attn(x, encoder_hidden_states=ctx), plain(x, encoder_hidden_states=ctx), atol=1e-5)
    assert controller.replaced == {"cross": int(cross), "self": int(not cross)}


def test_processor_leaves_the_unconditional_half_alone() -> None:
    attn = _attention(cross=True)
    x, ctx = torch.randn(4, 5, 8), torch.randn(4, 4, 6)  # (uncond src, uncond tgt, cond src, cond tgt)
    controller = P2PController(torch.eye(4)[None], torch.ones(1, 4, dtype=torch.bool), 10, P2PSettings(1.0, 1.0))
    plain = _attention(cross=True)
    plain.set_processor(AttnProcessor())
    attn.set_processor(P2PAttnProcessor(controller))
    with torch.no_grad():
        out, ref = attn(x, encoder_hidden_states=ctx), plain(x, encoder_hidden_states=ctx)
        assert torch.allclose(out[:3], ref[:3], atol=1e-6)
        assert torch.allclose(out[3], _reference_target(attn, x[2:], ctx[2:]), atol=1e-6)


def test_settings_reject_fractions_outside_0_1() -> None:
    with pytest.raises(ValueError, match="cross_replace_steps"):
        P2PSettings(cross_replace_steps=1.5)
    assert P2PController(torch.eye(2)[None], torch.ones(1, 2, dtype=torch.bool), 50, P2PSettings()).cross_steps == 40


# ------------------------------------------------------------------------------------------ diffusers: pairs


def test_p2p_pair_is_closer_than_two_seeds_and_equal_prompts_give_equal_images(generator: Any) -> None:
    assert isinstance(generator, PairGenerator)
    results = generator.generate_pairs([PAIR, PAIR, ("a red cat on the table", "a red cat on the table")], [1, 2, 3])
    (src1, tgt1), (src2, _), (same_a, same_b) = results
    assert src1.size == (edits_tiny.SIZE, edits_tiny.SIZE)
    assert _distance(src1, tgt1) < 0.5 * _distance(src1, src2)  # one latent and shared attention vs two seeds
    assert np.array_equal(np.asarray(same_a), np.asarray(same_b))
    assert generator.throughput.images == 6 and generator.throughput.items == 6


def test_pairs_depend_on_the_seed_alone(folders: dict[str, Path], generator: Any) -> None:
    one_by_one = build({"backend": "diffusers", "model": str(folders["t2i"]), "steps": 2, "batch_size": 1}, "pairs")
    prompts = [PAIR, ("a photo of a cat", "a photo of a horse"), PAIR]
    batched = generator.generate_pairs(prompts, [7, 8, 9])
    single = one_by_one.generate_pairs(prompts, [7, 8, 9])
    for a, b in zip(batched, single, strict=True):
        assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(np.asarray(batched[0][0]), np.asarray(batched[2][0]))  # seeds 7 and 9 differ


def test_p2p_changes_the_target_and_restores_the_processors(folders: dict[str, Path], generator: Any) -> None:
    off = build({"backend": "diffusers", "model": str(folders["t2i"]), "steps": 2, "p2p": False}, "pairs")
    before = {k: type(v).__name__ for k, v in generator.pipe.unet.attn_processors.items()}
    ((_, shared),) = generator.generate_pairs([("a photo of a cat", "a photo of a horse")], [4])
    ((_, independent),) = off.generate_pairs([("a photo of a cat", "a photo of a horse")], [4])
    assert _distance(shared, independent) > 0  # the word of 1 token became 5: the mapper spread its map
    assert {k: type(v).__name__ for k, v in generator.pipe.unet.attn_processors.items()} == before


def test_p2p_replaces_in_every_attention_layer_for_its_steps(generator: Any) -> None:
    from namc.curate.edits.p2p import prompt_to_prompt

    pipe = generator.pipe
    # the tiny UNet has 4 transformer blocks (down, mid, 2 up), each one self- and one cross-attention; all of them
    # have at most 16 x 16 positions, under the 32 x 32 limit
    with prompt_to_prompt(pipe.unet, pipe.tokenizer, [PAIR], 5, P2PSettings(0.8, 0.4)) as controller:
        pipe(prompt=list(PAIR), num_inference_steps=5, callback_on_step_end=controller.step_end, output_type="latent")
    assert (controller.cross_steps, controller.self_steps) == (4, 2)
    assert controller.replaced == {"cross": 4 * 4, "self": 4 * 2}
    assert generator.generate_pairs([], []) == []


def test_sdxl_pairs(tmp_path: Path) -> None:
    folder = edits_tiny.text_to_image_xl(tmp_path / "xl")
    section = {"backend": "diffusers", "model": str(folder), "steps": 2, "height": 32, "width": 32}
    generator = build(section, "pairs")
    (a, b), (c, _), (d, e) = generator.generate_pairs([PAIR, PAIR, (PAIR[0], PAIR[0])], [1, 2, 3])
    assert a.size == (32, 32)
    assert _distance(a, b) < 0.5 * _distance(a, c)
    assert np.array_equal(np.asarray(d), np.asarray(e))


def test_nsfw_flag_is_a_failure(tmp_path: Path) -> None:
    folder = edits_tiny.text_to_image(tmp_path / "flagging", flag_everything=True)
    generator = build({"backend": "diffusers", "model": str(folder), "steps": 1}, "pairs")
    (result,) = generator.generate_pairs([PAIR], [0])
    assert isinstance(result, GenerationFailed) and result.kind == "nsfw"
    assert generator.throughput.failed["nsfw"] == 2


# ------------------------------------------------------------------------------------- diffusers: inpaint, edit


def _scene(width: int = 40, height: int = 32, seed: int = 0) -> tuple[Image.Image, Image.Image]:
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    mask = Image.new("L", (width, height), 0)
    mask.paste(255, (8, 8, 24, 24))
    return image, mask


def test_inpaint_repaints_the_mask_only_and_is_seeded(folders: dict[str, Path]) -> None:
    inpainter = build({"backend": "diffusers", "model": str(folders["inpaint"]), "steps": 2}, "inpaint")
    assert isinstance(inpainter, Inpainter)
    image, mask = _scene()
    small, small_mask = _scene(24, 24, seed=1)
    prompt = "background, nothing, 8k"  # Img-Diff's removal prompt (002, section 19)
    out = inpainter.inpaint([image, small, image], [mask, small_mask, mask], [prompt] * 3, [5, 5, 6])
    inside = np.asarray(mask) > 0
    diff = np.abs(_pixels(out[0]) - _pixels(image))
    assert out[0].size == image.size and out[1].size == small.size
    assert diff[~inside].max() == 0  # keep_unmasked: outside the mask the input, pixel for pixel
    assert diff[inside].mean() > 10
    again = inpainter.inpaint([image], [mask], [prompt], [5])[0]
    assert np.array_equal(np.asarray(again), np.asarray(out[0]))
    assert not np.array_equal(np.asarray(out[2]), np.asarray(out[0]))  # seed 6


def test_inpaint_with_a_text_to_image_folder_as_img_diff_does(tmp_path: Path) -> None:
    # Img-Diff inpaints with SDXL-turbo, a text-to-image folder: AutoPipelineForInpainting picks the SDXL inpainter
    folder = edits_tiny.text_to_image_xl(tmp_path / "turbo")
    section = {"backend": "diffusers", "model": str(folder), "steps": 2, "guidance_scale": 0.0}
    inpainter = build(section, "inpaint")
    assert type(inpainter.pipe).__name__ == "StableDiffusionXLInpaintPipeline"
    image, mask = _scene(32, 32)
    (out,) = inpainter.inpaint([image], [mask], ["background, nothing, 8k"], [0])
    inside = np.asarray(mask) > 0
    assert np.array_equal(np.asarray(out)[~inside], np.asarray(image)[~inside])
    assert not np.array_equal(np.asarray(out)[inside], np.asarray(image)[inside])
    with pytest.raises(ValueError, match="item 0: the mask is 8x8, the image 32x32"):
        inpainter.inpaint([image], [Image.new("L", (8, 8))], ["x"], [0])


def test_edit_with_instruct_pix2pix(folders: dict[str, Path]) -> None:
    section = {"backend": "diffusers", "model": str(folders["ip2p"]), "steps": 2, "image_guidance_scale": 1.5}
    editor = build(section, "edit")
    assert isinstance(editor, Editor)
    image, _ = _scene()
    out = editor.edit([image, image, image], ["make the cat blue"] * 3, [1, 1, 2])
    assert out[0].size == image.size
    assert np.array_equal(np.asarray(out[0]), np.asarray(out[1]))
    assert not np.array_equal(np.asarray(out[0]), np.asarray(out[2]))
    assert editor.throughput.images == 3


def test_pairs_need_a_text_to_image_pipeline(folders: dict[str, Path]) -> None:
    with pytest.raises(BackendError, match="9 input channels") as err:
        build({"backend": "diffusers", "model": str(folders["inpaint"])}, "pairs")
    assert "\n" not in str(err.value)


def test_edit_needs_an_instruction_editing_pipeline(folders: dict[str, Path]) -> None:
    with pytest.raises(BackendError, match="instruction-editing pipeline") as err:
        build({"backend": "diffusers", "model": str(folders["t2i"])}, "edit")
    assert "\n" not in str(err.value) and "StableDiffusionPipeline" in str(err.value)


# --------------------------------------------------------------------------------------- diffusers: loading


def test_hub_id_loads_from_the_local_cache(folders: dict[str, Path], tmp_path: Path, monkeypatch: Any) -> None:
    repo = tmp_path / "hub" / "models--org--tiny-sd"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(folders["t2i"], repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    generator = build({"backend": "diffusers", "model": "hf-hub:org/tiny-sd@main", "steps": 1}, "pairs")
    assert generator.folder == repo / "snapshots" / commit
    with pytest.raises(BackendError, match=r"hf download org/absent .*--cache-dir") as err:
        build({"backend": "diffusers", "model": "hf-hub:org/absent"}, "pairs")
    assert "\n" not in str(err.value) and str(tmp_path / "hub") in str(err.value)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"backend": "dalle"}, "unknown backend 'dalle'"),
        ({"backend": "diffusers", "model": "M", "stpes": 2}, "unknown key 'stpes'"),
        ({"backend": "diffusers", "model": "M", "image_guidance_scale": 2}, "unknown key 'image_guidance_scale'"),
        ({"backend": "openai", "model": "m", "steps": 2}, "unknown key 'steps'"),
        ({"backend": "diffusers"}, "model: is required"),
        ({"backend": "diffusers", "model": "/nonexistent/sd"}, "does not exist"),
        ({"backend": "diffusers", "model": "hf-hub:not a repo"}, "not a Hub model id"),
        ({"backend": "diffusers", "model": "hf-hub:org/name@../../x"}, "revision"),
        ({"backend": "diffusers", "model": "M", "steps": 0}, "steps must be an integer"),
        ({"backend": "diffusers", "model": "M", "batch_size": True}, "batch_size must be an integer"),
        ({"backend": "diffusers", "model": "M", "height": 30}, "multiple of 8"),
        ({"backend": "diffusers", "model": "M", "dtype": "float8"}, "dtype must be one of"),
        ({"backend": "diffusers", "model": "M", "cross_replace_steps": 2}, "cross_replace_steps"),
        ({"backend": "openai"}, "model: is required"),
        ({"backend": "openai", "model": "m", "size": "big"}, "size must be"),
        ({"backend": "openai", "model": "m", "timeout": -1}, "timeout must be"),
        ({"backend": "openai", "model": "m", "response_format": "url"}, "response_format"),
    ],
)
def test_bad_sections_are_one_line_errors(section: dict[str, Any], message: str, tmp_path: Path) -> None:
    with pytest.raises(BackendError, match=message) as err:
        build(section, "pairs")
    assert "\n" not in str(err.value)


def test_a_folder_that_is_not_a_pipeline(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="no model_index.json") as err:
        build({"backend": "diffusers", "model": str(tmp_path)}, "inpaint")
    assert "\n" not in str(err.value)
    with pytest.raises(BackendError, match="unknown role"):
        build({"backend": "diffusers", "model": str(tmp_path)}, "paint")


def test_a_pipeline_without_safetensors_weights_is_refused(folders: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "pickled"
    shutil.copytree(folders["t2i"], folder)
    weights = folder / "unet" / "diffusion_pytorch_model.safetensors"
    weights.rename(weights.with_suffix(".bin"))  # only pickles are loadable with torch.load: never here
    with pytest.raises(BackendError, match="cannot load a pipeline for pairs") as err:
        build({"backend": "diffusers", "model": str(folder)}, "pairs")
    assert "\n" not in str(err.value)


def test_shapes_backend_is_built_by_its_module() -> None:
    generator = build({"backend": "shapes"}, "pairs")
    assert type(generator).__module__ == "namc.curate.edits.shapes"
    with pytest.raises(BackendError, match="min_cover"):
        build({"backend": "shapes", "min_cover": 3}, "inpaint")


# ------------------------------------------------------------------------------------------ the images endpoint


def _openai(server: ImagesServer, **extra: Any) -> dict[str, Any]:
    return {
        "backend": "openai",
        "base_url": server.url,
        "model": "image-model",
        "api_key_env": "NAMC_TEST_IMAGES_KEY",
        "timeout": 0.5,
        "max_attempts": 3,
        "backoff_base": 0.0,
        "backoff_max": 0.0,
        **extra,
    }


def test_remote_pairs_share_the_seed_and_the_key_comes_from_the_environment(monkeypatch: Any) -> None:
    monkeypatch.setenv("NAMC_TEST_IMAGES_KEY", "sk-test-123")
    with ImagesServer() as server:
        generator = build(_openai(server, send_seed=True, size="48x40"), "pairs")
        assert isinstance(generator, PairGenerator)
        ((a, b),) = generator.generate_pairs([("a red cube", "a blue cube")], [11])
        assert server.last_auth == "Bearer sk-test-123"
        assert [r["seed"] for r in server.requests] == [11, 11]
        assert {r["response_format"] for r in server.requests} == {"b64_json"}
    assert a.size == (48, 40)
    assert np.array_equal(np.asarray(a), np.asarray(generated_image("a red cube", 11, (48, 40))))
    assert np.array_equal(np.asarray(b), np.asarray(generated_image("a blue cube", 11, (48, 40))))
    assert generator.throughput.images == 2


def test_remote_seed_is_not_sent_by_default() -> None:
    with ImagesServer() as server:
        build(_openai(server), "pairs").generate_pairs([("a", "b")], [3])
        assert [r["seed"] for r in server.requests] == [None, None]


@pytest.mark.parametrize(
    ("directive", "kind"),
    [
        ("refuse", "refused"),
        ("garbled", "bad_output"),
        ("empty", "bad_output"),
        ("badb64", "bad_output"),
        ("notimage", "bad_output"),
        ("500,500,500", "server_error"),
        ("429", "rate_limit"),
        ("slow", "timeout"),
    ],
)
def test_remote_failures_are_counted_by_kind(directive: str, kind: str) -> None:
    with ImagesServer(slow_seconds=1.5) as server:
        generator = build(_openai(server, max_attempts=2), "pairs")
        (result,) = generator.generate_pairs([(f"a cat [[{directive}]]", "a dog")], [0])
    assert isinstance(result, GenerationFailed) and result.kind == kind, result
    assert "\n" not in result.message
    assert generator.throughput.failed[kind] == 2  # the pair's two images


@pytest.mark.parametrize("directive", ["429,ok", "500,ok", "drop,ok"])
def test_remote_transient_failures_are_retried(directive: str) -> None:
    with ImagesServer() as server:
        generator = build(_openai(server), "pairs")
        (result,) = generator.generate_pairs([(f"a cat [[{directive}]]", "a dog")], [0])
    assert isinstance(result, tuple)
    assert sum(generator.retries.values()) == 1


def test_remote_inpaint_sends_the_mask_as_transparency() -> None:
    image, mask = _scene()
    with ImagesServer() as server:
        inpainter = build(_openai(server, send_seed=True), "inpaint")
        (out,) = inpainter.inpaint([image], [mask], ["background, nothing, 8k"], [2])
        assert server.requests[0]["route"] == "edits" and server.requests[0]["mask"]
        assert server.requests[0]["size"] == "40x32" and server.requests[0]["seed"] == "2"  # a form field
    inside = np.asarray(mask) > 0
    assert np.array_equal(np.asarray(out)[~inside], np.asarray(image)[~inside])
    assert (np.asarray(out)[inside] == prompt_colour("background, nothing, 8k")).all()


def test_remote_edit_without_a_mask() -> None:
    image, _ = _scene()
    with ImagesServer() as server:
        editor = build(_openai(server), "edit")
        assert isinstance(editor, Editor)
        (out,) = editor.edit([image], ["make the cube red"], [0])
        assert not server.requests[0]["mask"]
    assert np.array_equal(np.asarray(out), np.asarray(edited_image(image, None, "make the cube red")))


def test_remote_results_keep_the_input_order_under_concurrency() -> None:
    image, _ = _scene(16, 16)
    instructions = [f"paint it colour {k}" for k in range(7)]
    with ImagesServer(latency=0.05) as server:
        editor = build(_openai(server, concurrency=3), "edit")
        out = editor.edit([image] * 7, instructions, list(range(7)))
    assert [tuple(np.asarray(o)[0, 0]) for o in out] == [prompt_colour(i) for i in instructions]
    assert editor.throughput.to_json()["images"] == 7


def test_remote_image_over_the_pixel_cap() -> None:
    with ImagesServer() as server:
        generator = build(_openai(server, max_pixels=64 * 63), "pairs")
        (result,) = generator.generate_pairs([("a", "b")], [0])
    assert isinstance(result, GenerationFailed) and result.kind == "oversized_output"


def test_the_images_server_still_speaks_chat() -> None:
    from llm_server import DEFAULT_ANSWER

    with ImagesServer() as server:
        client = openai.OpenAI(api_key="EMPTY", base_url=server.url, max_retries=0)
        answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        client.close()
    assert answer.choices[0].message.content == DEFAULT_ANSWER
