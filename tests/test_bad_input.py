"""Every kind of bad input a user can hand namc, built for real, with the outcome, the count and the message asserted.

Areas: benchmark datasets (images and annotation files), the pre-training corpus (manifest lines, streamed and
packed; tar shards), saved models (weights, config.json, tokenizer, checkpoints), ``namc describe`` and the
LightningCLI's checkpoint options. The rule each case checks: bad input is skipped and counted with its reason, or
is a one-line error that names the file (and line, column or key); the CLIs exit 2 for usage errors and 1 for data
errors, never with a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from namc.cli import main as namc_main
from namc.data.corpus import CorpusDataset, pack_corpus
from namc.data.corpus.shards import iter_tar_groups, list_shards, shard_sizes
from namc.data.idc import AnnotationError, ClevrChange, SpotTheDiff
from namc.data.issues import DataIssues
from namc.data.synthetic import generate_corpus
from namc.data.transforms import ImageTooLargeError, open_image
from namc.lit.cli import UnsafeCheckpointError, check_checkpoint_safety
from namc.models import NAMC, create_model, load_model
from namc.models.io import ConfigError, WeightsError, checkpoint_entry

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "data" / "golden"


# ------------------------------------------------------------------------------------------------ broken files


def _png(path: Path, size: tuple[int, int] = (24, 16), mode: str = "RGB", value: int = 90) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, value if mode not in ("RGB", "CMYK") else (value,) * len(mode)).save(path)
    return path


def _bomb(path: Path, side: int = 14000) -> Path:
    """A 1-bit PNG of ``side`` x ``side`` pixels: about 24 kB on disk, 196 MP (588 MB as RGB) if decoded."""
    Image.new("1", (side, side)).save(path, optimize=True)
    return path


def _damage_image(kind: str, path: Path) -> None:
    """Replaces the PNG at ``path`` with a broken one of ``kind``."""
    if kind == "oversized":
        _bomb(path)
    elif kind == "truncated":
        path.write_bytes(path.read_bytes()[:60])
    elif kind == "zero_bytes":
        path.write_bytes(b"")
    elif kind == "not_an_image":
        path.write_bytes(b"%PDF-1.4 this is not a PNG\n")
    elif kind == "directory":
        path.unlink()
        path.mkdir()
    elif kind == "missing":
        path.unlink()
    else:
        raise AssertionError(kind)


# ------------------------------------------------------------------------------------------------ benchmark datasets


def _spot_the_diff(root: Path, modes: tuple[str, str] = ("RGB", "RGB")) -> Path:
    """Two items, ``1`` and ``2``; item 2's images in ``modes`` (a CMYK image as JPEG, which PNG cannot hold)."""
    _png(root / "resized_images" / "1.png")
    _png(root / "resized_images" / "1_2.png", value=120)
    for name, mode, value in (("2", modes[0], 30), ("2_2", modes[1], 60)):
        ext = ".jpg" if mode == "CMYK" else ".png"
        _png(root / "resized_images" / f"{name}{ext}", mode=mode, value=value * 1000 if mode == "I;16" else value)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    entries = [{"img_id": "1", "sentences": ["a cube moved"]}, {"img_id": "2", "sentences": ["nothing changed"]}]
    (root / "annotations" / "val.json").write_text(json.dumps(entries))
    return root


def _items(ds: SpotTheDiff) -> list[dict]:
    return [item for i in range(len(ds)) if (item := ds[i]) is not None]


@pytest.mark.parametrize(
    ("damage", "kind", "message"),
    [
        ("oversized", "oversized_image", "14000x14000 = 196,000,000 pixels is over the cap of 89,478,485"),
        ("truncated", "corrupt_image", "2.png"),
        ("zero_bytes", "corrupt_image", "empty file (0 bytes)"),
        ("not_an_image", "corrupt_image", "cannot identify image file"),
        ("directory", "corrupt_image", "is a directory"),
        ("missing", "missing_image", "2.png"),
    ],
)
def test_benchmark_dataset_skips_and_counts_a_bad_image(tmp_path: Path, damage: str, kind: str, message: str) -> None:
    root = _spot_the_diff(tmp_path / "std")
    _damage_image(damage, root / "resized_images" / "2.png")
    ds = SpotTheDiff(root, "val", image_size=16)
    items = _items(ds)
    assert [it["id"] for it in items] == ["1"]
    assert ds.issues.counts == {kind: 1}
    assert message in "\n".join(ds.issues.examples[kind])


@pytest.mark.parametrize("modes", [("CMYK", "LA"), ("P", "I;16"), ("RGBA", "L"), ("1", "RGB")])
def test_unusual_image_modes_are_converted_not_errors(tmp_path: Path, modes: tuple[str, str]) -> None:
    ds = SpotTheDiff(_spot_the_diff(tmp_path / "std", modes), "val", image_size=16)
    items = _items(ds)
    assert len(items) == 2 and ds.issues.skipped == 0
    for item in items:
        for key in ("image1", "image2"):
            assert item[key].shape == (3, 16, 16) and item[key].dtype == torch.float32
            assert 0.0 <= float(item[key].min()) and float(item[key].max()) <= 1.0


def test_pixel_cap_is_an_option_and_checked_before_decoding(tmp_path: Path) -> None:
    root = _spot_the_diff(tmp_path / "std")
    _png(root / "resized_images" / "2.png", size=(120, 100))  # 12,000 pixels
    capped = SpotTheDiff(root, "val", image_size=16, max_image_pixels=10_000)
    assert len(_items(capped)) == 1 and capped.issues.counts == {"oversized_image": 1}
    assert "120x100 = 12,000 pixels is over the cap of 10,000" in capped.issues.examples["oversized_image"][0]
    assert len(_items(SpotTheDiff(root, "val", image_size=16, max_image_pixels=None))) == 2
    with pytest.raises(ImageTooLargeError, match=r"2\.png: 120x100"):
        SpotTheDiff(root, "val", image_size=16, max_image_pixels=10_000, on_error="raise")[1]
    # the bomb is refused from its header: opening it allocates nothing like its 196 MP, and PIL's limit is unchanged
    bomb = _bomb(tmp_path / "bomb.png")
    assert bomb.stat().st_size < 40_000
    with pytest.raises(ImageTooLargeError) as info:
        open_image(bomb)
    assert info.value.pixels == 196_000_000 and Image.MAX_IMAGE_PIXELS == 89_478_485


# ------------------------------------------------------------------------------------------------ annotation files


def _clevr_change(root: Path) -> Path:
    for folder, prefix in (("images", "default"), ("sc_images", "semantic"), ("nsc_images", "nonsemantic")):
        for n in (1, 2):
            _png(root / folder / f"CLEVR_{prefix}_{n:06d}.png")
    (root / "splits.json").write_text(json.dumps({"train": [1], "val": [2], "test": [2]}))
    caps = {f"CLEVR_default_{n:06d}.png": ["the cube moved"] for n in (1, 2)}
    (root / "change_captions.json").write_text(json.dumps(caps))
    (root / "no_change_captions.json").write_text(json.dumps(caps))
    return root


@pytest.mark.parametrize(
    ("file", "content", "message"),
    [
        ("splits.json", b'{"train": [1], "val": [2]}', r"splits\.json: missing key 'test'"),
        (
            "splits.json",
            b'{"train": [1], "test": [2,]}',
            # the reason is CPython's own: Python 3.13 names the trailing comma (and counts the column from it)
            r"splits\.json: invalid JSON at line 1, column 2[67]: (Expecting value|Illegal trailing comma before end)",
        ),
        (
            "change_captions.json",
            b'{"CLEVR_default_000002.png":\n ["the cube \xff moved"]}',
            r"change_captions\.json: not UTF-8: byte 0xff at line 2",
        ),
        ("change_captions.json", b'{"CLEVR_default_000002.png": "one string"}', "captions must be a list of strings"),
        ("change_captions.json", b"[1, 2]", r"expected an object \{image name: \[captions\]\}"),
    ],
)
def test_bad_annotation_file_is_an_error_naming_it(tmp_path: Path, file: str, content: bytes, message: str) -> None:
    root = _clevr_change(tmp_path / "cc")
    (root / file).write_bytes(content)
    with pytest.raises(AnnotationError, match=message) as info:
        ClevrChange(root, "test", image_size=16)
    assert str(root / file) in str(info.value) and "\n" not in str(info.value)


# ------------------------------------------------------------------------------------------------ corpus manifests


def _corpus(tmp_path: Path, n: int = 6) -> Path:
    generate_corpus(tmp_path / "corpus", n, image_size=32, seed=0, noise_rate=0.2)
    return tmp_path / "corpus" / "manifest.jsonl"


def _break_line(manifest: Path, case: str) -> tuple[int, str, str]:
    """Breaks manifest line 3 (or adds a line) as ``case``; returns (line number, issue kind, message)."""
    raw = manifest.read_bytes().splitlines(keepends=True)
    rec = json.loads(raw[2])
    kind, message = "malformed_line", ""
    if case == "not_utf8":
        raw[2] = raw[2].replace(b"first image", b"first \xe9 image")  # Latin-1 e-acute
        message = "not UTF-8: byte 0xe9"
    elif case == "invalid_json":
        raw[2] = raw[2][:40] + b"\n"
        message = "invalid JSON"
    elif case == "not_an_object":
        raw[2] = b'["a", "list"]\n'
        message = "expected a JSON object, got list"
    elif case == "off_template":
        raw[2] = json.dumps({**rec, "description": "A cat sat.", "desc1": None, "verb1": None}).encode() + b"\n"
        raw[2] = json.dumps({k: v for k, v in json.loads(raw[2]).items() if v is not None}).encode() + b"\n"
        kind, message = "off_template", ""
    elif case == "oversized_image":
        _bomb(manifest.parent / rec["image1"])
        kind, message = "oversized_image", "over the cap of 89,478,485 pixels"
    elif case == "missing_image":
        (manifest.parent / rec["image2"]).unlink()
        kind, message = "missing_image", "image2 not found"
    else:
        raise AssertionError(case)
    manifest.write_bytes(b"".join(raw))
    return 3, kind, message


MANIFEST_CASES = ["not_utf8", "invalid_json", "not_an_object", "off_template", "oversized_image", "missing_image"]


@pytest.mark.parametrize("case", MANIFEST_CASES)
def test_bad_manifest_line_is_skipped_and_counted_when_packing(tmp_path: Path, case: str) -> None:
    manifest = _corpus(tmp_path)
    line, kind, message = _break_line(manifest, case)
    report = pack_corpus(manifest, tmp_path / "shards", shard_size=4, progress=False)
    assert report.n_lines == 6 and report.n_samples == 5 and report.rejected == {kind: 1}
    assert report.examples[0].startswith(f"{manifest}:{line}: {kind}") and message in report.examples[0]


@pytest.mark.parametrize("case", MANIFEST_CASES)
def test_bad_manifest_line_is_skipped_and_counted_when_streaming(tmp_path: Path, case: str) -> None:
    manifest = _corpus(tmp_path)
    line, kind, _ = _break_line(manifest, case)
    ds = CorpusDataset(manifest, 16)
    assert len(list(ds)) == 5
    assert ds.issues.counts == {kind: 1} and ds.issues.seen == 6
    assert ds.issues.examples[kind][0].startswith(f"{manifest}:{line}:")


def test_duplicate_pair_id_is_packed_once(tmp_path: Path) -> None:
    manifest = _corpus(tmp_path)
    lines = manifest.read_text().splitlines()
    first = json.loads(lines[0])
    lines.append(json.dumps({**json.loads(lines[4]), "id": first["id"]}))
    manifest.write_text("\n".join(lines) + "\n")
    report = pack_corpus(manifest, tmp_path / "shards", shard_size=4, progress=False)
    assert report.n_samples == 6 and report.rejected == {"duplicate_id": 1}
    assert f"{manifest}:7: duplicate_id: id '{first['id']}' is taken by line 1" in report.examples
    again = pack_corpus(manifest, tmp_path / "shards", shard_size=4, progress=False)  # resumes: same decision
    assert again.n_resumed_shards == 2 and again.rejected == {"duplicate_id": 1}


# ------------------------------------------------------------------------------------------------ tar shards


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 pairs packed 4 per shard: shard-000000..2.tar, their sidecars and index.json."""
    tmp = tmp_path_factory.mktemp("packed")
    report = pack_corpus(_corpus(tmp, 12), tmp / "shards", shard_size=4, progress=False)
    assert report.n_samples == 12
    return tmp / "shards"


def _member_offsets(shard: Path) -> list[tuple[str, int, int]]:
    """(name, header offset, data end) of every member."""
    with tarfile.open(shard) as tar:
        return [(m.name, m.offset, m.offset_data + m.size) for m in tar.getmembers()]


def _copy_shard(
    packed: Path, out: Path, cut: Callable[[list[tuple[str, int, int]]], int], with_index: bool, with_sidecar: bool
) -> Path:
    out.mkdir()
    data = (packed / "shard-000001.tar").read_bytes()
    (out / "shard-000001.tar").write_bytes(data[: cut(_member_offsets(packed / "shard-000001.tar"))])
    if with_sidecar:
        (out / "shard-000001.json").write_bytes((packed / "shard-000001.json").read_bytes())
    if with_index:
        index = json.loads((packed / "index.json").read_text())
        index["shards"] = [e for e in index["shards"] if e["file"] == "shard-000001.tar"]
        (out / "index.json").write_text(json.dumps(index))
    return out / "shard-000001.tar"


# member i of shard 1: 0 json, 1 image1, 2 image2 of its first sample; 3-5 the second sample; ...
CUTS = {
    "inside_image_of_sample_2": (lambda m: m[4][1] + 700, 1),  # sample 2 half read: 1 yielded
    "at_boundary_after_sample_2": (lambda m: m[6][1], 2),  # cut exactly before sample 3: samples 1, 2 yielded
    "at_boundary_inside_sample_2": (lambda m: m[4][1], 1),  # sample 2 has only its json: dropped
    "inside_a_header": (lambda m: m[6][1] + 100, 2),
}


@pytest.mark.parametrize("cut", sorted(CUTS))
@pytest.mark.parametrize(("with_index", "with_sidecar"), [(True, True), (False, True), (False, False)])
def test_truncated_shard_counts_exactly_the_samples_lost(
    packed: Path, tmp_path: Path, cut: str, with_index: bool, with_sidecar: bool
) -> None:
    cut_at, n_yielded = CUTS[cut]
    shard = _copy_shard(packed, tmp_path / "s", cut_at, with_index, with_sidecar)
    issues = DataIssues("t")
    groups = list(iter_tar_groups(shard, issues, shard_sizes([shard]).get(shard)))
    assert len(groups) == n_yielded and all({"json", "1.png", "2.png"} <= set(g) for _, g in groups)
    (example,) = issues.examples["corrupt_shard"]
    if with_index or with_sidecar:  # 4 samples expected: every one not yielded is counted
        assert issues.counts == {"corrupt_shard": 4 - n_yielded}
        assert f"{4 - n_yielded} of 4 samples lost" in example
    else:  # the tail is unknowable: the open sample, if one was cut, is the known minimum
        lost = 1 if cut in ("inside_image_of_sample_2", "at_boundary_inside_sample_2") else 0
        assert issues.counts == ({"corrupt_shard": lost} if lost else {})
        assert f"at least {lost} sample" in example and "unknowable without index.json" in example


def test_truncated_shard_in_the_dataset_counts_every_sample(packed: Path, tmp_path: Path) -> None:
    shard = _copy_shard(packed, tmp_path / "s", CUTS["at_boundary_after_sample_2"][0], True, False)
    ds = CorpusDataset(shard.parent, 16, load_images=False)
    assert len(list(ds)) == 2 and ds.issues.counts == {"corrupt_shard": 2} and ds.issues.seen == 4


@pytest.mark.parametrize("case", ["empty_tar", "zero_bytes", "missing_file", "not_a_tar"])
def test_empty_or_unreadable_shard(packed: Path, tmp_path: Path, case: str) -> None:
    out = tmp_path / "s"
    out.mkdir()
    shard = out / "shard-000000.tar"
    if case == "empty_tar":
        with tarfile.open(shard, "w"):
            pass
    elif case == "zero_bytes":
        shard.write_bytes(b"")
    elif case == "not_a_tar":
        shard.write_bytes(b"\x89PNG not a tar" * 100)
    expected = 0 if case == "empty_tar" else 4
    (out / "index.json").write_text(json.dumps({"shards": [{"file": shard.name, "samples": expected}]}))
    issues = DataIssues("t")
    assert list(iter_tar_groups(shard, issues, shard_sizes([shard]).get(shard))) == []
    if case == "empty_tar":
        assert issues.counts == {} and not issues.examples
    else:
        assert issues.counts == {"corrupt_shard": 4} and "0 of 4" not in issues.examples["corrupt_shard"][0]
        assert str(shard) in issues.examples["corrupt_shard"][0]


@pytest.mark.parametrize("content", [b'{"shards": [{"file": "shard-000000.tar",', b"\xff\xfe", b'{"shards": 3}'])
def test_unreadable_index_falls_back_to_the_shards_and_their_sidecars(
    packed: Path, tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "s"
    out.mkdir()
    for f in packed.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    (out / "index.json").write_bytes(content)
    shards = list_shards(out)
    assert [p.name for p in shards] == [f"shard-{i:06d}.tar" for i in range(3)]
    assert "index.json is unreadable" in caplog.text
    assert shard_sizes(shards) == dict.fromkeys(shards, 4)  # from the sidecars
    with pytest.raises(FileNotFoundError, match="no shards"):
        list_shards(tmp_path)


# ------------------------------------------------------------------------------------------------ saved models


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("saved") / "model"
    create_model("namc_tiny", pretraining=False, image_size=32).save_pretrained(
        folder, card={"training_data": "shapes world, 6 pairs", "metrics": {"val/cider": 0.5}}
    )
    return folder


def _copy_model(saved: Path, out: Path) -> Path:
    out.mkdir(parents=True)
    for f in saved.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    return out


def _flip_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) - 1000] ^= 0x10  # inside the last tensor's bytes, not the header
    path.write_bytes(bytes(data))


def _pickle_weights(path: Path) -> None:
    torch.save({"weights": torch.zeros(2), "args": __import__("argparse").Namespace(lr=1)}, path)


def _config_edit(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        cfg = json.loads(path.read_text())
        change(cfg)
        path.write_text(json.dumps(cfg, indent=2))

    return edit


MODEL_CASES = {
    # case: (file, damage, error type, message)
    "bit_flip": ("model.safetensors", _flip_bit, WeightsError, r"does not match the SHA-256 recorded in .*: recorded"),
    "truncated_weights": (
        "model.safetensors",
        lambda p: p.write_bytes(p.read_bytes()[:5000]),
        WeightsError,
        r"recorded [0-9a-f]{64} \(\d+ bytes\), file [0-9a-f]{64} \(5000 bytes\)",
    ),
    "zero_byte_weights": ("model.safetensors", lambda p: p.write_bytes(b""), WeightsError, r"\(0 bytes\)"),
    "pickle_as_weights": ("model.safetensors", _pickle_weights, WeightsError, "does not match the SHA-256"),
    "tokenizer_missing": ("tokenizer.json", Path.unlink, WeightsError, r"tokenizer\.json is missing"),
    "config_syntax": (
        "config.json",
        lambda p: p.write_text(p.read_text().replace('"dim": 128,', '"dim": 128')),
        ConfigError,
        r"config\.json: invalid JSON at line \d+, column \d+: Expecting ',' delimiter",
    ),
    "config_unknown_key": (
        "config.json",
        _config_edit(lambda c: c.update(dimm=3)),
        ConfigError,
        r"config\.json: unknown keys \['dimm'\]",
    ),
    "config_wrong_type": (
        "config.json",
        _config_edit(lambda c: c.update(dim="128")),
        ConfigError,
        r"config\.json: key 'dim' must be int, got str '128'",
    ),
    "config_not_utf8": (
        "config.json",
        lambda p: p.write_bytes(p.read_bytes().replace(b'"namc_tiny"', b'"namc_t\xefny"')),
        ConfigError,
        r"config\.json: not UTF-8: byte 0xef at line 3, column 18",
    ),
    "config_of_another_preset": (
        "config.json",
        _config_edit(lambda c: c.update(dim=64)),
        WeightsError,
        r"cannot load NAMC weights from .*shape mismatch",
    ),
}


@pytest.mark.parametrize("case", sorted(MODEL_CASES))
def test_damaged_model_folder_is_an_error_naming_the_file(saved: Path, tmp_path: Path, case: str) -> None:
    file, damage, error, message = MODEL_CASES[case]
    folder = _copy_model(saved, tmp_path / "m")
    damage(folder / file)
    with pytest.raises(error, match=message) as info:
        NAMC.from_pretrained(folder)
    assert str(folder) in str(info.value) and "\n" not in str(info.value)


def test_bit_flip_without_verification_loads_different_weights(saved: Path, tmp_path: Path) -> None:
    """verify=False is the only way past a damaged file, and it shows why the digest is there."""
    folder = _copy_model(saved, tmp_path / "m")
    _flip_bit(folder / "model.safetensors")
    damaged, good = NAMC.from_pretrained(folder, verify=False), NAMC.from_pretrained(saved)
    differ = [k for k, v in good.state_dict().items() if not torch.equal(v, damaged.state_dict()[k])]
    assert len(differ) == 1


def test_model_folder_records_digests_and_a_card(saved: Path) -> None:
    cfg = json.loads((saved / "config.json").read_text())
    assert set(cfg["files"]) == {"model.safetensors", "tokenizer.json"}
    assert cfg["files"]["model.safetensors"]["bytes"] == (saved / "model.safetensors").stat().st_size
    card = (saved / "README.md").read_text()
    for text in (
        "library_name: namc",
        "| preset | `namc_tiny` |",
        "| image size | 32 x 32 px",
        "| tokenizer | word,",
        "| FDG caption decoder |",
        "shapes world, 6 pairs",
        "| val/cider | 0.5 |",
        cfg["files"]["model.safetensors"]["sha256"],
    ):
        assert text in card
    with pytest.raises(ValueError, match=r"unknown model card keys \['metric'\]"):
        create_model("namc_tiny", pretraining=False).save_pretrained(saved.parent / "x", card={"metric": {}})
    assert not (saved.parent / "x" / "model.safetensors").exists()  # refused before writing anything


def test_model_saved_before_digests_still_loads_strictly(caplog: pytest.LogCaptureFixture) -> None:
    assert "files" not in json.loads((GOLDEN / "namc_tiny" / "config.json").read_text())  # predates the digests
    expected = json.loads((GOLDEN / "expected.json").read_text())
    with caplog.at_level("INFO", logger="namc.models.namc"):
        model = NAMC.from_pretrained(GOLDEN / "namc_tiny")
    assert "records no SHA-256 digests" in caplog.text
    g = torch.Generator().manual_seed(123)  # the inputs of tests/test_golden.py
    x1, x2 = torch.rand(3, 3, 64, 64, generator=g), torch.rand(3, 3, 64, 64, generator=g)
    assert model.generate_ids(x1, x2).tolist() == expected["ids"]


@pytest.mark.parametrize(
    "case", ["pickle_objects", "not_a_checkpoint", "truncated", "safetensors_file", "no_tokenizer", "bad_config"]
)
def test_bad_checkpoint_file(saved: Path, tmp_path: Path, case: str) -> None:
    path = tmp_path / "model.ckpt"
    model = load_model(saved)
    entry = checkpoint_entry(model.config, model.tokenizer, "0")
    if case in ("no_tokenizer", "bad_config"):  # a namc entry that is not what namc writes: its key named
        if case == "no_tokenizer":
            del entry["tokenizer"]
            error, message = ConfigError, r"\['namc'\]: expected a tokenizer object, got NoneType"
        else:
            entry["config"]["dim"] = "wide"
            error, message = ConfigError, r"\['namc'\]\['config'\].*dim"
        torch.save({"state_dict": {}, "namc": entry}, path)
    elif case == "pickle_objects":
        torch.save({"state_dict": {}, "namc": {}, "hparams": __import__("argparse").Namespace(lr=1)}, path)
        error, message = WeightsError, r"refused the Python object argparse\.Namespace"
    elif case == "not_a_checkpoint":
        torch.save({"state_dict": {"w": torch.zeros(1)}}, path)
        error, message = ValueError, "is not a namc Lightning checkpoint"
    elif case == "truncated":
        torch.save({"state_dict": {"w": torch.zeros(1000)}, "namc": {}}, path)
        path.write_bytes(path.read_bytes()[:2000])
        error, message = WeightsError, "cannot read checkpoint"
    else:
        path = saved / "model.safetensors"
        error, message = ValueError, "holds weights only: pass the folder"
    with pytest.raises(error, match=message) as info:
        load_model(path)
    assert str(path) in str(info.value)


# ------------------------------------------------------------------------------------------------ namc describe


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("pair")
    return _png(tmp / "a.png", (32, 32)), _png(tmp / "b.png", (32, 32), value=200)


def _describe_case(  # noqa: C901 - one flat branch per case, read as a table
    case: str, saved: Path, pair: tuple[Path, Path], tmp: Path
) -> tuple[list[str], int, str]:
    """(argv after ``describe``, exit code, message) of one case."""
    a, b = str(pair[0]), str(pair[1])
    model = str(saved)
    if case == "image_is_a_directory":
        return [str(tmp), b, "--model", model], 2, f"{tmp} is a directory, not an image file"
    if case == "image_missing":
        return [a, str(tmp / "nope.png"), "--model", model], 2, "image not found"
    if case == "image_corrupt":
        (tmp / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n cut")
        return [a, str(tmp / "bad.png"), "--model", model], 1, f"cannot read image {tmp / 'bad.png'}"
    if case == "image_oversized":
        return [a, str(_bomb(tmp / "bomb.png")), "--model", model], 1, "is over the cap of 89,478,485 pixels"
    if case == "model_preset_name":
        return [a, b, "--model", "namc_tiny"], 2, "is a preset name, which has no trained weights"
    if case == "model_missing":
        return [a, b, "--model", str(tmp / "nothing")], 2, f"no saved model at {tmp / 'nothing'}"
    folder = _copy_model(saved, tmp / "m")
    if case == "model_of_another_preset":
        _config_edit(lambda c: c.update(dim=64, heads=4))(folder / "config.json")
        return [a, b, "--model", str(folder)], 1, "shape mismatch"
    if case == "weights_truncated":
        (folder / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes()[:5000])
        return [a, b, "--model", str(folder)], 1, "does not match the SHA-256"
    if case == "config_syntax_error":
        (folder / "config.json").write_text('{"name": "namc_tiny",\n "dim": }')
        return [a, b, "--model", str(folder)], 1, "config.json: invalid JSON at line 2, column 9: Expecting value"
    if case == "pickle_checkpoint":
        _pickle_weights(tmp / "evil.ckpt")
        return [a, b, "--model", str(tmp / "evil.ckpt")], 1, "refused the Python object argparse.Namespace"
    if case == "max_new_tokens_negative":
        return [a, b, "--model", model, "--max-new-tokens", "-1"], 2, "--max-new-tokens: must be at least 1"
    if case == "max_new_tokens_over_the_model":
        return [a, b, "--model", model, "--max-new-tokens", "500"], 2, "this model generates at most"
    if case == "beams_zero":
        return [a, b, "--model", model, "--beams", "0"], 2, "--beams: must be at least 1"
    if case == "device_cuda_without_gpu":
        return [a, b, "--model", model, "--device", "cuda"], 2, "no CUDA device is available"
    if case == "device_unknown":
        return [a, b, "--model", model, "--device", "tpu9"], 2, "not a device: 'tpu9'"
    if case == "vocabulary_missing":
        return [a, b, "--model", model, "--vocabulary", str(tmp / "v.txt")], 2, f"captions file not found: {tmp}"
    if case == "vocabulary_not_utf8":
        (tmp / "v.txt").write_bytes(b"a red cube\nthe \xff sphere\n")
        return [a, b, "--model", model, "--vocabulary", str(tmp / "v.txt")], 1, "v.txt: line 2 is not UTF-8 text"
    if case == "vocabulary_blank":
        (tmp / "v.txt").write_text("\n  \n")
        return [a, b, "--model", model, "--vocabulary", str(tmp / "v.txt")], 1, "v.txt: no captions"
    if case == "shortlist_none_saved":
        return [a, b, "--model", model, "--shortlist"], 2, "has no training shortlist (shortlist.json"
    if case == "shortlist_and_vocabulary":
        (tmp / "v.txt").write_text("a red cube\n")
        argv = [a, b, "--model", model, "--shortlist", "--vocabulary", str(tmp / "v.txt")]
        return argv, 2, "argument --vocabulary: not allowed with argument --shortlist"
    if case == "shortlist_tampered":
        net = load_model(folder)
        net.training_shortlist = net.shortlist(["a red cube"])
        net.save_pretrained(folder)
        (folder / "shortlist.json").write_text((folder / "shortlist.json").read_text().replace("[", "[7, ", 1))
        return [a, b, "--model", str(folder), "--shortlist"], 1, "shortlist.json does not match the SHA-256"
    raise AssertionError(case)


DESCRIBE_CASES = [
    "image_is_a_directory",
    "image_missing",
    "image_corrupt",
    "image_oversized",
    "model_preset_name",
    "model_missing",
    "model_of_another_preset",
    "weights_truncated",
    "config_syntax_error",
    "pickle_checkpoint",
    "max_new_tokens_negative",
    "max_new_tokens_over_the_model",
    "beams_zero",
    "device_cuda_without_gpu",
    "device_unknown",
    "vocabulary_missing",
    "vocabulary_not_utf8",
    "vocabulary_blank",
    "shortlist_none_saved",
    "shortlist_and_vocabulary",
    "shortlist_tampered",
]


@pytest.mark.parametrize("case", DESCRIBE_CASES)
def test_describe_gives_one_line_and_the_exit_code(
    saved: Path, pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture, case: str
) -> None:
    if case == "device_cuda_without_gpu" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    argv, code, message = _describe_case(case, saved, pair, tmp_path)
    try:
        got = namc_main(["describe", *argv])
    except SystemExit as exit_:  # argparse's usage errors
        got = exit_.code
    err = capsys.readouterr().err
    assert got == code
    last = err.strip().splitlines()[-1]
    assert last.startswith("namc describe: error: ") and message in last, err
    assert "Traceback" not in err


@pytest.mark.slow  # a fresh interpreter imports torch (seconds); the cases above cover every message in-process
def test_describe_in_a_process_prints_no_traceback(saved: Path, pair: tuple[Path, Path], tmp_path: Path) -> None:
    _pickle_weights(tmp_path / "evil.ckpt")
    argv = [str(pair[0]), str(pair[1]), "--model", str(tmp_path / "evil.ckpt")]
    proc = subprocess.run(
        [sys.executable, "-m", "namc.cli", "describe", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=REPO,
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("namc describe: error: cannot read checkpoint")


# ------------------------------------------------------------------------------------------------ training CLI


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--ckpt_path", "https://example.com/last.ckpt"], "refusing --ckpt_path https://example.com/last.ckpt"),
        (["--ckpt_path", "HTTP://example.com/last.ckpt", "--weights_only", "true"], "Lightning downloads a remote"),
        (["--weights_only", "false"], "refusing --weights_only false: it unpickles the checkpoint"),
    ],
)
def test_training_cli_refuses_unsafe_checkpoint_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture, options: list[str], message: str
) -> None:
    config = REPO / "configs" / "finetune" / "clevr_change.yaml"
    assert namc_main(["validate", "--config", str(config), *options]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("namc validate: error: ") and message in err[-1]
    assert "--allow_unsafe_checkpoint true" in err[-1]


def test_training_cli_names_a_missing_or_damaged_checkpoint(saved: Path, tmp_path: Path, capsys) -> None:
    config = REPO / "configs" / "finetune" / "clevr_change.yaml"
    model = load_model(saved)
    torch.save(
        {"state_dict": model.state_dict(), "namc": checkpoint_entry(model.config, model.tokenizer, "0")},
        tmp_path / "whole.ckpt",
    )
    (tmp_path / "cut.ckpt").write_bytes((tmp_path / "whole.ckpt").read_bytes()[:5000])
    for path, message in ((tmp_path / "nope.ckpt", "no saved model at"), (tmp_path / "cut.ckpt", "cannot read")):
        assert namc_main(["test", "--config", str(config), "--ckpt_path", str(path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("namc test: error: ") and message in err[-1] and str(path) in err[-1], err[-1]


def test_training_cli_names_a_wrong_int8_kernels_choice(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """NAMC_INT8_KERNELS is read where a run first evaluates in int8, deep in it: the CLI checks it before building."""
    monkeypatch.setenv("NAMC_INT8_KERNELS", "int4")
    config = REPO / "configs" / "finetune" / "clevr_change.yaml"
    assert namc_main(["test", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err == "namc test: error: NAMC_INT8_KERNELS='int4': expected 'quantized' or 'plain'\n", err


@pytest.mark.parametrize(
    ("config", "outcome"),
    [
        ({"ckpt_path": "last", "weights_only": None}, True),  # made explicit: no env variable can turn it off
        ({"ckpt_path": "runs/x/last.ckpt", "weights_only": True}, True),
        ({"ckpt_path": "s3://bucket/last.ckpt", "weights_only": None}, True),
        ({"ckpt_path": "https://e.com/a.ckpt", "weights_only": False, "allow_unsafe_checkpoint": True}, False),
        ({"ckpt_path": "https://e.com/a.ckpt", "weights_only": None}, UnsafeCheckpointError),
        ({"ckpt_path": None, "weights_only": False}, UnsafeCheckpointError),
    ],
)
def test_checkpoint_safety_rule(config: dict, outcome: object) -> None:
    config = dict(config)
    if outcome is UnsafeCheckpointError:
        with pytest.raises(UnsafeCheckpointError):
            check_checkpoint_safety(config)
        return
    check_checkpoint_safety(config)
    assert config["weights_only"] is outcome


def test_codes_array_in_a_manifest_can_still_be_read(tmp_path: Path) -> None:
    """Bytes decoding of the manifest keeps numpy codes paths and non-ASCII text working."""
    manifest = _corpus(tmp_path)
    lines = [json.loads(x) for x in manifest.read_text().splitlines()]
    np.save(manifest.parent / "c.npy", np.zeros((2, 4), dtype=np.int64))
    lines[0]["codes"] = "c.npy"
    lines[1]["source"] = "naïve-säurce"
    manifest.write_bytes(("\r\n".join(json.dumps(x, ensure_ascii=False) for x in lines) + "\r\n").encode())
    ds = CorpusDataset(manifest, 16)
    samples = list(ds)
    assert len(samples) == 6 and ds.issues.skipped == 0
    assert samples[0]["codes1"].tolist() == [0, 0, 0, 0] and samples[1]["source"] == "naïve-säurce"
