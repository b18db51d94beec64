"""Benchmark loaders on small fixtures written in each benchmark's official layout, plus the image transform."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from namc.data.collate import SkipNone
from namc.data.idc import (
    BENCHMARKS,
    NO_CHANGE,
    AnnotationError,
    BenchmarkDataset,
    ClevrChange,
    ClevrDC,
    ImageEditingRequest,
    SpotTheDiff,
    build_benchmark,
    check_benchmark_root,
    list_datasets,
    register_dataset,
)
from namc.data.synthetic import generate_benchmark
from namc.data.transforms import ImageTransform, to_rgb
from namc.lit.datamodules import BenchmarkDataModule

ITEM_KEYS = {"id", "image1", "image2", "captions", "change_type"}


def _img(path: Path, value: int = 100, size: tuple[int, int] = (48, 32), mode: str = "RGB") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, (value, 50, 200) if mode == "RGB" else value).save(path)


def _json(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def _check_item(item: dict, size: int = 16) -> None:
    assert set(item) == ITEM_KEYS
    for key in ("image1", "image2"):
        assert item[key].shape == (3, size, size) and item[key].dtype == torch.float32
        assert 0.0 <= float(item[key].min()) <= float(item[key].max()) <= 1.0


# -- CLEVR-Change --------------------------------------------------------------------------------------------------


def _clevr_change(root: Path, n: int = 6) -> None:
    types = ["color", "material", "add", "drop", "move", "color"]
    for i in range(n):
        _img(root / "images" / f"CLEVR_default_{i:06d}.png", 10 * i, mode="RGBA")  # CLEVR renders are RGBA
        _img(root / "sc_images" / f"CLEVR_semantic_{i:06d}.png", 10 * i + 1)
        _img(root / "nsc_images" / f"CLEVR_nonsemantic_{i:06d}.png", 10 * i + 2)
    _json(root / "splits.json", {"train": [0, 1, 2, 3], "val": [4], "test": [5]})
    _json(
        root / "change_captions.json",
        {f"CLEVR_default_{i:06d}.png": [f"change {i} a", f"change {i} b"] for i in range(n)},
    )
    _json(root / "no_change_captions.json", {f"CLEVR_default_{i:06d}.png": ["no change was made"] for i in range(n)})
    mapping: dict[str, list[str]] = {}
    for i, t in enumerate(types[:n]):
        mapping.setdefault(t, []).append(f"{i:06d}.png")
    _json(root / "type_mapping.json", mapping)


def test_clevr_change_official_layout(tmp_path: Path) -> None:
    _clevr_change(tmp_path)
    train = build_benchmark("clevr_change", tmp_path, "train", 16)
    assert isinstance(train, ClevrChange) and len(train) == 8  # 4 change pairs + 4 distractor pairs
    assert [train[i]["id"] for i in range(4)] == ["000000.png", "000000.png_n", "000001.png", "000001.png_n"]
    first, distractor = train[0], train[1]
    _check_item(first)
    assert first["captions"] == ["change 0 a", "change 0 b"] and first["change_type"] == "color"
    assert distractor["captions"] == ["no change was made"] and distractor["change_type"] == NO_CHANGE
    assert torch.equal(first["image1"], distractor["image1"])  # both pairs start from the before image
    assert train.change_types() == {"color": 1, "material": 1, "add": 1, "drop": 1, NO_CHANGE: 4}
    val = ClevrChange(tmp_path, "valid", 16, include_distractors=False)
    assert len(val) == 1 and val[0]["change_type"] == "move"
    assert len(ClevrChange(tmp_path, "test", 16)) == 2


def test_clevr_change_reads_shapes_world(tmp_path: Path) -> None:
    info = generate_benchmark(tmp_path, 15, image_size=24, seed=5, n_captions=2)
    scenes = json.loads((tmp_path / "scenes.json").read_text())
    total = 0
    for split, n in info["splits"].items():
        ds = ClevrChange(tmp_path, split, 24)
        assert len(ds) == 2 * n
        total += len(ds)
        for item in (ds[i] for i in range(len(ds))):
            _check_item(item, 24)
            assert len(item["captions"]) == 2
            if item["change_type"] != NO_CHANGE:
                changed = scenes[f"CLEVR_default_{item['id']}"]["changed"]
                name = f"{changed['size']} {changed['color']} {changed['material']} {changed['shape']}"
                assert all(name in c for c in item["captions"])
    assert total == 30
    ds = ClevrChange(tmp_path, "train", 24)
    assert {t for t in ds.change_types()} <= {"color", "material", "add", "drop", "move", NO_CHANGE}
    assert ds.issues.skipped == 0


# -- CLEVR-DC --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["released", "padded"])
def test_clevr_dc_both_namings(tmp_path: Path, form: str) -> None:
    n = 12
    for i in range(n):
        name = f"{i}.png" if form == "released" else f"{i:06d}.png"
        _img(tmp_path / "images" / name, i)
        _img(tmp_path / "sc_images" / name, i + 100)
    if form == "released":
        _json(tmp_path / "captions.json", {str(i): [f"dc caption {i}"] for i in range(n)})
        _json(tmp_path / "split.json", {"train": list(range(8)), "val": [8, 9], "test": [10, 11]})
        _json(tmp_path / "type_mapping_dc.json", {"color": [f"{i}.png" for i in range(6)], "move": ["10.png"]})
    else:
        _json(tmp_path / "change_captions.json", {f"{i:06d}.png": [f"dc caption {i}"] for i in range(n)})
        _json(tmp_path / "splits.json", {"train": list(range(8)), "val": [8, 9], "test": [10, 11]})
        _json(tmp_path / "type_mapping.json", {"color": [f"{i:06d}.png" for i in range(6)], "move": ["000010.png"]})
    train = build_benchmark("clevr_dc", tmp_path, "train", 16)
    assert isinstance(train, ClevrDC) and len(train) == 8
    item = train[2]
    _check_item(item)
    assert item["id"] == "000002.png" and item["captions"] == ["dc caption 2"] and item["change_type"] == "color"
    assert float(item["image1"][0].mean()) == pytest.approx(2 / 255, abs=1e-6)  # the right file, not a neighbour
    test = ClevrDC(tmp_path, "test", 16)
    assert [test[i]["change_type"] for i in range(2)] == ["move", None]


# -- Spot-the-Diff ---------------------------------------------------------------------------------------------------


def test_spot_the_diff_merges_repeated_ids(tmp_path: Path) -> None:
    ann = [
        {"img_id": "5406", "sentences": ["the blue truck is turning right"]},
        {"img_id": "8069", "sentences": [""]},  # an empty annotation, as in the official val.json
        {"img_id": "5406", "sentences": ["a car is gone", "  "]},
        {"img_id": "77", "sentences": ["a person appeared"]},
    ]
    _json(tmp_path / "annotations" / "train.json", ann)
    for img_id in ("5406", "8069"):
        _img(tmp_path / "resized_images" / f"{img_id}.png")
        _img(tmp_path / "resized_images" / f"{img_id}_2.png")
    _img(tmp_path / "resized_images" / "77.jpg")  # jpg images are allowed too
    _img(tmp_path / "resized_images" / "77_2.jpg")
    (tmp_path / "resized_images" / "5406_diff.jpg").write_bytes(b"")  # the release's diff images are ignored
    ds = build_benchmark("spot_the_diff", tmp_path, "train", 16)
    assert isinstance(ds, SpotTheDiff) and len(ds) == 2
    _check_item(ds[0])
    assert ds[0]["id"] == "5406" and ds[0]["captions"] == ["the blue truck is turning right", "a car is gone"]
    assert ds[1]["id"] == "77" and ds[0]["change_type"] is None
    assert ds.issues.counts == {"empty_captions": 1}


# -- Image-Editing-Request -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("image_folder", ["images", "."])
def test_ier_official_layout(tmp_path: Path, image_folder: str) -> None:
    def entry(i: int) -> dict:
        return {
            "img0": f"Reddit.com_{i}_a.jpg",
            "img1": f"Reddit.com_{i}_b.png",
            "sents": [f"edit {i}", "x"],
            "uid": f"Reddit_{i}",
        }

    for split, ids in (("train", [0, 1, 2]), ("valid", [3]), ("test", [4, 5])):
        _json(tmp_path / f"{split}.json", [entry(i) for i in ids])
        for i in ids:
            _img(tmp_path / image_folder / f"Reddit.com_{i}_a.jpg", i)
            _img(tmp_path / image_folder / f"Reddit.com_{i}_b.png", i, mode="P")
    train = build_benchmark("ier", tmp_path, "train", 16)
    assert isinstance(train, ImageEditingRequest) and len(train) == 3
    _check_item(train[1])
    assert train[1]["id"] == "Reddit_1" and train[1]["captions"] == ["edit 1", "x"]
    assert len(ImageEditingRequest(tmp_path, "val", 16)) == 1
    assert len(ImageEditingRequest(tmp_path, "test", 16)) == 2


# -- bad input -------------------------------------------------------------------------------------------------------


def test_malformed_annotation_files_fail_naming_file_and_entry(tmp_path: Path) -> None:
    _clevr_change(tmp_path)
    (tmp_path / "splits.json").write_text('{"train": [0, 1,\n  "oops" }')
    with pytest.raises(AnnotationError, match=r"splits\.json: invalid JSON at line 2"):
        ClevrChange(tmp_path, "train", 16)
    _json(tmp_path / "splits.json", {"train": [0], "val": []})
    with pytest.raises(AnnotationError, match=r"splits\.json: missing key 'test'"):
        ClevrChange(tmp_path, "test", 16)
    _json(tmp_path / "splits.json", {"train": [0, 9], "val": [], "test": []})
    with pytest.raises(AnnotationError, match=r"change_captions\.json: no entry for CLEVR_default_000009\.png"):
        ClevrChange(tmp_path, "train", 16)

    _json(tmp_path / "annotations" / "val.json", [{"img_id": "1", "sentences": ["a"]}, {"img_id": "2"}])
    with pytest.raises(AnnotationError, match=r"val\.json: entry 1 lacks"):
        SpotTheDiff(tmp_path, "val", 16)
    _json(tmp_path / "test.json", [{"img0": "a.jpg", "img1": "b.jpg", "sents": "not a list", "uid": "u"}])
    with pytest.raises(AnnotationError, match=r"test\.json: entry 0 \(uid u\): captions must be a list"):
        ImageEditingRequest(tmp_path, "test", 16)
    with pytest.raises(FileNotFoundError, match="train.json"):
        ImageEditingRequest(tmp_path / "nowhere", "train", 16)
    with pytest.raises(ValueError, match="unknown benchmark"):
        build_benchmark("coco", tmp_path, "train", 16)


def test_missing_and_corrupt_images(tmp_path: Path) -> None:
    _clevr_change(tmp_path)
    (tmp_path / "sc_images" / "CLEVR_semantic_000001.png").unlink()
    (tmp_path / "nsc_images" / "CLEVR_nonsemantic_000002.png").write_bytes(b"not a png")
    ds = ClevrChange(tmp_path, "train", 16)
    assert len(ds) == 7 and ds.issues.counts == {"missing_image": 1}  # found when the dataset is built
    corrupt = [i for i in range(len(ds)) if ds.entries[i][0] == "000002.png_n"][0]
    assert ds[corrupt] is None
    assert ds.issues.counts == {"missing_image": 1, "corrupt_image": 1}
    batch = SkipNone(list)([ds[corrupt], ds[0]])  # the datamodules' collate wrapper around a plain list
    assert [b["id"] for b in batch] == ["000000.png"]
    # counts are per item, whichever worker reads it and however many epochs: 2 of the 8 items, not 2 + 3 x 1
    loader = DataLoader(ds, batch_size=3, shuffle=True, num_workers=2, collate_fn=SkipNone(list))
    for _ in range(3):
        assert sum(len(batch) for batch in loader) == 6
    assert ds.issues.counts == {"missing_image": 1, "corrupt_image": 1} and ds.issues.seen == 8
    strict = ClevrChange(tmp_path, "train", 16, on_error="raise")
    with pytest.raises(OSError, match="CLEVR_nonsemantic_000002.png|000002.png_n"):
        strict[corrupt]


def test_image_cache_reads_each_file_once_and_never_caches_failures(tmp_path: Path) -> None:
    _clevr_change(tmp_path)
    plain = ClevrChange(tmp_path, "train", 16)
    cached = ClevrChange(tmp_path, "train", 16).enable_image_cache()
    first = [cached[i] for i in range(len(cached))]
    for i, item in enumerate(first):
        reference = plain[i]
        assert torch.equal(item["image1"], reference["image1"]) and torch.equal(item["image2"], reference["image2"])
    for path in tmp_path.rglob("*.png"):  # every image is in memory now: the files are no longer read
        path.write_bytes(b"not a png")
    again = cached[3]
    assert torch.equal(again["image1"], first[3]["image1"]) and torch.equal(again["image2"], first[3]["image2"])
    again["image1"].zero_()  # each read is a fresh tensor: changing one does not change the cache
    assert torch.equal(cached[3]["image1"], first[3]["image1"])
    assert plain.issues.ok == len(plain)
    assert plain[3] is None and plain.issues.counts == {"corrupt_image": 1}  # read well, now corrupt: moved
    assert plain.issues.ok == len(plain) - 1

    fresh = ClevrChange(tmp_path, "train", 16).enable_image_cache()  # corrupt files: skipped at every read
    assert fresh[0] is None and fresh[0] is None
    assert fresh.issues.counts == {"corrupt_image": 1}  # and counted once: one item
    with pytest.raises(ValueError, match="num_workers: 0 with cache_images"):
        BenchmarkDataModule("clevr_change", str(tmp_path), num_workers=2, cache_images=True)


# -- registry --------------------------------------------------------------------------------------------------------


def test_registry_holds_each_loader_with_its_download_hint(tmp_path: Path) -> None:
    assert list_datasets() == [
        "clevr_change",
        "clevr_dc",
        "ier",
        "omnidiff",
        "omnidiff_real",
        "omnidiff_render",
        "spot_the_diff",
    ]
    assert BENCHMARKS["ier"] is ImageEditingRequest and BENCHMARKS["clevr_dc"] is ClevrDC
    for name in list_datasets():
        cls = BENCHMARKS[name]
        assert cls.name == name and cls.title and cls.layout and cls.url.startswith("https://") and cls.marker
    with pytest.raises(FileNotFoundError, match=r"Spot-the-Diff not found at .*harsh19/spot-the-diff.*annotations"):
        check_benchmark_root("spot_the_diff", tmp_path)
    (tmp_path / "annotations").mkdir()
    assert check_benchmark_root("spot_the_diff", str(tmp_path)) == tmp_path
    with pytest.raises(ValueError, match="unknown benchmark 'coco'"):
        check_benchmark_root("coco", tmp_path)


def test_register_dataset_refuses_incomplete_or_duplicate_loaders() -> None:
    class NoHint(BenchmarkDataset):
        name = "no_hint"
        title = "No-Hint"

    with pytest.raises(TypeError, match="layout, url, marker"):
        register_dataset(NoHint)

    class Unnamed(BenchmarkDataset):  # inherits the base class's placeholder name
        title, layout, url, marker = "Unnamed", "x", "https://example.org", "x"

    with pytest.raises(TypeError, match="name"):
        register_dataset(Unnamed)

    class Twin(ClevrDC):
        name = "clevr_dc"

    with pytest.raises(ValueError, match="taken by ClevrDC"):
        register_dataset(Twin)
    assert "no_hint" not in BENCHMARKS and BENCHMARKS["clevr_dc"] is ClevrDC


# -- transform -------------------------------------------------------------------------------------------------------


def test_transform_modes_to_rgb() -> None:
    transparent = Image.new("RGBA", (4, 4), (0, 0, 0, 0))
    assert np.asarray(to_rgb(transparent)).min() == 255  # alpha composited onto white, not black
    opaque = Image.new("RGBA", (4, 4), (10, 20, 30, 255))
    assert np.asarray(to_rgb(opaque))[0, 0].tolist() == [10, 20, 30]
    palette = Image.new("P", (4, 4), 0)
    palette.putpalette([200, 100, 50] + [0] * 765)
    assert np.asarray(to_rgb(palette))[0, 0].tolist() == [200, 100, 50]
    palette.info["transparency"] = 0
    assert np.asarray(to_rgb(palette))[0, 0].tolist() == [255, 255, 255]
    deep = Image.fromarray(np.full((4, 4), 65535, dtype=np.uint16))  # 16-bit grey
    assert np.asarray(to_rgb(deep)).min() == 255
    dark = Image.fromarray(np.full((4, 4), 2570, dtype=np.uint16))  # a dark 16-bit image is still 16-bit
    assert np.asarray(to_rgb(dark)).max() == 10
    unit = Image.fromarray(np.full((4, 4), 0.5, dtype=np.float32), "F")  # a float image in [0, 1]
    assert np.asarray(to_rgb(unit)).tolist() == np.full((4, 4, 3), 128).tolist()
    assert np.asarray(to_rgb(Image.fromarray(np.full((4, 4), 77.0, dtype=np.float32), "F"))).max() == 77
    for mode in ("L", "LA", "1", "CMYK", "YCbCr", "I", "F", "RGB"):
        img = Image.new(mode, (5, 3))
        out = ImageTransform(8)(img)
        assert out.shape == (3, 8, 8) and out.dtype == torch.float32, mode


def test_exif_orientation_is_applied(tmp_path: Path) -> None:
    """A photo tagged "rotate 90 degrees" is read upright, as viewers show it: the same as the rotated pixels."""
    arr = np.zeros((20, 40, 3), dtype=np.uint8)
    arr[:, :20] = 255  # white left half
    stored = Image.fromarray(arr)
    exif = stored.getexif()
    exif[0x0112] = 6  # EXIF Orientation: rotate 90 degrees clockwise to view
    stored.save(tmp_path / "tagged.png", exif=exif.tobytes())
    upright = stored.transpose(Image.Transpose.ROTATE_270)  # what a viewer shows
    upright.save(tmp_path / "upright.png")
    a, b = (ImageTransform(None).load(tmp_path / name) for name in ("tagged.png", "upright.png"))
    assert a.shape == b.shape == (3, 40, 20) and torch.equal(a, b)


def test_transform_resize_and_scale() -> None:
    arr = np.zeros((10, 20, 3), dtype=np.uint8)
    arr[:, 10:] = 255
    img = Image.fromarray(arr)
    out = ImageTransform(None)(img)
    assert out.shape == (3, 10, 20) and float(out[:, :, :10].max()) == 0.0 and float(out[:, :, 10:].min()) == 1.0
    small = ImageTransform(8)(img)
    expected = np.asarray(img.resize((8, 8), Image.Resampling.BICUBIC), dtype=np.float32) / 255
    assert torch.allclose(small, torch.from_numpy(expected).permute(2, 0, 1))
    with pytest.raises(ValueError):
        ImageTransform(0)
