"""Pair mining, NAMC appendix D.1: faiss top-k, the candidate rule, spectral clustering, Eq. 10 and Eq. 12.

The hand-built feature set (:func:`_hand_set`) is worked out in the comments: image 0 (the anchor A) and three tight
groups of two images around it; every number the tests expect follows from the ``a`` values below.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from namc.curate.features import write_meta, write_shard
from namc.curate.mining import (
    MiningConfig,
    Thresholds,
    candidate_sets,
    choose_per_cluster,
    cluster_labels,
    filter_sets,
    g_features,
    mine_pairs,
    top_k,
    union_pairs,
)
from namc.curate.mining.cli import main as pairs_main

# cos(A, member) under CLIP and under DINOv2, groups of two: (g1m0, g1m1, g2m0, g2m1, g3m0, g3m1)
A_CLIP = [0.88, 0.87, 0.86, 0.875, 0.865, 0.855]
A_DINO = [0.87, 0.88, 0.875, 0.86, 0.855, 0.865]


def _group_vectors(a: list[float], delta: float = 0.15) -> np.ndarray:
    """Row 0 = e0 (the anchor); member (g, m) = a e0 + sqrt(1 - a^2) (cos(delta) u_g + sin(delta) e_gm), unit norm.

    cos(A, member) = a; same group: a1 a2 + b1 b2 cos^2(delta) ~ 0.995 (> tau_max 0.95, "identical"); other group:
    a1 a2 <= 0.88 * 0.875 = 0.77 (< tau_min 0.78, "dissimilar").
    """
    dim = 1 + 3 + 6
    x = np.zeros((7, dim))
    x[0, 0] = 1.0
    for j, aj in enumerate(a):
        g = j // 2
        b = np.sqrt(1 - aj**2)
        x[j + 1, 0] = aj
        x[j + 1, 1 + g] = b * np.cos(delta)
        x[j + 1, 4 + j] = b * np.sin(delta)
    return x


def _hand_set() -> tuple[np.ndarray, np.ndarray]:
    return _group_vectors(A_CLIP).astype(np.float32), _group_vectors(A_DINO).astype(np.float32)


def test_hand_set_geometry() -> None:
    clip, dino = _hand_set()
    for f, a in ((clip, A_CLIP), (dino, A_DINO)):
        np.testing.assert_allclose(np.linalg.norm(f, axis=1), 1.0, atol=1e-6)
        s = f @ f.T
        np.testing.assert_allclose(s[0, 1:], a, atol=1e-6)
        assert s[1, 2] > 0.95 and s[3, 4] > 0.95 and s[5, 6] > 0.95  # same group: above tau_max
        assert s[1, 3] < 0.78 and s[2, 6] < 0.78  # other group: below tau_min


def test_candidate_rule_by_hand() -> None:
    clip, dino = _hand_set()
    kc, kd = top_k(clip, 6, index="exact"), top_k(dino, 6, index="exact")
    indptr, indices = candidate_sets(kc.sims, kc.ids, kd.sims, kd.ids)
    # A: all six neighbours lie in [0.78, 0.95], its set's max 0.88 >= 0.80 and min 0.855 >= 0.78 -> C_A = all six,
    # in CLIP rank order (0.88, 0.875, 0.87, 0.865, 0.86, 0.855)
    assert indices[indptr[0] : indptr[1]].tolist() == [1, 4, 2, 5, 3, 6]
    # a member: its top-6 holds the other groups at ~0.77 < tau_min^theta = 0.78 -> its set is dropped (topk reading)
    assert (np.diff(indptr)[1:] == 0).all()
    # the band reading: the band keeps only A (mate > 0.95, others < 0.78); max = min = a >= 0.80 -> C_member = {A}
    band = Thresholds(set_test="band")
    indptr_b, indices_b = candidate_sets(kc.sims, kc.ids, kd.sims, kd.ids, band)
    assert [indices_b[indptr_b[i] : indptr_b[i + 1]].tolist() for i in range(1, 7)] == [[0]] * 6
    # a set threshold above A's minimum (0.855) drops A's set too
    strict = Thresholds(tau_min_clip=0.9)
    assert candidate_sets(kc.sims, kc.ids, kd.sims, kd.ids, strict)[1].size == 0


def test_filter_sets_on_given_rows() -> None:
    sims = np.array([[0.99, 0.90, 0.85, 0.79], [0.97, 0.90, 0.85, 0.70], [0.79, 0.79, 0.78, 0.78]], np.float32)
    ids = np.array([[1, 2, 3, 4], [0, 2, 3, 4], [0, 1, 3, -1]])
    keep = filter_sets(sims, ids, 0.80, 0.78, Thresholds())
    # row 0: set ok (max .99 >= .80, min .79 >= .78), band drops .99; row 1: min .70 < .78 -> dropped;
    # row 2: max .79 < .80 -> dropped
    assert keep.tolist() == [[False, True, True, True], [False] * 4, [False] * 4]
    keep_band = filter_sets(sims, ids, 0.80, 0.78, Thresholds(set_test="band"))
    # band reading: row 1's band is (.90, .85) -> kept; row 2's band max .79 < .80 -> dropped
    assert keep_band.tolist() == [[False, True, True, True], [False, True, True, False], [False] * 4]


def test_clustering_and_choice_by_hand() -> None:
    clip, dino = _hand_set()
    g = g_features(clip, dino)  # Eq. 8, alpha 0.4, beta 0.6
    labels = cluster_labels(g[1:], n_clusters=3, gamma=0.1, seed=0)
    # the three groups, whatever sklearn numbers them
    assert labels[0] == labels[1] and labels[2] == labels[3] and labels[4] == labels[5]
    assert len({labels[0], labels[2], labels[4]}) == 3
    # Eq. 10 over g: cos(g_A, g_m) = (0.16 a_clip + 0.36 a_dino) / 0.52 -> g1: m1 (.4560 > .4540), g2: m0 (.4526 >
    # .4496), g3: m1 (.4482 > .4462); clusters numbered by that cosine
    chosen = choose_per_cluster(g[0], g[1:], labels)
    assert [(pos, k) for pos, k, _ in chosen] == [(1, 0), (2, 1), (5, 2)]
    np.testing.assert_allclose([s for *_, s in chosen], np.array([0.4560, 0.4526, 0.4482]) / 0.52, atol=1e-4)
    # fewer candidates than clusters: each its own cluster
    assert cluster_labels(g[1:3], 3).tolist() == [0, 1]


def test_mine_pairs_by_hand() -> None:
    clip, dino = _hand_set()
    got = mine_pairs(clip, dino, MiningConfig(k=6))
    assert [(p.row1, p.row2, p.cluster) for p in got.pairs] == [(0, 2, 0), (0, 3, 1), (0, 6, 2)]
    np.testing.assert_allclose([p.sim_clip for p in got.pairs], [0.87, 0.86, 0.855], atol=1e-5)
    np.testing.assert_allclose([p.sim_dino for p in got.pairs], [0.88, 0.875, 0.865], atol=1e-5)
    assert got.summary["images"] == 7 and got.summary["candidates"] == 6 and got.summary["pairs"] == 3
    assert set(got.summary["seconds"]) == {"knn_clip", "knn_dino", "candidates", "clustering", "union"}
    # k = 3: CLIP top-3 of A = (g1m0, g2m1, g1m1), DINO top-3 = (g1m1, g2m0, g1m0) -> C_A = {g1m0, g1m1}, fewer than
    # K: both paired, g1m1 first (g-cosine .4560 > .4540); members' top-3 end at ~0.77 -> no candidates
    small = mine_pairs(clip, dino, MiningConfig(k=3))
    assert [(p.row1, p.row2, p.cluster) for p in small.pairs] == [(0, 2, 0), (0, 1, 1)]
    # band reading: every member pairs with A; (A, m) from A's clusters first, the rest from the members' anchors
    band = mine_pairs(clip, dino, MiningConfig(k=6, thresholds=Thresholds(set_test="band")))
    assert [(p.row1, p.row2) for p in band.pairs] == [(0, 2), (0, 3), (0, 6), (1, 0), (4, 0), (5, 0)]
    # Img-Diff's filter on the CLIP similarity (range moved so that it bites on these numbers)
    kept = mine_pairs(clip, dino, MiningConfig(k=6, imgdiff=(0.86, 0.98)))
    assert [(p.row1, p.row2) for p in kept.pairs] == [(0, 2), (0, 3)]
    assert kept.summary["pairs_union"] == 3 and kept.summary["pairs"] == 2


def test_union_deduplicates_both_orders() -> None:
    clip, dino = _hand_set()
    pairs = union_pairs([(0, 1, 0), (1, 0, 0), (0, 2, 1), (2, 0, 2), (3, 3, 0)], clip, dino)
    assert [(p.row1, p.row2, p.cluster) for p in pairs] == [(0, 1, 0), (0, 2, 1)]


@pytest.mark.slow
def test_mining_is_deterministic_and_workers_agree() -> None:
    rng = np.random.default_rng(0)
    clip, dino = _clustered(rng, 1000, 64, 48, 20)
    a = mine_pairs(clip, dino, MiningConfig(k=10))
    b = mine_pairs(clip, dino, MiningConfig(k=10, workers=2))
    assert a.summary["pairs"] > 100
    assert [(p.row1, p.row2, p.cluster) for p in a.pairs] == [(p.row1, p.row2, p.cluster) for p in b.pairs]


def _clustered(rng: np.random.Generator, n: int, d1: int, d2: int, n_centres: int, spread: float = 0.55):
    """n points around n_centres shared centres (same assignment in both feature spaces), L2-normalised float16."""
    labels = rng.integers(0, n_centres, n)
    out = []
    for d in (d1, d2):
        c = rng.normal(size=(n_centres, d))
        c /= np.linalg.norm(c, axis=1, keepdims=True)
        x = c[labels] + spread * rng.normal(size=(n, d)) / np.sqrt(d)
        out.append((x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16))
    return out


def test_exact_faiss_equals_brute_force() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, 32)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    got = top_k(x, 8, index="exact")
    s = x @ x.T
    np.fill_diagonal(s, -np.inf)
    want_ids = np.argsort(-s, axis=1, kind="stable")[:, :8]
    np.testing.assert_array_equal(got.ids, want_ids)
    np.testing.assert_allclose(got.sims, np.take_along_axis(s, want_ids, 1), atol=1e-5)
    # k larger than the collection: padded
    small = top_k(x[:4], 6, index="exact")
    assert (small.ids[:, 3:] == -1).all() and np.isinf(small.sims[:, 3:]).all()
    assert (small.ids[:, :3] != np.arange(4)[:, None]).all()


def test_ivf_recall_of_exact_top_k() -> None:
    rng = np.random.default_rng(2)
    x = _clustered(rng, 10_000, 64, 8, 400, spread=1.0)[0]  # top-1 cosine ~0.64: a spread-out neighbourhood
    exact = top_k(x, 10, index="exact")
    ivf = top_k(x, 10, index="ivf")
    assert "ivf" in ivf.index
    hits = sum(len(np.intersect1d(a, b)) for a, b in zip(exact.ids, ivf.ids))
    recall = hits / exact.ids.size
    print(f"IVF recall@10 = {recall:.4f} ({ivf.index})")
    assert recall >= 0.95


def _photo_edits() -> tuple[list, list[str]]:
    """scikit-image photos (bundled, no download), each with two crops, a flip, a colour and a brightness edit."""
    from PIL import Image, ImageEnhance
    from skimage import data

    arrays = {n: getattr(data, n)() for n in ("astronaut", "coffee", "chelsea", "rocket", "camera", "coins", "brick")}
    arrays.update(ihc=data.immunohistochemistry(), hubble=data.hubble_deep_field(), moto=data.stereo_motorcycle()[0])

    def crop(img: Image.Image, f: float) -> Image.Image:
        w, h = img.size
        return img.crop((int(f * w), int(f * h), int((1 - f) * w), int((1 - f) * h))).resize((w, h))

    images, family = [], []
    for name, arr in arrays.items():
        img = Image.fromarray(arr).convert("RGB")
        img.thumbnail((256, 256))  # small files, fast tests
        r, g, b = img.split()
        colour = Image.merge("RGB", (r.point(lambda v: min(255, int(v * 1.15))), g, b.point(lambda v: int(v * 0.9))))
        edits = [img, crop(img, 0.03), crop(img, 0.08), img.transpose(Image.Transpose.FLIP_LEFT_RIGHT), colour]
        edits.append(ImageEnhance.Brightness(img).enhance(1.2))
        images += edits
        family += [name] * len(edits)
    return images, family


def _stand_in_features(images: list) -> tuple[np.ndarray, np.ndarray]:
    """Two cheap, real image features that separate photos, standing in for CLIP and DINOv2 (the real embedding
    path, CLIP ViT-L/14 and DINOv2 ViT-L/14, is ``namc curate embed``'s): "clip" = a 6x6 colour layout, "dino" =
    an 8x8 grey layout, both left-right symmetrised (a flip is a duplicate), standardised per image and channel (so
    colour gain and brightness move them only through clipping), centred over the collection, L2-normalised."""
    from PIL import Image

    def layout(img: Image.Image, size: int, grey: bool) -> np.ndarray:
        a = np.asarray((img.convert("L") if grey else img).resize((size, size), Image.Resampling.BOX), np.float64)
        a = (a + a[:, ::-1]) / 2
        a = a.reshape(size * size, -1)
        a = (a - a.mean(0)) / (a.std(0) + 1e-6)
        return a.ravel()

    feats = []
    for f in (np.array([layout(i, 6, False) for i in images]), np.array([layout(i, 8, True) for i in images])):
        f = f - f.mean(0)
        feats.append((f / np.linalg.norm(f, axis=1, keepdims=True)).astype(np.float32))
    return feats[0], feats[1]


def _photo_features() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    images, family = _photo_edits()
    clip, dino = _stand_in_features(images)
    return clip, dino, np.array(family)


def test_photos_pair_with_their_own_edits() -> None:
    clip, dino, family = _photo_features()
    result = mine_pairs(clip, dino, MiningConfig(k=5))
    assert result.pairs
    for p in result.pairs:
        assert family[p.row1] == family[p.row2], (family[p.row1], family[p.row2])
        assert 0.78 <= p.sim_clip <= 0.95 and 0.78 <= p.sim_dino <= 0.95
    assert len({family[p.row1] for p in result.pairs}) >= 5  # 7 of the 10 photos with these features


def _write_features(folder: Path, keys: list[str], x: np.ndarray, images: Path, shard_size: int = 4) -> None:
    folder.mkdir(parents=True)
    n_shards = (len(keys) + shard_size - 1) // shard_size
    for i in range(n_shards):
        sl = slice(i * shard_size, (i + 1) * shard_size)
        write_shard(folder, i, keys[sl], x[sl], [])
    meta = {"model": "test", "dim": x.shape[1], "shard_size": shard_size, "images": str(images)}
    write_meta(folder, {**meta, "n_images": len(keys), "n_shards": n_shards})


def test_pairs_cli_writes_pairs_and_summary(tmp_path: Path) -> None:
    clip, dino = _hand_set()
    keys = [f"cc3m/{i:03d}" for i in range(7)]
    work = tmp_path / "work"
    work.mkdir()
    images = work / "images.jsonl"
    images.write_text(
        "".join(
            json.dumps({"key": k, "source": "cc3m", "image": f"/data/{k}.jpg", "caption": f"c{k}"}) + "\n" for k in keys
        )
    )
    _write_features(work / "features" / "clip", keys, clip, images)
    # DINO rows in another order: rows are aligned by key
    order = [6, 0, 1, 2, 3, 4, 5]
    _write_features(work / "features" / "dino", [keys[i] for i in order], dino[order], images)
    config = tmp_path / "pipeline.yaml"
    config.write_text(f"workdir: {work}\npairs:\n  k: 6\n  index: exact\n")
    assert pairs_main(["--config", str(config), "--no_progress"]) == 0
    lines = [json.loads(x) for x in (work / "pairs.jsonl").read_text().splitlines()]
    assert [(x["key1"], x["key2"], x["cluster"]) for x in lines] == [
        ("cc3m/000", "cc3m/002", 0),
        ("cc3m/000", "cc3m/003", 1),
        ("cc3m/000", "cc3m/006", 2),
    ]
    assert lines[0]["image1"] == "/data/cc3m/000.jpg" and lines[0]["caption2"] == "ccc3m/002"
    assert lines[0]["source"] == "cc3m" and len({x["id"] for x in lines}) == 3
    assert abs(lines[0]["sim_dino"] - 0.88) < 1e-3
    summary = json.loads((work / "pairs_summary.json").read_text())
    assert summary["pairs_written"] == 3 and summary["images"] == 7 and "clustering" in summary["seconds"]


def test_pairs_cli_errors_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert pairs_main(["--workdir", str(tmp_path), "--no_progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("namc curate pairs:") and "\n" not in err


def test_index_embed_stand_in_pairs_on_photos(tmp_path: Path) -> None:
    """The chain on files: photos in a folder -> ``namc curate index`` -> features (stand-ins, in the embed step's
    shard format) -> ``namc curate pairs``; every pair joins two edits of one photo and its references read back."""
    from PIL import Image

    from namc.curate.cli import main as curate_main
    from namc.data.refs import read_ref

    images, family = _photo_edits()
    folder = tmp_path / "photos"
    for i, (img, fam) in enumerate(zip(images, family)):
        (folder / fam).mkdir(parents=True, exist_ok=True)
        img.save(folder / fam / f"{i:02d}.jpg", quality=95)
    work = tmp_path / "work"
    assert (
        curate_main(["index", "--workdir", str(work), "--sources", f"own=image_folder:{folder}", "--no_progress"]) == 0
    )
    index = [json.loads(x) for x in (work / "images.jsonl").read_text().splitlines()]
    assert len(index) == len(images)
    decoded = [Image.open(io.BytesIO(read_ref(x["image"]))).convert("RGB") for x in index]
    clip, dino = _stand_in_features(decoded)
    keys = [x["key"] for x in index]
    _write_features(work / "features" / "clip", keys, clip, work / "images.jsonl", shard_size=16)
    _write_features(work / "features" / "dino", keys, dino, work / "images.jsonl", shard_size=16)
    assert curate_main(["pairs", "--workdir", str(work), "--k", "5", "--no_progress"]) == 0
    pairs = [json.loads(x) for x in (work / "pairs.jsonl").read_text().splitlines()]
    assert len({p["key1"].split("/")[1] for p in pairs}) >= 5
    for p in pairs:
        assert p["key1"].split("/")[1] == p["key2"].split("/")[1]  # own/<photo>/<n>.jpg: the same photo
        assert read_ref(p["image1"], work)[:2] == b"\xff\xd8"  # JPEG


def test_written_pairs_skip_and_count_malformed_image_lines(tmp_path: Path) -> None:
    """An images.jsonl line without a usable key or image is counted, and its pairs dropped, after the mining ran
    (not a crash that loses every pair)."""
    from namc.curate.mining.cli import write_pairs
    from namc.curate.mining.pipeline import Pair

    lines = [
        {"key": "a", "image": "a.jpg"},
        {"key": "b", "image": "b.jpg"},
        {"key": "c"},
        {"key": ["d"], "image": "d"},
        {"key": "e", "image": "e.jpg", "caption": "an e"},
    ]
    (tmp_path / "images.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + "{broken\n")
    pairs = [Pair(0, 1, 0, 0.9, 0.8), Pair(0, 2, 0, 0.9, 0.8), Pair(3, 4, 1, 0.9, 0.8), Pair(4, 0, 1, 0.9, 0.8)]
    n, dropped = write_pairs(pairs, ["a", "b", "c", "d", "e"], tmp_path / "images.jsonl", tmp_path / "pairs.jsonl")
    assert n == 2 and dropped == {"pairs_without_image_line": 2, "malformed_image_lines": 3}
    written = [json.loads(x) for x in (tmp_path / "pairs.jsonl").read_text().splitlines()]
    assert [(w["key1"], w["key2"]) for w in written] == [("a", "b"), ("e", "a")] and written[1]["caption1"] == "an e"
