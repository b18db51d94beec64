"""Image sources, image references and ``namc curate index``: each reader on a tiny dataset in its published layout
(written here with pyarrow, tarfile and plain files), bad input skipped and counted, and ``namc data pack`` reading
tar references."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from namc.curate.cli import main as curate_main
from namc.curate.index import build_index
from namc.curate.sources import SourceSpec
from namc.data.corpus import pack_corpus
from namc.data.refs import RefError, parse_ref, read_ref, rebase_ref, ref_ext

GOOD = (
    "The difference between the two images is that the first image shows a red cube, while the second image shows {}."
)


def _jpeg(seed: int, size: tuple[int, int] = (24, 16), mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    img = Image.fromarray(arr).convert(mode)
    buf = io.BytesIO()
    img.save(buf, format="JPEG" if mode in ("RGB", "L", "CMYK") else "PNG")
    return buf.getvalue()


def _png(seed: int, size: tuple[int, int] = (16, 16)) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((size[1], size[0], 3), seed % 256, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


# -- image references -------------------------------------------------------------------------------------------------


def test_refs_path_tar_parquet(tmp_path: Path) -> None:
    (tmp_path / "a.jpg").write_bytes(b"plain")
    with tarfile.open(tmp_path / "00000.tar", "w") as tar:
        _add(tar, "000000001.jpg", b"member")
    table = pa.table(
        {
            "img": pa.array([{"bytes": b"cell0", "path": None}, {"bytes": b"cell1", "path": "x.png"}]),
            "raw": pa.array([b"\x89PNG-raw", b"r1"]),
        }
    )
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=1)
    assert read_ref("a.jpg", tmp_path) == b"plain"
    assert read_ref(str(tmp_path / "a.jpg")) == b"plain"
    assert read_ref("00000.tar::000000001.jpg", tmp_path) == b"member"
    assert read_ref("t.parquet::1::img", tmp_path) == b"cell1"
    assert read_ref("t.parquet::0::raw", tmp_path) == b"\x89PNG-raw"
    assert parse_ref("dir/x.jpg::odd").kind == "path" and parse_ref("f.parquet::x::img").kind == "path"
    assert ref_ext("s.tar::k.JPEG") == "jpg" and ref_ext("t.parquet::0::raw", b"\x89PNG-raw") == "png"
    assert rebase_ref("imgs/a.jpg", tmp_path / "w", tmp_path) == "w/imgs/a.jpg"
    assert rebase_ref("s.tar::m.jpg", tmp_path / "w", tmp_path / "v") == "../w/s.tar::m.jpg"
    for bad, err, text in [
        ("00000.tar::nope.jpg", FileNotFoundError, "nope.jpg"),
        ("t.parquet::5::img", FileNotFoundError, "no row 5"),
        ("t.parquet::0::missing", RefError, "no column 'missing'"),
        ("gone.tar::x.jpg", FileNotFoundError, "gone.tar"),
        ("a.jpg.missing", FileNotFoundError, "a.jpg.missing"),
    ]:
        with pytest.raises(err, match=text):
            read_ref(bad, tmp_path)
    (tmp_path / "bad.tar").write_bytes(b"not a tar at all" * 40)
    with pytest.raises(RefError, match="bad.tar::x.jpg"):
        read_ref("bad.tar::x.jpg", tmp_path)


def test_pack_reads_tar_refs(tmp_path: Path) -> None:
    shard = tmp_path / "imgs" / "00000.tar"
    shard.parent.mkdir()
    images = {f"{i:09d}.jpg": _jpeg(i) for i in range(4)}
    with tarfile.open(shard, "w") as tar:
        for name, data in images.items():
            _add(tar, name, data)
    records = [
        {
            "id": "p0",
            "source": "cc3m",
            "image1": "imgs/00000.tar::000000000.jpg",
            "image2": "imgs/00000.tar::000000001.jpg",
            "description": GOOD.format("a blue cube"),
        },
        {
            "id": "p1",
            "source": "cc3m",
            "image1": str(shard) + "::000000002.jpg",
            "image2": "imgs/00000.tar::000000003.jpg",
            "description": GOOD.format("a green cube"),
        },
        {
            "id": "p2",
            "source": "cc3m",
            "image1": "imgs/00000.tar::000000009.jpg",
            "image2": "imgs/00000.tar::000000003.jpg",
            "description": GOOD.format("a cube"),
        },
    ]
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in records))
    report = pack_corpus(manifest, tmp_path / "shards", shard_size=10, progress=False)
    assert report.n_samples == 2 and report.rejected == {"missing_image": 1}
    assert "000000009.jpg" in report.examples[0]
    with tarfile.open(tmp_path / "shards" / report.shards[0]) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".jpg")}
    assert got["000000000.1.jpg"] == images["000000000.jpg"] and got["000000001.2.jpg"] == images["000000003.jpg"]


# -- sources ----------------------------------------------------------------------------------------------------------


def _ip2p_folder(root: Path) -> None:
    for i, (edit, seeds) in enumerate([("make it snowy", [11, 12]), ("add a dog", [13])]):
        folder = root / f"{i:07d}"
        folder.mkdir(parents=True)
        (folder / "prompt.json").write_text(json.dumps({"input": f"a photo {i}", "edit": edit, "output": f"snow {i}"}))
        for s in seeds:
            (folder / f"{s}_0.jpg").write_bytes(_jpeg(s))
            (folder / f"{s}_1.jpg").write_bytes(_jpeg(s + 100))
    (root / "0000001" / "13_1.jpg").unlink()  # a pair without its after image
    bad = root / "0000002"
    bad.mkdir()
    (bad / "prompt.json").write_bytes(b"\xff\xfe not json")
    (bad / "5_0.jpg").write_bytes(_jpeg(5))


def test_ip2p_folder(tmp_path: Path) -> None:
    root = tmp_path / "clip-filtered-dataset"
    _ip2p_folder(root)
    report = build_index([{"name": "ip2p", "kind": "ip2p_folder", "root": str(root)}], tmp_path / "w", progress=False)
    pairs = _lines(tmp_path / "w" / "source_pairs.jsonl")
    assert [p["id"] for p in pairs] == ["ip2p/0000000/11", "ip2p/0000000/12"]
    assert pairs[0]["instruction"] == "make it snowy" and pairs[0]["caption1"] == "a photo 0"
    assert pairs[0]["caption2"] == "snow 0" and pairs[0]["key1"] == "ip2p/0000000/11/1"
    assert read_ref(pairs[1]["image2"]) == _jpeg(112)
    assert report.issues.counts == {"missing_image": 1, "malformed_line": 1}
    assert (tmp_path / "w" / "images.jsonl").read_text() == ""
    # seeds.json (edit_dataset.py's index) is used when present; a repeated entry is a duplicate key
    (root / "seeds.json").write_text(json.dumps([["0000000", [12]], ["0000000", [12, 11]]]))
    report = build_index([SourceSpec.parse("ip2p_folder:" + str(root))], tmp_path / "w2", progress=False)
    assert [p["id"] for p in _lines(tmp_path / "w2" / "source_pairs.jsonl")] == [
        "ip2p_folder/0000000/12",
        "ip2p_folder/0000000/11",
    ]
    assert report.issues.counts == {"duplicate_id": 1}


def test_ip2p_parquet_in_row_batches(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    rows = 5
    table = pa.table(
        {
            "original_prompt": [f"before {i}" for i in range(rows)],
            "original_image": [{"bytes": _jpeg(i), "path": None} for i in range(rows)],
            "edit_prompt": [f"edit {i}" for i in range(rows)],
            "edited_prompt": [f"after {i}" for i in range(rows)],
            "edited_image": [{"bytes": _jpeg(50 + i), "path": None} if i != 3 else None for i in range(rows)],
        }
    )
    path = data / "train-00000-of-00001.parquet"
    pq.write_table(table, path, row_group_size=2)
    spec = {"name": "ip2p", "kind": "ip2p_parquet", "root": str(tmp_path), "batch_rows": 2}
    report = build_index([spec], tmp_path / "w", progress=False)
    pairs = _lines(tmp_path / "w" / "source_pairs.jsonl")
    assert [p["id"] for p in pairs] == [f"ip2p/train-00000-of-00001/{i}" for i in (0, 1, 2, 4)]
    assert pairs[3]["image2"] == f"{path.absolute()}::4::edited_image"
    assert read_ref(pairs[3]["image2"]) == _jpeg(54) and read_ref(pairs[0]["image1"]) == _jpeg(0)
    assert pairs[2]["instruction"] == "edit 2" and pairs[2]["caption2"] == "after 2"
    assert report.issues.counts == {"missing_image": 1}
    # --verify none reads the text columns only and lists every row
    report = build_index([spec], tmp_path / "w2", verify="none", progress=False)
    assert report.pairs == 5


def _cc3m_shards(root: Path) -> None:
    root.mkdir()
    with tarfile.open(root / "00000.tar", "w") as tar:
        for i in range(3):
            key = f"{i:09d}"
            _add(tar, f"{key}.jpg", _jpeg(i))
            _add(tar, f"{key}.txt", f"caption {i}".encode())
            _add(tar, f"{key}.json", json.dumps({"caption": f"caption {i}", "status": "success"}).encode())
        _add(tar, "000000003.jpg", b"\xff\xd8 corrupt jpeg")
        _add(tar, "000000003.txt", b"broken")
        _add(tar, "000000004.txt", b"no image")  # img2dataset failure: a sample without its image
        _add(tar, "000000005.JPG", _jpeg(5, mode="L"))  # grey: kept, counted as non-RGB; an upper-case extension
        _add(tar, "000000006.jpg", _jpeg(6, size=(300, 200)))  # over the test's pixel cap
    with tarfile.open(root / "00001.tar", "w") as tar:
        for i in range(10, 14):
            _add(tar, f"{i:09d}.jpg", _jpeg(i, size=(64, 64)))
    with tarfile.open(root / "00001.tar") as tar:
        cut = tar.getmembers()[2].offset_data + 100
    raw = (root / "00001.tar").read_bytes()
    (root / "00001.tar").write_bytes(raw[:cut])  # truncated inside the third member


def test_webdataset_shards_and_captions(tmp_path: Path) -> None:
    root = tmp_path / "cc3m"
    _cc3m_shards(root)
    captions = tmp_path / "recap.jsonl"
    captions.write_bytes(
        b'{"key": "000000001", "caption": "a long recaption"}\n'
        b'{"key": "cc3m/000000002", "caption": "full key wins"}\n'
        b'{"key": "000000002", "caption": "local key"}\n'
        b"\xff not utf-8\n"
    )
    spec = {"name": "cc3m", "kind": "webdataset", "root": str(root), "captions": str(captions)}
    report = build_index([spec], tmp_path / "w", max_image_pixels=40_000, progress=False)
    lines = _lines(tmp_path / "w" / "images.jsonl")
    keys = [x["key"] for x in lines]
    assert keys[:4] == ["cc3m/000000000", "cc3m/000000001", "cc3m/000000002", "cc3m/000000005"]
    assert keys[4:] == ["cc3m/000000010", "cc3m/000000011"]  # the truncated shard's members before the damage
    assert [x.get("caption") for x in lines[:4]] == ["caption 0", "a long recaption", "full key wins", None]
    assert lines[0]["image"] == f"{(root / '00000.tar').absolute()}::000000000.jpg"
    assert lines[3]["image"].endswith("::000000005.JPG") and read_ref(lines[3]["image"]) == _jpeg(5, mode="L")
    counts = report.issues.counts
    assert counts["corrupt_image"] == 1 and counts["incomplete_sample"] == 1 and counts["oversized_image"] == 1
    assert counts["corrupt_shard"] == 1 and counts["malformed_line"] == 1
    assert report.modes == {"L": 1} and report.images == 6
    summary = json.loads((tmp_path / "w" / "index_summary.json").read_text())
    assert summary["images"] == 6 and summary["skipped"] == counts


def test_image_tsv_and_folder(tmp_path: Path) -> None:
    imgs = tmp_path / "imgs"
    (imgs / "sub").mkdir(parents=True)
    (imgs / "a.jpg").write_bytes(_jpeg(1))
    (imgs / "sub" / "b.png").write_bytes(_png(2))
    (imgs / "sub" / "b.txt").write_text("a caption beside b")
    (imgs / "empty.jpg").write_bytes(b"")
    (imgs / "trunc.png").write_bytes(_png(3)[:40])
    (imgs / "notes.md").write_text("not an image")
    tsv = tmp_path / "captions.tsv"
    tsv.write_bytes(b"filepath\tcaption\na.jpg\ta cat\nsub/b.png\t\nmissing.jpg\tgone\n\xff\xfe\tbad\n")
    sources = [
        {"name": "tsv", "kind": "image_tsv", "root": str(imgs), "tsv": str(tsv)},
        {"name": "mine", "kind": "image_folder", "root": str(imgs)},
    ]
    report = build_index(sources, tmp_path / "w", progress=False)
    lines = _lines(tmp_path / "w" / "images.jsonl")
    assert [(x["key"], x.get("caption")) for x in lines] == [
        ("tsv/a.jpg", "a cat"),
        ("tsv/sub/b.png", None),
        ("mine/a.jpg", None),
        ("mine/sub/b.png", "a caption beside b"),
    ]
    assert report.per_source == {"tsv": 2, "mine": 2}
    assert report.issues.counts == {"missing_image": 1, "malformed_line": 1, "corrupt_image": 2}


def test_spot_the_diff_pairs(tmp_path: Path) -> None:
    root = tmp_path / "std"
    (root / "annotations").mkdir(parents=True)
    (root / "resized_images").mkdir()
    entries = [{"img_id": "1", "sentences": ["the car is gone", "a man appears."]}, {"img_id": "2", "sentences": [""]}]
    entries.append({"img_id": "3", "sentences": ["x"]})
    (root / "annotations" / "train.json").write_text(json.dumps(entries))
    for name in ("1.png", "1_2.png", "2.png", "2_2.png", "3.png"):
        (root / "resized_images" / name).write_bytes(_png(len(name)))
    report = build_index([{"name": "std", "kind": "spot_the_diff", "root": str(root)}], tmp_path / "w", progress=False)
    pairs = _lines(tmp_path / "w" / "source_pairs.jsonl")
    assert [(p["id"], p["difference"]) for p in pairs] == [("std/1", "the car is gone. a man appears.")]
    assert report.issues.counts == {"empty_captions": 1, "missing_image": 1}


def test_index_cli_with_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    for i in range(3):
        (imgs / f"{i}.png").write_bytes(_png(i))
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        f"workdir: {tmp_path / 'w'}\nsources:\n  - {{name: own, kind: image_folder, root: {imgs}}}\n"
        "index:\n  verify: full\n"
    )
    assert _exit_status(["index", "--config", str(config), "--print_config"]) == 0  # prints, exits like --help
    assert "verify: full" in capsys.readouterr().out
    assert curate_main(["index", "--config", str(config), "--no_progress"]) == 0
    assert "indexed 3 images and 0 pairs" in capsys.readouterr().out
    assert [x["key"] for x in _lines(tmp_path / "w" / "images.jsonl")] == ["own/0.png", "own/1.png", "own/2.png"]
    bad = ["index", "--workdir", str(tmp_path / "v"), "--no_progress", "--sources"]
    assert curate_main([*bad, f"x=image_folder:{imgs / 'nope'}"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("namc curate index:") and "nope" in err and "\n" not in err
    assert curate_main([*bad, "nokind:/x"]) == 1
    assert "unknown kind 'nokind'" in capsys.readouterr().err


def _exit_status(argv: list[str]) -> int:
    """The status a step's ``--print_config`` or YAML error exits with (argparse's way: SystemExit)."""
    with pytest.raises(SystemExit) as end:
        curate_main(argv)
    return int(end.value.code or 0)


def test_a_pipeline_yaml_error_is_one_line_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "pipeline.yaml"
    config.write_text("index:\n  verfy: full\n")
    assert _exit_status(["index", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("namc curate index: error:") and f"{config}: section 'index' has unknown key 'verfy'" in err
    config.write_text("index: [not, a, mapping]\n")
    assert _exit_status(["index", "--config", str(config)]) == 2
    assert str(config) in capsys.readouterr().err.strip().splitlines()[-1]
    config.write_text("describe:\n  pairs: [p.jsonl]\n  concurrency: sixteen\n")  # a value of the wrong type
    assert _exit_status(["describe", "--config", str(config)]) == 2
    assert f"{config}: describe.concurrency: 'sixteen'" in capsys.readouterr().err.strip().splitlines()[-1]
    config.write_text(f"describe:\n  pairs: {tmp_path / 'p.jsonl'}\n  out: {tmp_path / 'd.jsonl'}\n")
    (tmp_path / "p.jsonl").write_text("")  # one file for a list option: a list of one
    assert _exit_status(["describe", "--config", str(config), "--print_config"]) == 0
    assert f"pairs:\n  - {tmp_path / 'p.jsonl'}\n" in capsys.readouterr().out


def test_pipeline_yaml_parses_for_index_and_pairs(capsys: pytest.CaptureFixture[str]) -> None:
    config = Path(__file__).resolve().parents[1] / "configs" / "curate" / "pipeline.yaml"
    assert _exit_status(["index", "--config", str(config), "--print_config"]) == 0
    out = capsys.readouterr().out
    assert "kind: ip2p_folder" in out and "verify: full" in out
    assert _exit_status(["pairs", "--config", str(config), "--print_config"]) == 0
    out = capsys.readouterr().out
    assert "tau_max: 0.95" in out and "tau_min_dino: 0.78" in out and "set_test: topk" in out
