"""``namc curate filter``: template validation of the generated descriptions, the corpus manifest, Table 14.

Appendix D.2: the LMM sometimes ignores the template, so descriptions "not following the given template, or
containing only negations and auxiliary verbs" are filtered out (about 0.2% of 770K). Every final result of
``namc curate describe`` (the last line of each pair id) goes to exactly one place:

- ``manifest.jsonl``: accepted, in the manifest format ``namc data pack`` reads
  (:mod:`namc.data.corpus.records`: ``id, source, image1, image2, description, verb1, desc1, verb2, desc2``);
- ``rejects.jsonl``: ``{"id", "source", "reason", "detail", "text"?}``, where ``reason`` is a
  :class:`~namc.text.template.RejectReason` (``off_template``, ``empty``, ``unknown_verb``, ``empty_half``,
  ``negation_only``, ``nested_template``: a half holding the template's own frame, ``too_long``: over
  :data:`~namc.text.template.MAX_DESCRIPTION_CHARS`) or ``request_failed`` (no usable answer: the server never
  answered, or its answer passed the client's caps, ``too_long``; ``detail`` holds the last error).

Results of ``namc curate describe --prompt conventional`` (``"prompt": "conventional"``, appendix B.2) are not
held to the template: their text goes into the manifest as written, flagged ``"free_text": true``
(:mod:`namc.data.corpus.records`), and only an ``empty`` or ``too_long`` one is rejected. Such a manifest pre-trains
FDG alone (Table 11: NAMC without NIM and MIR).

Table 14's statistics (total, unique, repetition, repetition ratio per source and overall, plus the rejections by
reason) are printed and saved (``table14.json``); request failures are reported beside them, not mixed into the
template rejection rate the paper's 0.2% refers to.

Order: the manifest lists pairs sorted by id, so it does not depend on the order in which answers arrived (a run
killed and resumed gives the same manifest as an uninterrupted one). Image references are rewritten from the results
file's folder to the manifest's folder. The results are read twice (ids and offsets first, then one line at a time),
so memory holds the ids, not the descriptions; Table 14 keeps a 16-byte hash per distinct description.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from namc.curate.config import add_config_arguments, parse_with_config
from namc.curate.prompts import CONVENTIONAL
from namc.data.corpus.records import RecordError, parse_record
from namc.data.refs import rebase_ref
from namc.jsonl import json_line
from namc.llm.store import atomic_write_text, last_results, read_at
from namc.locks import LockedError, output_lock
from namc.text.template import TemplateStats

__all__ = ["FilterReport", "filter_results", "main"]

logger = logging.getLogger(__name__)


@dataclass
class FilterReport:
    """What :func:`filter_results` did: Table 14 rows, request failures by source, output paths."""

    stats: TemplateStats
    failed: Counter[str] = field(default_factory=Counter)
    results: int = 0
    accepted: int = 0
    corrupt_lines: int = 0
    manifest: Path | None = None
    rejects: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        rows = {
            name: {
                "total": r.total,
                "unique": r.unique,
                "repetition": r.repetition,
                "repetition_ratio": r.repetition_ratio,
                "rejected": dict(r.rejected),
                "n_rejected": r.n_rejected,
                "rejection_ratio": r.rejection_ratio,
            }
            for name, r in self.stats.rows().items()
        }
        return {
            "results": self.results,
            "accepted": self.accepted,
            "table14": rows,
            "request_failed": dict(self.failed),
            "corrupt_result_lines": self.corrupt_lines,
            "manifest": str(self.manifest),
            "rejects": str(self.rejects),
        }

    def format(self) -> str:
        failed = sum(self.failed.values())
        lines = [
            "Table 14 (accepted descriptions; ratio truncated to 2 decimals as the paper prints it) and rejections:",
            self.stats.format_table(),
            f"{self.results} results: {self.accepted} accepted -> {self.manifest}; "
            f"{self.results - self.accepted} rejected -> {self.rejects} "
            f"({failed} of them request failures"
            + (": " + ", ".join(f"{k}={v}" for k, v in sorted(self.failed.items())) if failed else "")
            + ")",
        ]
        if self.corrupt_lines:
            lines.append(f"{self.corrupt_lines} corrupt result lines ignored")
        return "\n".join(lines)


def _write_partial(path: Path) -> Any:
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path.with_name(f".{path.name}.partial"), "w", encoding="utf-8")


def filter_results(results: str | Path, manifest: str | Path, rejects: str | Path) -> FilterReport:
    """Validates every final result of a describe run; writes the manifest and the rejects file.

    Args:
        results: the results JSONL of ``namc curate describe``.
        manifest: the accepted pairs (``namc data pack`` input), written atomically.
        rejects: the rejected ones with their reason, written atomically.

    Returns:
        the :class:`FilterReport` (Table 14 rows in ``report.stats``).
    """
    results, manifest, rejects = Path(results), Path(manifest), Path(rejects)
    where, corrupt = last_results(results)
    report = FilterReport(TemplateStats(), results=len(where), corrupt_lines=corrupt)
    report.manifest, report.rejects = manifest, rejects
    src_dir, dst_dir = results.parent, manifest.parent
    with open(results, "rb") as f, _write_partial(manifest) as good, _write_partial(rejects) as bad:
        for pair_id in sorted(where):
            r = read_at(f, where[pair_id])
            source = str(r.get("source") or "").strip() or "unknown"
            if r.get("status") != "ok":
                report.failed[source] += 1
                detail = f"{r.get('error_kind')}: {r.get('error')}"
                bad.write(json.dumps({"id": pair_id, "source": source, "reason": "request_failed", "detail": detail}))
                bad.write("\n")
                continue
            text = r.get("text") if isinstance(r.get("text"), str) else ""
            refs = [r.get("image1"), r.get("image2")]
            if not all(isinstance(x, str) and x.strip() for x in refs):  # a hand-made results line
                report.failed[source] += 1
                row = {"id": pair_id, "source": source, "reason": "bad_result", "detail": "no image1/image2 refs"}
                bad.write(json.dumps(row) + "\n")
                continue
            free_text = r.get("prompt") == CONVENTIONAL
            reason = report.stats.add(text, source, free_text)
            if reason is not None:
                row = {"id": pair_id, "source": source, "reason": reason.value, "text": text}
                bad.write(json_line(row))
                continue
            obj = {"id": pair_id, "source": source, "description": text}
            if free_text:
                obj["free_text"] = True
            obj["image1"], obj["image2"] = (rebase_ref(x, src_dir, dst_dir) for x in refs)
            try:
                record = parse_record(obj)  # the template and the refs were checked above; the id was not
            except RecordError as err:
                report.failed[source] += 1
                bad.write(json_line({"id": pair_id, "source": source, "reason": "bad_result", "detail": str(err)}))
                continue
            good.write(json_line(record.to_json()))
            report.accepted += 1
    os.replace(good.name, manifest)
    os.replace(bad.name, rejects)
    return report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="namc curate filter",
        description="Validate descriptions against the template (appendix D.2): manifest, rejects, Table 14 stats.",
    )
    add_config_arguments(p)
    p.add_argument("--workdir", type=Path, default=None, help="default folder of every file below")
    p.add_argument("--results", type=Path, default=None, help="describe results (default WORKDIR/descriptions.jsonl)")
    p.add_argument("--out", type=Path, default=None, help="manifest to write (default: manifest.jsonl beside results)")
    p.add_argument("--rejects", type=Path, default=None, help="rejects JSONL (default: rejects.jsonl beside --out)")
    p.add_argument("--stats", type=Path, default=None, help="statistics JSON (default: table14.json beside --out)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_with_config(build_parser(), argv, "filter")
    if args.results is None and args.workdir is None:
        print("namc curate filter: give --results (or --workdir holding descriptions.jsonl)", file=sys.stderr)
        return 2
    results = args.results or args.workdir / "descriptions.jsonl"
    if not results.is_file():
        print(f"namc curate filter: results file not found: {results}", file=sys.stderr)
        return 2
    out = args.out or results.parent / "manifest.jsonl"
    stats = args.stats or out.parent / "table14.json"
    try:
        with output_lock(out.parent, "namc curate filter"):  # a describe run still appending is refused too
            report = filter_results(results, out, args.rejects or out.parent / "rejects.jsonl")
            atomic_write_text(stats, json.dumps(report.to_dict(), indent=2) + "\n")
    except LockedError as err:
        print(f"namc curate filter: error: {err}", file=sys.stderr)
        return 2
    print(report.format())
    print(f"statistics: {stats}  (next: namc data pack {out} SHARDS_DIR)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
