"""``namc curate embed``: tiny CLIP / DINOv2 (the real architectures at tiny widths, saved in the official layouts)
over real photos (scikit-image) and bad input, through Lightning predict; the shard format; kill and resume."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import open_clip
import pytest
import timm
import torch
from PIL import Image

from namc.curate.encoders import TINY_CLIP_CONFIG, TINY_DINO_KWARGS, build_clip, build_dino
from namc.curate.features import (
    FeaturesError,
    load_features,
    read_meta,
    shard_path,
    tally,
    write_meta,
    write_shard,
)
from namc.models.files import WeightsError
from namc.models.io import save_safetensors

ROOT = Path(__file__).resolve().parents[1]


def _weights(folder: Path) -> tuple[Path, Path]:
    torch.manual_seed(0)
    clip = folder / "open_clip_model.safetensors"
    save_safetensors(open_clip.CLIP(**TINY_CLIP_CONFIG).state_dict(), clip)
    dino = folder / "model.safetensors"  # trained at 112 px (pos_embed of 8 x 8 + 1), read at 56: resampled
    net = timm.create_model(
        "vit_large_patch14_dinov2", pretrained=False, num_classes=0, img_size=112, **TINY_DINO_KWARGS
    )
    save_safetensors(net.state_dict(), dino)
    return clip, dino


def _photos() -> list[np.ndarray]:
    from skimage import data

    return [data.astronaut(), data.coffee(), data.chelsea(), data.rocket()]


def _corpus(folder: Path, n_good: int = 12) -> dict[str, str]:
    """images.jsonl over skimage photos (crops), grey / RGBA / 16-bit images and bad lines; returns key -> reason."""
    img = folder / "img"
    img.mkdir(parents=True)
    lines: list[str] = []
    photos = _photos()
    for i in range(n_good):
        p = photos[i % len(photos)]
        crop = p[i : i + 120, 2 * i : 2 * i + 140]
        Image.fromarray(crop).save(img / f"{i}.jpg")
        lines.append(json.dumps({"key": f"photo/{i}", "source": "sk", "image": f"img/{i}.jpg"}))
    Image.fromarray(photos[0][:100, :100, 0]).save(img / "grey.png")  # non-RGB: converted, embedded
    Image.fromarray(photos[1][:100, :100]).convert("RGBA").save(img / "rgba.png")
    Image.fromarray((np.arange(64 * 64).reshape(64, 64) * 16).astype(np.uint16)).save(img / "i16.png")
    (img / "corrupt.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    data = (img / "0.jpg").read_bytes()
    (img / "truncated.jpg").write_bytes(data[: len(data) // 3])
    Image.new("RGB", (300, 300)).save(img / "big.png")  # over the test's pixel cap of 80,000
    bad = {
        "bad/corrupt": ("img/corrupt.jpg", "corrupt_image"),
        "bad/truncated": ("img/truncated.jpg", "corrupt_image"),
        "bad/big": ("img/big.png", "oversized_image"),
        "bad/missing": ("img/nowhere.jpg", "missing_image"),
    }
    extra = [json.dumps({"key": k, "source": "sk", "image": f"img/{k}.png"}) for k in ("grey", "rgba", "i16")]
    extra += [json.dumps({"key": k, "source": "sk", "image": ref}) for k, (ref, _) in bad.items()]
    extra += ['{"key": "bad/json", "image": ', json.dumps({"key": "photo/1", "source": "sk", "image": "img/2.jpg"})]
    for j, line in enumerate(extra):  # spread over the shards
        lines.insert(2 + 2 * j, line)
    (folder / "images.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    reasons = {k: r for k, (_, r) in bad.items()}
    reasons.update({"bad/json": "malformed_line", "photo/1 (dup)": "duplicate_id"})
    return reasons


def _args(work: Path, clip: Path, dino: Path, out: str = "features", shard_size: int = 5) -> list[str]:
    return [
        "--workdir",
        str(work),
        "--out",
        str(work / out),
        "--clip_weights",
        str(clip),
        "--dino_weights",
        str(dino),
        "--arch",
        "tiny",
        "--shard_size",
        str(shard_size),
        "--batch_size",
        "2",
        "--num_workers",
        "0",
        "--max_image_pixels",
        "80000",
        "--quiet",
        "--trainer.accelerator",
        "cpu",
        "--trainer.devices",
        "1",
    ]


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_encoders_load_official_layouts_strictly(tmp_path: Path) -> None:
    clip, dino = _weights(tmp_path)
    enc = build_clip(clip, TINY_CLIP_CONFIG, None)
    x = enc.transform(Image.fromarray(_photos()[0]))
    assert x.shape == (3, 56, 56) and enc.model(x[None]).shape == (1, TINY_CLIP_CONFIG["embed_dim"])
    d = build_dino(dino, 56, TINY_DINO_KWARGS)
    assert d.model(d.transform(Image.fromarray(_photos()[1]))[None]).shape == (1, TINY_DINO_KWARGS["embed_dim"])
    with pytest.raises(WeightsError, match="unexpected"):  # a DINOv2 file is no CLIP
        build_clip(dino, TINY_CLIP_CONFIG, None)
    with pytest.raises(FileNotFoundError, match="timm/vit_large_patch14_dinov2.lvd142m"):
        build_dino(tmp_path / "absent.safetensors", 56, TINY_DINO_KWARGS)


def test_features_format_round_trip_and_missing_shards(tmp_path: Path) -> None:
    meta = {"model": "m", "dim": 3, "shard_size": 2, "images": "x", "n_images": 5, "n_shards": 3}
    write_meta(tmp_path, meta)
    rows = np.array([[3.0, 4.0, 0.0], [0.0, 0.0, 1.0]]) / np.array([[5.0], [1.0]])
    write_shard(tmp_path, 0, ["a", "b"], rows, [])
    write_shard(tmp_path, 2, ["e"], rows[:1], [{"key": "c", "image": "c.jpg", "reason": "corrupt_image", "error": "x"}])
    with pytest.raises(FeaturesError, match="1 of 3 shards missing \\(1\\)"):
        load_features(tmp_path)
    keys, arr = load_features(tmp_path, allow_missing=True)
    assert keys == ["a", "b", "e"] and arr.dtype == np.float16 and arr.shape == (3, 3)
    np.testing.assert_allclose(arr.astype(np.float32), np.concatenate([rows, rows[:1]]), atol=1e-3)
    assert read_meta(tmp_path)["n_shards"] == 3
    # file names may hold line separators that str.splitlines breaks at (U+2028, U+0085, a form feed)
    odd = ["a\u2028b.jpg", "c\x85d\x0ce.jpg"]
    write_shard(tmp_path, 1, odd, rows, [{"key": "f\u2029", "image": "f\u2029.jpg", "reason": "corrupt_image"}])
    keys, arr = load_features(tmp_path)
    assert keys == ["a", "b", *odd, "e"] and arr.shape == (5, 3)
    assert tally(tmp_path, [0, 1, 2]) == (5, {"corrupt_image": 2})
    shard_path(tmp_path, 2, ".npy").write_bytes(shard_path(tmp_path, 2, ".npy").read_bytes()[:-3])  # torn
    with pytest.raises(FeaturesError, match="shard-00002.npy: unreadable"):
        load_features(tmp_path)


def test_embed_writes_features_and_counts_bad_images(tmp_path: Path) -> None:
    from namc.lit.embed import main

    clip, dino = _weights(tmp_path)
    reasons = _corpus(tmp_path)
    assert main(_args(tmp_path, clip, dino)) == 0
    for name, dim in (("clip", TINY_CLIP_CONFIG["embed_dim"]), ("dino", TINY_DINO_KWARGS["embed_dim"])):
        folder = tmp_path / "features" / name
        keys, arr = load_features(folder)
        meta = read_meta(folder)
        assert meta["dim"] == dim and meta["n_images"] == 12 + 3 + 4 + 2
        assert keys == [k for k in keys if k.startswith("photo/") or k in ("grey", "rgba", "i16")]
        assert sorted(keys) == sorted([f"photo/{i}" for i in range(12)] + ["grey", "rgba", "i16"])
        np.testing.assert_allclose(np.linalg.norm(arr.astype(np.float32), axis=1), 1.0, atol=2e-3)
        skipped = [
            json.loads(line) for p in sorted(folder.glob("*.skipped.jsonl")) for line in p.read_text().splitlines()
        ]
        got = {
            ("photo/1 (dup)" if s["reason"] == "duplicate_id" else s["key"] or "bad/json"): s["reason"] for s in skipped
        }
        assert got == reasons
        assert all(s["error"] for s in skipped)
    # a row is the encoder applied to the decoded photo: the real preprocessing and model, normalised
    keys, arr = load_features(tmp_path / "features" / "clip")
    enc = build_clip(clip, TINY_CLIP_CONFIG, None)
    with torch.no_grad():
        ref = enc.model(enc.transform(Image.open(tmp_path / "img" / "3.jpg").convert("RGB"))[None])[0]
    ref = (ref / ref.norm()).numpy()
    np.testing.assert_allclose(arr[keys.index("photo/3")].astype(np.float32), ref, atol=2e-3)


def test_embed_refuses_a_folder_of_other_settings(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from namc.lit.embed import main

    clip, dino = _weights(tmp_path)
    _corpus(tmp_path, n_good=4)
    assert main([*_args(tmp_path, clip, dino), "--models", "clip"]) == 0
    assert main([*_args(tmp_path, clip, dino, shard_size=3), "--models", "clip"]) == 2
    assert "other settings" in capsys.readouterr().err


def _run(args: list[str], **kw) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "namc", "curate", "embed", *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **kw,
    )


def test_embed_rerun_after_an_interruption_redoes_only_unfinished_shards(tmp_path: Path) -> None:
    """A run cut at every stage of a shard's writing (nothing yet; keys written, .npy not; a temporary file left;
    one encoder's shard done, the other's not) ends, after a rerun, with the bytes of an uninterrupted run."""
    from namc.lit.embed import main

    clip, dino = _weights(tmp_path)
    _corpus(tmp_path, n_good=8)
    assert main(_args(tmp_path, clip, dino, "reference", shard_size=3)) == 0
    assert main(_args(tmp_path, clip, dino, "cut", shard_size=3)) == 0
    cut = tmp_path / "cut"
    shard_path(cut / "clip", 1, ".npy").unlink()  # killed after the keys, before the .npy
    for name in ("clip", "dino"):
        for suffix in (".npy", ".keys.txt", ".skipped.jsonl"):
            shard_path(cut / name, 3, suffix).unlink()  # killed before the shard's first write
    (cut / "dino" / ".shard-00004.npy.abc.tmp").write_bytes(b"half")  # killed during a write
    shard_path(cut / "dino", 4, ".npy").unlink()
    stamp = shard_path(cut / "clip", 0, ".npy").stat().st_mtime_ns
    assert main(_args(tmp_path, clip, dino, "cut", shard_size=3)) == 0
    assert _tree(cut) == _tree(tmp_path / "reference")
    assert shard_path(cut / "clip", 0, ".npy").stat().st_mtime_ns == stamp  # a finished shard is not redone


@pytest.mark.slow
def test_embed_killed_and_resumed_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    from namc.lit.embed import main

    clip, dino = _weights(tmp_path)
    _corpus(tmp_path, n_good=60)
    assert main(_args(tmp_path, clip, dino, "reference", shard_size=4)) == 0
    proc = _run(_args(tmp_path, clip, dino, "killed", shard_size=4))
    first = tmp_path / "killed" / "dino" / "shard-00000.npy"
    deadline = time.time() + 120
    while not first.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    out = proc.communicate()[0].decode(errors="replace")
    assert first.exists(), out[-2000:]
    n_shards = read_meta(tmp_path / "reference" / "clip")["n_shards"]
    done = [i for i in range(n_shards) if shard_path(tmp_path / "killed" / "dino", i, ".npy").exists()]
    assert len(done) < n_shards, "the run finished before it was killed: nothing was resumed"
    assert main(_args(tmp_path, clip, dino, "killed", shard_size=4)) == 0
    assert _tree(tmp_path / "killed") == _tree(tmp_path / "reference")


@pytest.mark.slow
def test_embed_on_two_processes_matches_one(tmp_path: Path) -> None:
    from namc.lit.embed import main

    clip, dino = _weights(tmp_path)
    _corpus(tmp_path, n_good=12)
    assert main(_args(tmp_path, clip, dino, "one")) == 0
    args = _args(tmp_path, clip, dino, "two")
    args[args.index("--trainer.devices") + 1] = "2"
    args[args.index("--num_workers") + 1] = "1"  # under DDP the worker starts from a fork server
    proc = _run([*args, "--trainer.strategy", "ddp"])
    out = proc.communicate(timeout=300)[0].decode(errors="replace")
    assert proc.returncode == 0, out[-3000:]
    assert _tree(tmp_path / "two") == _tree(tmp_path / "one")


@pytest.mark.slow  # the tiny encoders
def test_embed_refuses_a_features_folder_another_run_holds(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from namc.lit.embed import main
    from namc.locks import LOCK_NAME

    clip, dino = _weights(tmp_path)
    _corpus(tmp_path, n_good=2)
    out = tmp_path / "features"
    out.mkdir()
    record = {"host": socket.gethostname(), "pid": os.getppid(), "command": "namc curate embed other", "started": "t"}
    (out / LOCK_NAME).write_text(json.dumps(record))
    assert main([*_args(tmp_path, clip, dino), "--models", "clip"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("namc curate embed: error: ") and err.count("\n") == 1 and f"PID {os.getppid()}" in err
    assert not (out / "clip").exists()
    (out / LOCK_NAME).unlink()
    assert main([*_args(tmp_path, clip, dino), "--models", "clip"]) == 0
    assert not (out / LOCK_NAME).exists()
