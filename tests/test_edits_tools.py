"""The region tools of the Img-Diff engine: tiny random CLIP / BLIP / SAM in the official layouts loaded through
namc's loaders, clear errors for missing models, the box utilities and the model-free stand-ins on images whose
changed box is known."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import open_clip  # noqa: F401 - imported at collection: the fixtures then time the models, not the imports
import pytest
import scipy.ndimage  # noqa: F401 - imported at collection (2 s here), not inside the first timed test
import torch
import transformers
from PIL import Image, ImageDraw

from namc.curate.edits import shapes, tools
from namc.curate.edits.base import BackendError

sys.path.insert(0, str(Path(__file__).parent))
import imgdiff_helpers as helpers  # noqa: E402

SIDE = 64
_PRELOAD = (transformers.BlipForImageTextRetrieval, transformers.SamModel, transformers.pipeline)  # same reason


def _floor_with(boxes: list[tuple[int, int, int, int]], colour: tuple[int, int, int] = (173, 35, 35)) -> Image.Image:
    image = Image.new("RGB", (SIDE, SIDE), (160, 160, 158))
    draw = ImageDraw.Draw(image)
    for x0, y0, x1, y1 in boxes:
        draw.rectangle([x0, y0, x1 - 1, y1 - 1], fill=colour)
    return image


@pytest.fixture(scope="module")
def clip_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return helpers.tiny_clip(tmp_path_factory.mktemp("clip"))


@pytest.fixture(scope="module")
def blip_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return helpers.tiny_blip(tmp_path_factory.mktemp("blip"))


@pytest.fixture(scope="module")
def sam_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return helpers.tiny_sam(tmp_path_factory.mktemp("sam"))


def test_box_iou_and_nms_by_hand() -> None:
    assert tools.box_iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(50 / 150)
    assert tools.box_iou((0, 0, 10, 10), (10, 10, 20, 20)) == 0.0
    assert tools.box_iou((0, 0, 0, 0), (0, 0, 0, 0)) == 0.0
    boxes = [(0, 0, 10, 10), (0, 0, 10, 12), (20, 20, 30, 30)]  # IoU of the first two: 100 / 120
    assert tools.nms(boxes, [0.5, 0.9, 0.1], iou=0.5) == [1, 2]
    assert tools.nms(boxes, [0.5, 0.9, 0.1], iou=100 / 120) == [1, 0, 2]  # IoU equal to the threshold is kept


def test_crop_is_clipped_and_remembers_where_it_came_from() -> None:
    c = tools.crop(Image.new("RGB", (20, 10)), (-5, 2, 30, 2))
    assert c.size == (20, 1) and c.info[tools.CROP_KEY] == "0,2,20,3,20,10"


def test_clip_loads_the_open_clip_layout_and_scores_cosines(clip_file: Path) -> None:
    scorer = tools.load_clip(clip_file, helpers.TINY_CLIP, tag=None)
    red, blue = _floor_with([(10, 10, 30, 30)]), _floor_with([(10, 10, 30, 30)], (42, 75, 215))
    same, other = scorer.image_similarity([red, red], [red, blue])
    assert same == pytest.approx(1.0, abs=1e-5) and other < same
    feats = scorer.image_features([red, blue])
    assert feats.shape == (2, helpers.TINY_CLIP["embed_dim"])
    assert torch.allclose(feats.norm(dim=-1), torch.ones(2), atol=1e-5)
    t_same, t_other = scorer.text_similarity(["a red cube", "a red cube"], ["a red cube", "two blue spheres"])
    assert t_same == pytest.approx(1.0, abs=1e-5) and t_other < t_same
    by_hand = scorer.model.encode_text(scorer.tokenizer(["a red cube"]), normalize=True)
    assert torch.allclose(scorer.text_features(["a red cube"]), by_hand, atol=1e-6)


def test_clip_missing_or_foreign_weights(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="vit_base_patch32_clip_224.openai"):
        tools.load_clip(tmp_path / "none.safetensors", helpers.TINY_CLIP, tag=None)
    from safetensors.torch import save_file

    bad = tmp_path / "bad.safetensors"
    save_file({"foo": torch.zeros(1)}, str(bad))
    with pytest.raises(Exception, match="foo|missing|unexpected"):
        tools.load_clip(bad, helpers.TINY_CLIP, tag=None)


def test_blip_itm_matches_the_models_own_head(blip_folder: Path) -> None:
    matcher = tools.load_blip(blip_folder)
    images = [_floor_with([(5, 5, 20, 20)]), _floor_with([(30, 30, 60, 60)], (42, 75, 215))]
    texts = ["a red cube", "a large blue sphere"]
    scores = matcher.match(images, texts)
    assert len(scores) == 2 and all(0.0 <= s <= 1.0 for s in scores)
    batch = matcher.processor(images=images, text=texts, return_tensors="pt", padding=True)
    with torch.inference_mode():
        logits = matcher.model(**batch, use_itm_head=True).itm_score  # (2, 2)
    assert scores == pytest.approx(torch.softmax(logits, -1)[:, 1].tolist(), abs=1e-6)


def test_sam_automatic_masks_through_the_pipeline(sam_folder: Path) -> None:
    segmenter = tools.load_sam(sam_folder, points_per_side=4, points_per_batch=8, conf=0.0, min_area=1)
    found = segmenter.segment(_floor_with([(10, 10, 30, 30)]))
    assert found, "a confidence threshold of 0 keeps every mask"
    for (x0, y0, x1, y1), score in found:
        assert 0 <= x0 < x1 <= SIDE and 0 <= y0 < y1 <= SIDE and np.isfinite(score)
    boxes = [b for b, _ in found]
    assert all(tools.box_iou(a, b) <= 0.5 for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    strict = tools.load_sam(sam_folder, points_per_side=4, points_per_batch=8, conf=1.01)
    assert strict.segment(_floor_with([(10, 10, 30, 30)])) == []  # no mask is more confident than certain


def test_hf_hub_ids_resolve_in_the_local_cache(blip_folder: Path, tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "hub"
    snapshot = helpers.add_snapshot(cache, "Salesforce/blip-itm-large-coco", blip_folder)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    matcher = tools.load_blip("hf-hub:Salesforce/blip-itm-large-coco")
    direct = tools.load_blip(snapshot)
    image = _floor_with([(5, 5, 20, 20)])
    assert matcher.match([image], ["a red cube"]) == direct.match([image], ["a red cube"])
    with pytest.raises(BackendError, match="not in the local Hugging Face cache"):
        tools.load_blip("hf-hub:Salesforce/blip-itm-large-coco@v2")
    with pytest.raises(BackendError, match="not a Hub model id"):
        tools.load_blip("hf-hub:no-slash")


@pytest.mark.parametrize(
    ("loader", "source", "hint"),
    [
        (tools.load_blip, "hf-hub:Salesforce/blip-itm-large-coco", "blip-itm-large-coco"),
        (tools.load_sam, "hf-hub:facebook/sam-vit-base", "sam-vit-base"),
        (tools.load_sam, "/nonexistent/sam", "sam-vit-base"),
        (tools.load_blip, None, "blip-itm-large-coco"),
    ],
)
def test_missing_models_say_what_to_download(loader, source, hint: str, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty local cache
    with pytest.raises(BackendError) as err:
        loader(source)
    assert hint in str(err.value) and "\n" not in str(err.value)


def test_build_from_sections_rejects_unknown_kinds() -> None:
    assert isinstance(tools.build_similarity({"similarity": "pixels"}), tools.PixelSimilarity)
    assert isinstance(tools.build_segmenter({"segmenter": "foreground"}), tools.ForegroundSegmenter)
    assert isinstance(tools.build_matcher({"matcher": "shapes"}), tools.ShapesMatcher)
    for build, key in ((tools.build_similarity, "similarity"), (tools.build_matcher, "matcher")):
        with pytest.raises(ValueError, match=key):
            build({key: "fastsam"})
    with pytest.raises(ValueError, match="segmenter"):
        tools.build_segmenter({"segmenter": "fastsam"})


def test_foreground_segmenter_finds_the_drawn_boxes_and_nothing_else() -> None:
    boxes = [(5, 8, 20, 22), (40, 30, 58, 50)]
    found = tools.ForegroundSegmenter().segment(_floor_with(boxes))
    assert sorted(b for b, _ in found) == sorted(boxes)
    assert all(score == pytest.approx(1.0) for _, score in found)  # solid rectangles fill their boxes
    assert tools.ForegroundSegmenter().segment(_floor_with([])) == []


def test_foreground_segmenter_on_shapes_renders_matches_the_exact_boxes() -> None:
    caption = "a small red metal cube, a large blue rubber sphere and a small yellow rubber cylinder"
    (pair,) = shapes.ShapesPairGenerator(SIDE).generate_pairs([(caption, caption)], [3])
    truth = [shapes.object_box(o, SIDE) for o in shapes.scene_of(pair[0])]
    found = [b for b, _ in tools.ForegroundSegmenter().segment(pair[0])]
    assert len(found) == len(truth)
    for t in truth:
        assert max(tools.box_iou(t, f) for f in found) > 0.8


def test_pixel_similarity_scale() -> None:
    sim = tools.PixelSimilarity()
    a, b = _floor_with([(5, 5, 20, 20)]), _floor_with([(5, 5, 20, 20), (40, 40, 52, 52)])
    (same,), (near,) = sim.image_similarity([a], [a]), sim.image_similarity([a], [b])
    (far,) = sim.image_similarity([tools.crop(a, (38, 38, 54, 54))], [tools.crop(b, (38, 38, 54, 54))])
    assert same == pytest.approx(1.0) and 0.85 < near < 1.0 and far < 0.85
    assert sim.text_similarity(["a red cube"], ["A red cube."]) == [1.0]
    assert sim.text_similarity(["a red cube"], ["a blue cube"]) == [pytest.approx(2 / 4)]


def test_shapes_matcher_reads_the_scene_of_a_crop() -> None:
    caption = "a small red metal cube and a large blue rubber sphere"
    (pair,) = shapes.ShapesPairGenerator(SIDE).generate_pairs([(caption, caption)], [0])
    cube, sphere = shapes.scene_of(pair[0])
    box = shapes.object_box(cube, SIDE)
    m = tools.ShapesMatcher()
    on, named_other, off = m.match(
        [tools.crop(pair[0], box), tools.crop(pair[0], box), tools.crop(pair[0], (0, 0, 4, 4))],
        ["a red cube", "a blue sphere", "a red cube"],
    )
    assert on == pytest.approx(1.0) and off == 0.0 and named_other < 0.35
    assert m.match([Image.new("RGB", (8, 8))], ["a red cube"]) == [0.0]
