"""Hostile and careless input to the data side: deep JSON, byte-order marks, tar headers that lie, duplicate samples,
and two runs writing one output folder."""

from __future__ import annotations

import io
import json
import os
import socket
import tarfile
from pathlib import Path

import pytest

from namc.data.corpus import CorpusDataset, pack_corpus
from namc.data.issues import DataIssues
from namc.data.synthetic import generate_corpus
from namc.locks import LOCK_NAME

DEEP = "[" * 10_000 + "]" * 10_000


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 6-pair shapes corpus (32 px) with its manifest, packed into shards of 3."""
    root = tmp_path_factory.mktemp("small")
    generate_corpus(root / "corpus", 6, 32, 0, 0.2, progress=False)
    pack_corpus(root / "corpus" / "manifest.jsonl", root / "shards", shard_size=3, progress=False)
    return root


def _live_lock(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    record = {"host": socket.gethostname(), "pid": os.getppid(), "command": "namc data pack other", "started": "t"}
    (folder / LOCK_NAME).write_text(json.dumps(record))


# --- one owner per output folder -----------------------------------------------------------------------------------


def test_pack_cli_refuses_a_folder_another_run_holds(
    small: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from namc.data.cli import main

    out = tmp_path / "shards"
    _live_lock(out)
    assert main(["pack", str(small / "corpus" / "manifest.jsonl"), str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("namc data pack: error: ") and err.count("\n") == 1
    assert f"PID {os.getppid()}" in err and "namc data pack other" in err
    assert not list(out.glob("*.tar"))  # nothing written beside the other run's shards
    (out / LOCK_NAME).unlink()
    assert main(["pack", str(small / "corpus" / "manifest.jsonl"), str(out), "--quiet"]) == 0
    assert len(list(out.glob("*.tar"))) == 1 and not (out / LOCK_NAME).exists()


def test_pack_cli_releases_the_lock_after_an_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from namc.data.cli import main

    out = tmp_path / "shards"
    assert main(["pack", str(tmp_path / "missing.jsonl"), str(out), "--quiet"]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    assert not (out / LOCK_NAME).exists()


@pytest.mark.slow  # builds a VQGAN; the fast test of the same lock is the pack one above
def test_precompute_refuses_a_folder_another_run_holds(
    small: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from namc.lit.precompute import main
    from namc.models.io import save_safetensors
    from namc.models.registry import model_config
    from namc.models.vqgan import VQGANTokenizer

    c = model_config("namc_tiny")
    vq = tmp_path / "vqgan.safetensors"
    save_safetensors(VQGANTokenizer(c.vqgan_ddconfig, c.vqgan_n_embed, c.vqgan_embed_dim).state_dict(), vq)
    shards = small / "shards"
    _live_lock(shards)
    try:
        argv = ["--shards", str(shards), "--model", "namc_tiny", "--vqgan-weights", str(vq), "--quiet"]
        assert main(argv) == 2
    finally:
        (shards / LOCK_NAME).unlink()
    err = capsys.readouterr().err
    assert err.startswith("namc data precompute: error: ") and err.count("\n") == 1 and f"PID {os.getppid()}" in err
    assert not list(shards.glob("*.targets.json"))


# --- deep JSON, duplicate keys, byte-order marks -------------------------------------------------------------------


def test_deep_and_duplicate_key_lines_are_counted_by_pack_and_streaming(small: Path, tmp_path: Path) -> None:
    lines = (small / "corpus" / "manifest.jsonl").read_text().splitlines()
    dup_key = lines[1][:-1] + ', "id": "again"}'  # the same key twice in one object
    manifest = small / "corpus" / "hostile.jsonl"  # beside the images its paths name
    manifest.write_text("\n".join([lines[0], DEEP, dup_key, *lines[2:]]) + "\n")
    report = pack_corpus(manifest, tmp_path / "shards", shard_size=4, progress=False)
    assert report.n_samples == len(lines) - 1 and report.rejected == {"malformed_line": 2}
    assert any(":2: malformed_line: nested deeper than" in e for e in report.examples)
    assert any(":3: malformed_line: duplicate key 'id'" in e for e in report.examples)
    issues = DataIssues("corpus")
    items = list(CorpusDataset(manifest, None, rank=0, world_size=1, load_images=False, issues=issues))
    assert len(items) == len(lines) - 1 and issues.counts == {"malformed_line": 2}


def _rewrite_shard(shard: Path, edit: dict[str, bytes]) -> None:
    """Rewrites ``shard`` with the data of the members named in ``edit`` replaced (a valid tar)."""
    with tarfile.open(shard) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(shard, "w") as tar:
        for m, data in members:
            data = edit.get(m.name, data)
            m.size = len(data)
            tar.addfile(m, io.BytesIO(data))


def test_deep_json_in_a_shard_and_its_index_is_counted_not_a_crash(
    small: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shards = tmp_path / "shards"
    pack_corpus(small / "corpus" / "manifest.jsonl", shards, shard_size=3, progress=False)
    _rewrite_shard(shards / "shard-000000.tar", {"000000001.json": DEEP.encode()})
    (shards / "index.json").write_text(DEEP)
    (shards / "shard-000000.json").write_text(DEEP)
    issues = DataIssues("corpus")
    with caplog.at_level("WARNING"):
        items = list(CorpusDataset(shards, None, rank=0, world_size=1, load_images=False, issues=issues))
    assert len(items) == 5 and issues.counts == {"malformed_line": 1}
    assert any("index.json is unreadable (nested deeper than 64 levels)" in r.getMessage() for r in caplog.records)


def test_annotation_file_too_deep_is_one_line_naming_it(tmp_path: Path) -> None:
    from namc.data.idc.base import AnnotationError, load_json

    path = tmp_path / "splits.json"
    path.write_text(DEEP)
    with pytest.raises(AnnotationError, match=r"splits\.json: nested deeper than 64 levels") as err:
        load_json(path)
    assert "\n" not in str(err.value)
    path.write_text('{"train": [1], "train": [2]}')
    with pytest.raises(AnnotationError, match=r"splits\.json: duplicate key 'train'"):
        load_json(path)


@pytest.mark.slow  # importing the embedding step loads Lightning and the encoders; the reader is tested above
def test_embed_scan_skips_a_deep_line(tmp_path: Path) -> None:
    from namc.lit.embed import scan_images

    path = tmp_path / "images.jsonl"
    path.write_text('{"key": "a", "image": "a.png"}\n' + DEEP + '\n{"key": "a", "image": "b.png"}\n')
    lines = scan_images(path, 10)
    assert lines.n_images == 3 and lines.duplicates == {3: 1}


def test_pair_list_with_a_byte_order_mark(tmp_path: Path) -> None:
    from namc.data.pairs import PairListDataset, read_pair_list

    for name in ("a.png", "b.png"):
        (tmp_path / name).write_bytes(b"")
    path = tmp_path / "pairs.txt"
    path.write_bytes("\ufeffa.png\tb.png\n".encode())
    [pair] = read_pair_list(path)
    assert pair.written == ("a.png", "b.png") and pair.first == tmp_path / "a.png"
    assert len(PairListDataset(path)) == 1


# --- tar headers that lie ------------------------------------------------------------------------------------------


def _members(shard: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(shard) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]


def _tar(entries: list[tuple[str, bytes] | tuple[str, bytes, int]], end: bool = True) -> bytes:
    """A tar of ``(name, data[, declared size])`` entries; a declared size other than ``len(data)`` makes a header
    that lies (its body is ``data`` alone)."""
    out = io.BytesIO()
    for name, data, *declared in entries:
        info = tarfile.TarInfo(name)
        info.size = declared[0] if declared else len(data)
        out.write(info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape"))  # GNU: base-256 sizes past 8 GB
        out.write(data + b"\0" * (-len(data) % tarfile.BLOCKSIZE))
    if end:
        out.write(b"\0" * 2 * tarfile.BLOCKSIZE)
    return out.getvalue()


class _Hung(Exception):  # noqa: N818  (not an OSError, which the readers under test catch and count)
    """A block ran past its deadline."""


class _Deadline:
    """Fails a block that runs past ``seconds`` (the hang this guards against is a pure-Python loop, so SIGALRM
    interrupts it)."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds

    def __enter__(self) -> None:
        import signal

        def fail(*_: object) -> None:
            raise _Hung(f"still running after {self.seconds} s")

        signal.signal(signal.SIGALRM, fail)
        signal.alarm(self.seconds)

    def __exit__(self, *exc: object) -> None:
        import signal

        signal.alarm(0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)


def test_a_member_declaring_2_to_the_60_bytes_is_corrupt_not_a_hang(small: Path, tmp_path: Path) -> None:
    from namc.data.corpus.shards import iter_tar_groups

    members = _members(small / "shards" / "shard-000000.tar")  # 3 samples x (json, 1.png, 2.png)
    for lie in ("README", "000000000.txt", "000000001.1.png"):
        shard = tmp_path / "shard-000000.tar"
        shard.write_bytes(_tar([*members[:3], (lie, b"x" * 1000, 2**60), *members[3:]]))
        issues = DataIssues("corpus")
        with _Deadline(20):
            keys = [k for k, _ in iter_tar_groups(shard, issues, expected=3)]
        assert keys == ["000000000"] and issues.counts == {"corrupt_shard": 2}, lie
        assert "over the limit" in issues.examples["corrupt_shard"][0]


def test_a_member_over_the_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    import tracemalloc

    from namc.data.corpus.shards import iter_tar_groups
    from namc.data.tars import TarReadError, iter_tar_files

    big = 4 << 20
    shard = tmp_path / "big.tar"
    shard.write_bytes(_tar([("k.json", b"{}"), ("k.1.png", b"\x89PNG" + b"\0" * big), ("k.2.png", b"x")]))
    issues = DataIssues("corpus")
    tracemalloc.start()
    try:
        groups = list(iter_tar_groups(shard, issues, expected=1, max_member_bytes=1 << 20))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert groups == [] and issues.counts == {"corrupt_shard": 1} and peak < big // 2
    # declared far past the end of the file (512 MB) at the default limit: truncated, nothing allocated
    shard.write_bytes(_tar([("k.json", b"{}"), ("k.1.png", b"x" * 1000, 512 << 20)]))
    with pytest.raises(TarReadError, match="k.1.png"):
        list(iter_tar_files(shard))


def test_a_lying_header_in_a_pipe_is_refused(tmp_path: Path) -> None:
    from namc.data.tars import TarReadError, iter_tar_files

    data = _tar([("a.txt", b"hello"), ("b", b"x" * 100, 2**60), ("c.txt", b"never")])
    r, w = os.pipe()
    os.write(w, data)
    os.close(w)
    with open(r, "rb") as stream, _Deadline(20), pytest.raises(TarReadError, match="'b' declares") as err:
        seen = []
        for name, payload in iter_tar_files(stream):
            seen.append((name, payload))
    assert seen == [("a.txt", b"hello")] and err.value.at_boundary


def test_image_reference_into_a_lying_or_repeating_tar(tmp_path: Path) -> None:
    from namc.data.refs import RefError, read_ref

    ok = tmp_path / "ok.tar"
    ok.write_bytes(_tar([("a.png", b"first"), ("b.png", b"x" * 1000, 512 << 20)]))
    with _Deadline(20), pytest.raises(RefError, match=r"ok\.tar::b\.png: "):
        read_ref(f"{ok}::b.png")
    twice = tmp_path / "twice.tar"
    twice.write_bytes(_tar([("a.png", b"first"), ("a.png", b"second")]))
    with pytest.raises(RefError, match="appears twice"):
        read_ref(f"{twice}::a.png")


# --- duplicate samples ---------------------------------------------------------------------------------------------


def test_a_sample_twice_in_a_shard_streams_once(small: Path, tmp_path: Path) -> None:
    from namc.data.corpus.shards import iter_tar_groups

    members = _members(small / "shards" / "shard-000000.tar")
    shard = tmp_path / "shard-000000.tar"
    shard.write_bytes(_tar([*members, *members[:3]]))  # sample 0 appended again
    issues = DataIssues("corpus")
    keys = [k for k, _ in iter_tar_groups(shard, issues, expected=3)]
    assert keys == ["000000000", "000000001", "000000002"] and issues.counts == {"duplicate_id": 1}
    # a repeated member never replaces the image the sample was packed with
    name, image = members[1]
    shard.write_bytes(_tar([*members[:3], (name, b"replacement"), *members[3:]]))
    issues = DataIssues("corpus")
    groups = dict(iter_tar_groups(shard, issues, expected=3))
    assert len(groups) == 3 and groups["000000000"][name.split(".", 1)[1]] == image
    assert issues.counts == {"duplicate_id": 1}


def test_a_sample_in_two_shards_streams_once(small: Path, tmp_path: Path) -> None:
    other = tmp_path / "again"
    pack_corpus(small / "corpus" / "manifest.jsonl", other, shard_size=3, progress=False)
    shards = [small / "shards" / "shard-000000.tar", other / "shard-000000.tar", other / "shard-000001.tar"]
    issues = DataIssues("corpus")
    items = list(CorpusDataset(shards, None, rank=0, world_size=1, load_images=False, issues=issues))
    assert len(items) == 6 and len({it["id"] for it in items}) == 6
    assert issues.counts == {"duplicate_id": 3}
    assert all("is taken by" in e for e in issues.examples["duplicate_id"])
