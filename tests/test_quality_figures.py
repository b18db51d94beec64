"""The README's precision-quality figures measured on the AMX Xeon are the stored test captions they came from."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

from namc.eval.captions.cli import identical_captions

ROOT = Path(__file__).resolve().parents[1]
STORED = ROOT / "docs" / "measurements" / "xeon_amx_session44"
HEADING = "**On the Intel Xeon with AMX (session 44).**"
ROWS = {  # README row -> the results file's precision
    "fp32": "fp32",
    "bf16 as it runs": "bf16",
    "int8 as it runs": "int8",
    "int8 with MIR in int8, as a CPU without AMX runs it": "int8_noamx",
}


def _seeds() -> list[dict]:
    packs = []
    for seed in (0, 1, 2):
        with gzip.open(STORED / f"quality_w128_seed{seed}.json.gz", "rt", encoding="utf-8") as f:
            packs.append(json.load(f))
        assert packs[-1]["seed"] == seed
    return packs


def _identical(pack: dict, precision: str) -> float:
    fp32 = dict(zip(pack["ids"], pack["predictions"]["fp32"], strict=True))
    other = dict(zip(pack["ids"], pack["predictions"][precision], strict=True))
    return identical_captions(other, fp32, "fp32")["fraction"]


def test_readme_amx_quality_table_is_the_stored_captions():
    # every cell of the table: CIDEr-D as `namc test` scored it, the share of captions identical to fp32's counted
    # here from the stored captions, and the mean +- sample sd over the three seeds of both
    section = (ROOT / "README.md").read_text().split(HEADING, 1)[1]
    table = [[c.strip() for c in line.split("|")[1:-1]] for line in section.split("\n\n", 2)[1].splitlines()]
    assert [row[0] for row in table[2:]] == list(ROWS)
    packs = _seeds()
    assert all(len(p["ids"]) == 700 for p in packs)
    for label, ciders, change, identical, spread in (row[:1] + row[2:] for row in table[2:]):
        precision = ROWS[label]
        scores = [p["scores"][precision]["CIDEr-D"] for p in packs]
        assert ciders == " / ".join(f"{s:.2f}" for s in scores), label
        if precision == "fp32":
            assert (change, identical, spread) == ("", "100%", ""), label
            continue
        delta = [s - p["scores"]["fp32"]["CIDEr-D"] for s, p in zip(scores, packs, strict=True)]
        assert change == f"{statistics.mean(delta):+.2f} ± {statistics.stdev(delta):.2f}", label
        same = [100 * _identical(p, precision) for p in packs]
        assert identical == " / ".join(f"{s:.1f}%" for s in same), label
        assert spread == f"{statistics.mean(same):.1f} ± {statistics.stdev(same):.1f}%", label
