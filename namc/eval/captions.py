"""Caption metrics for image difference captioning, through pycocoevalcap (the COCO caption evaluation code).

The NAMC paper (section 4, "Experiments") reports BLEU (B), METEOR (M), CIDEr (C), ROUGE-L (R) and SPICE (S) on
CLEVR-DC, CLEVR-Change, Image-Editing-Request and Spot-the-Diff, as the IDC literature does with the COCO caption
evaluation code. This module reproduces those numbers:

- Captions are tokenized with pycocoevalcap's PTB tokenizer (Stanford CoreNLP 3.4.1 ``PTBTokenizer``,
  ``-preserveLines -lowerCase``, then its punctuation list removed), predictions and references alike.
- ``BLEU-1``..``BLEU-4`` (corpus level, ``closest`` reference length), ``METEOR`` 1.5 (corpus level, ``-l en
  -norm``), ``ROUGE-L`` (beta 1.2, mean over pairs), ``CIDEr-D`` and ``SPICE`` 1.0 (mean over pairs).
- pycocoevalcap's ``Cider`` class is **CIDEr-D** (clipped n-gram counts and a Gaussian length penalty with sigma 6,
  x10), which is what the captioning papers print as "CIDEr"; we name the key ``CIDEr-D`` to say so. Its IDF is
  computed from the references of the set being scored (so a set of one pair scores 0: every n-gram's IDF is
  log(1/1)).
- Every score is multiplied by 100, as the papers print them (BLEU-4 0.532 -> 53.2; CIDEr-D 1.253 -> 125.3).
- Per change type (CLEVR-Change: color, material, add, drop, move, distractor), every metric is recomputed on the
  subset of pairs of that type, so CIDEr-D's IDF comes from that subset's references. This is what the
  CLEVR-Change community code does (``score_generation_by_type`` in Seth-Park/RobustChangeCaptioning
  ``utils/eval_utils.py`` restricts ``COCOEvalCap.params['image_id']`` to the type's ids and re-runs
  ``evaluate()``), so per-type numbers are comparable with published tables. SPICE is a mean of independent
  per-pair scores, so its per-type value is the mean of the overall run's per-pair scores over the subset (the
  same number a subset run gives, without re-parsing).

Differences from calling ``pycocoevalcap`` directly, all on purpose:

- **Temp files.** pycocoevalcap's ``PTBTokenizer`` writes its input into a temporary file *inside its own package
  folder* (``pycocoevalcap/tokenizer/``), which fails on a read-only install (a system site-packages, a read-only
  container layer) with ``PermissionError``/``OSError``; concurrent runs are safe (unique names). We run the same
  jar with the same flags and the same punctuation list, but put the file in the system temp directory, so
  tokens are identical and a read-only install works. SPICE also writes ``spice/tmp`` and ``spice/cache`` in the
  package folder; :func:`spice_status` reports SPICE unavailable when that folder is not writable. METEOR writes
  nothing.
- **Line breaks inside a caption.** pycocoevalcap replaces only ``"\\n"`` before writing one caption per line; a
  ``"\\r"`` or ``"\\u2028"`` inside a caption makes the Java tokenizer emit an extra line and silently shifts every
  later caption onto the wrong id. We replace every line-break character with a space and check that the
  tokenizer returned exactly one line per caption.
- **SPICE.** ``Spice()`` downloads Stanford CoreNLP 3.6.0 from nlp.stanford.edu when its jars are missing (no
  network here). :func:`spice_status` checks for the jars before ``Spice()`` is ever constructed, and the results
  then hold ``"SPICE": "unavailable (<reason>)"``, never 0. A SPICE run that fails (SPICE 1.0 is known to fail
  on Java >= 16 unless ``JDK_JAVA_OPTIONS="--add-opens java.base/java.lang=ALL-UNNAMED"``) is reported the same
  way instead of crashing the evaluation.
- **METEOR JVM.** ``Meteor()`` starts a JVM that loads its paraphrase table (seconds). :class:`CaptionEvaluator`
  starts it once, lazily, and keeps it for its lifetime; ``close()`` (or leaving the ``with`` block) stops it.
- **Input checks.** Id mismatches, non-string captions and empty reference lists are ``ValueError`` naming the
  ids, instead of an ``AssertionError`` deep inside a scorer.

Example:
    >>> with CaptionEvaluator() as evaluator:  # doctest: +SKIP
    ...     scores = evaluator.evaluate(predictions, references, change_types=types)
    >>> scores["overall"]["CIDEr-D"]  # doctest: +SKIP
    125.3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.meteor.meteor import Meteor
from pycocoevalcap.rouge.rouge import Rouge
from pycocoevalcap.tokenizer import ptbtokenizer

logger = logging.getLogger(__name__)

__all__ = [
    "METRIC_KEYS",
    "CaptionEvaluator",
    "evaluate_captions",
    "main",
    "ptb_tokenize",
    "spice_status",
    "write_results",
]

#: Keys of every metric dict, in the order the papers print them.
METRIC_KEYS: tuple[str, ...] = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D", "SPICE")

# pycocoevalcap has no __init__.py (a namespace package): locate it through a module file.
_PACKAGE_DIR = Path(ptbtokenizer.__file__).resolve().parent.parent
_PTB_JAR = _PACKAGE_DIR / "tokenizer" / ptbtokenizer.STANFORD_CORENLP_3_4_1_JAR
_SPICE_DIR = _PACKAGE_DIR / "spice"
#: The jars ``spice-1.0.jar``'s manifest puts on its class path and ``get_stanford_models()`` would download.
_SPICE_CORENLP_JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")
# Characters str.splitlines() treats as line boundaries; the Java tokenizer splits on some of them too.
_LINE_BREAKS = str.maketrans({c: " " for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"})
_MAX_IDS_IN_ERROR = 5


def _java() -> str | None:
    return shutil.which("java")


def _require_java() -> None:
    if _java() is None:
        raise RuntimeError(
            "Java was not found on PATH; pycocoevalcap's PTB tokenizer and METEOR need a Java runtime "
            "(e.g. `apt-get install default-jre-headless`)."
        )


def _few(ids: Sequence[str] | set[str]) -> str:
    """Name at most a few ids in an error message."""
    ids = sorted(ids)
    shown = ", ".join(repr(i) for i in ids[:_MAX_IDS_IN_ERROR])
    more = f" and {len(ids) - _MAX_IDS_IN_ERROR} more" if len(ids) > _MAX_IDS_IN_ERROR else ""
    return f"{shown}{more}"


def spice_status() -> tuple[bool, str]:
    """Whether pycocoevalcap's SPICE can run here, checked without constructing ``Spice()``.

    ``Spice()`` calls ``get_stanford_models()``, which downloads Stanford CoreNLP 3.6.0 when
    ``spice/lib/stanford-corenlp-3.6.0.jar`` is missing; ``spice-1.0.jar`` also needs
    ``stanford-corenlp-3.6.0-models.jar`` on its manifest class path, and writes ``spice/tmp`` and
    ``spice/cache`` inside the package folder.

    Returns:
        ``(True, "available")``, or ``(False, reason)`` with a one-line reason.
    """
    if _java() is None:
        return False, "java not found on PATH"
    if not (_SPICE_DIR / "spice-1.0.jar").is_file():
        return False, f"spice-1.0.jar missing from {_SPICE_DIR}"
    missing = [name for name in _SPICE_CORENLP_JARS if not (_SPICE_DIR / "lib" / name).is_file()]
    if missing:
        # pycocoevalcap would download them (stanford-corenlp-full-2015-12-09.zip); copying both there enables SPICE.
        return False, f"Stanford CoreNLP 3.6.0 jars missing from {_SPICE_DIR / 'lib'}: {', '.join(missing)}"
    if not os.access(_SPICE_DIR, os.W_OK):
        return False, f"pycocoevalcap writes SPICE temp and cache files into {_SPICE_DIR}, which is not writable"
    return True, "available"


def ptb_tokenize(captions: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Tokenize captions exactly as pycocoevalcap's ``PTBTokenizer`` does, without writing into its package.

    Same jar (CoreNLP 3.4.1 shipped in ``pycocoevalcap/tokenizer``), same flags (``-preserveLines -lowerCase``),
    same punctuation removal (``ptbtokenizer.PUNCTUATIONS``); the input file goes to the system temp directory.
    Line-break characters inside a caption become spaces (pycocoevalcap only handles ``"\\n"``).

    Args:
        captions: id -> list of N_id raw caption strings.

    Returns:
        id -> list of N_id lower-cased, space-joined token strings (punctuation removed; may be ``""``).

    Raises:
        RuntimeError: Java is missing, the tokenizer fails, or it returns a different number of lines.
    """
    _require_java()
    ids = [key for key, caps in captions.items() for _ in caps]
    lines = [cap.translate(_LINE_BREAKS) for caps in captions.values() for cap in caps]
    if not lines:
        return {key: [] for key in captions}
    with tempfile.TemporaryDirectory(prefix="namc_ptb_") as tmp:
        path = Path(tmp) / "captions.txt"
        path.write_bytes("\n".join(lines).encode())
        cmd = ["java", "-cp", str(_PTB_JAR), "edu.stanford.nlp.process.PTBTokenizer", "-preserveLines", "-lowerCase"]
        proc = subprocess.run([*cmd, str(path)], capture_output=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"PTB tokenizer failed (exit {proc.returncode}): {proc.stderr.decode(errors='replace')}")
    out = proc.stdout.decode().split("\n")
    # Java ends the last line with a newline: expect len(lines) lines, then only empty ones.
    if len(out) < len(lines) or any(line.strip() for line in out[len(lines) :]):
        raise RuntimeError(f"PTB tokenizer returned {len(out)} lines for {len(lines)} captions")
    punct = set(ptbtokenizer.PUNCTUATIONS)
    tokenized: dict[str, list[str]] = {key: [] for key in captions}
    for key, line in zip(ids, out):
        tokenized[key].append(" ".join(w for w in line.rstrip().split(" ") if w not in punct))
    return tokenized


def _validate(
    predictions: Mapping[str, str],
    references: Mapping[str, Sequence[str]],
    change_types: Mapping[str, str] | None,
) -> None:
    """Raise a ``ValueError`` naming offending ids; see :func:`evaluate_captions`."""
    if not predictions:
        raise ValueError("no predictions to score")
    pred_ids, ref_ids = set(predictions), set(references)
    only_pred, only_ref = pred_ids - ref_ids, ref_ids - pred_ids
    if only_pred or only_ref:
        parts = []
        if only_pred:
            parts.append(f"{len(only_pred)} prediction id(s) have no references: {_few(only_pred)}")
        if only_ref:
            parts.append(f"{len(only_ref)} reference id(s) have no prediction: {_few(only_ref)}")
        raise ValueError("predictions and references must have the same ids; " + "; ".join(parts))
    bad_pred = [k for k, v in predictions.items() if not isinstance(v, str)]
    if bad_pred:
        raise ValueError(f"predictions must be strings; not for id(s) {_few(bad_pred)}")
    bad_ref = [
        k
        for k, refs in references.items()
        if isinstance(refs, str) or not refs or not all(isinstance(r, str) and r.strip() for r in refs)
    ]
    if bad_ref:
        raise ValueError(f"references must be non-empty lists of non-empty strings; not for id(s) {_few(bad_ref)}")
    if change_types is not None:
        untyped = pred_ids - set(change_types)
        if untyped:
            raise ValueError(f"{len(untyped)} prediction id(s) have no change type: {_few(untyped)}")


class CaptionEvaluator:
    """Holds the pycocoevalcap scorers; the METEOR JVM starts on first use and lives until :meth:`close`.

    Scores are x100 (see the module docstring for the metric definitions, CIDEr-D and the per-type protocol).
    Use as a context manager, or call :meth:`close`. Thread-safe: evaluations are serialised.

    Args:
        spice: compute SPICE when :func:`spice_status` says it can run; when False, SPICE is reported as
            ``"unavailable (disabled: spice=False)"``.
    """

    def __init__(self, spice: bool = True) -> None:
        self.spice = spice
        self._meteor: Meteor | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> CaptionEvaluator:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown may have torn down subprocess already
            self.close()

    def close(self) -> None:
        """Stop the METEOR JVM (idempotent); a later :meth:`evaluate` starts a new one."""
        meteor, self._meteor = getattr(self, "_meteor", None), None
        if meteor is None:
            return
        proc = meteor.meteor_p
        # Meteor.compute_score does not release its lock when it raises; never wait on it forever.
        locked = meteor.lock.acquire(timeout=10)
        try:
            if proc.stdin is not None and not proc.stdin.closed:
                proc.stdin.close()  # an idle METEOR -stdio loop exits at end of input (~0.1 s)
            try:
                proc.wait(timeout=1)  # one still loading its paraphrase table ignores stdin: kill it
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        finally:
            if locked:
                meteor.lock.release()
        logger.debug("METEOR JVM stopped")

    def _meteor_scorer(self) -> Meteor:
        if self._meteor is None:
            _require_java()
            self._meteor = Meteor()  # starts `java -jar meteor-1.5.jar - - -stdio -l en -norm`
            logger.debug("METEOR JVM started (pid %d)", self._meteor.meteor_p.pid)
        proc = self._meteor.meteor_p
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            self._meteor = None
            raise RuntimeError(f"the METEOR JVM exited with status {proc.returncode}: {err.strip()}")
        return self._meteor

    def _meteor_score(self, gts: dict[str, list[str]], res: dict[str, list[str]]) -> float:
        """Corpus METEOR (0-1) from the running JVM; a JVM that fails mid-request is stopped and reported."""
        scorer = self._meteor_scorer()
        try:
            score, _ = scorer.compute_score(gts, res)
        except (ValueError, OSError) as err:  # float("") after the JVM died, or a broken pipe
            proc = scorer.meteor_p
            proc.kill()
            proc.wait()
            stderr = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
            if scorer.lock.locked():
                scorer.lock.release()
            self.close()
            raise RuntimeError(f"METEOR failed ({err}); JVM exit status {proc.returncode}: {stderr}") from err
        return float(score)

    def _score(self, gts: dict[str, list[str]], res: dict[str, list[str]]) -> dict[str, float]:
        """BLEU-1..4, METEOR, ROUGE-L and CIDEr-D (x100) of tokenized captions.

        Args:
            gts: id -> tokenized references (N_id >= 1 strings).
            res: id -> [tokenized prediction], the same ids in the same order.

        Returns:
            Metric name -> score x100 (SPICE not included).
        """
        bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
        meteor = self._meteor_score(gts, res)
        rouge, _ = Rouge().compute_score(gts, res)
        cider, _ = Cider().compute_score(gts, res)  # CIDEr-D; IDF from these references
        raw = {f"BLEU-{n + 1}": b for n, b in enumerate(bleu)}
        raw.update({"METEOR": meteor, "ROUGE-L": rouge, "CIDEr-D": cider})
        return {key: 100.0 * float(value) for key, value in raw.items()}

    def _spice(self, gts: dict[str, list[str]], res: dict[str, list[str]]) -> tuple[float | str, dict[str, float]]:
        """SPICE x100 overall and per id, or an "unavailable (...)" string and no per-id scores."""
        if not self.spice:
            return "unavailable (disabled: spice=False)", {}
        ok, reason = spice_status()
        if not ok:
            logger.info("SPICE unavailable: %s", reason)
            return f"unavailable ({reason})", {}
        from pycocoevalcap.spice.spice import Spice  # constructed only once the jars are known to be present

        try:
            average, per_pair = Spice().compute_score(gts, res)
        except (subprocess.CalledProcessError, OSError, ValueError, KeyError) as err:
            reason = (
                f"SPICE failed: {err}; SPICE 1.0 needs Java 8-15, or "
                "JDK_JAVA_OPTIONS='--add-opens java.base/java.lang=ALL-UNNAMED' on newer Java"
            )
            logger.warning(reason)
            return f"unavailable ({reason})", {}
        # Spice.compute_score returns per-pair scores in sorted(id) order.
        per_id = {key: 100.0 * float(s["All"]["f"]) for key, s in zip(sorted(gts), per_pair)}
        return 100.0 * float(average), per_id

    def evaluate(
        self,
        predictions: Mapping[str, str],
        references: Mapping[str, Sequence[str]],
        *,
        change_types: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Score predicted captions against references; see :func:`evaluate_captions`."""
        _validate(predictions, references, change_types)
        ids = list(predictions)
        with self._lock:
            start = time.perf_counter()
            tokens = ptb_tokenize(
                {**{f"r:{k}": list(references[k]) for k in ids}, **{f"p:{k}": [predictions[k]] for k in ids}}
            )
            gts = {k: tokens[f"r:{k}"] for k in ids}
            res = {k: tokens[f"p:{k}"] for k in ids}
            empty_refs = [k for k in ids if not any(r.strip() for r in gts[k])]
            if empty_refs:
                raise ValueError(f"references are empty after PTB tokenization for id(s) {_few(empty_refs)}")

            overall: dict[str, float | str] = dict(self._score(gts, res))
            spice, spice_per_id = self._spice(gts, res)
            overall["SPICE"] = spice
            result: dict[str, Any] = {"overall": overall}

            if change_types is not None:
                groups: dict[str, list[str]] = {}
                for k in ids:
                    groups.setdefault(str(change_types[k]), []).append(k)
                per_type: dict[str, dict[str, float | str]] = {}
                for change_type, members in sorted(groups.items()):
                    scores: dict[str, float | str] = dict(
                        self._score({k: gts[k] for k in members}, {k: res[k] for k in members})
                    )
                    scores["SPICE"] = float(np.mean([spice_per_id[k] for k in members])) if spice_per_id else spice
                    per_type[change_type] = scores
                result["per_type"] = per_type
                result["per_type_num_pairs"] = {t: len(m) for t, m in sorted(groups.items())}

            result.update({"num_pairs": len(ids), "scale": "x100", "tokenizer": "PTB"})
            logger.info("scored %d caption pairs in %.1f s", len(ids), time.perf_counter() - start)
        return result


def evaluate_captions(
    predictions: dict[str, str],
    references: dict[str, list[str]],
    *,
    change_types: dict[str, str] | None = None,
    spice: bool = True,
) -> dict[str, Any]:
    """Score predicted captions with the COCO caption metrics, x100, as IDC papers report them.

    Starts (and stops) one METEOR JVM; to score many sets, keep a :class:`CaptionEvaluator` instead.

    Args:
        predictions: id -> one predicted caption (may be ``""``: it is scored, mostly as 0).
        references: id -> list of N_id >= 1 reference captions; the same ids as ``predictions``.
        change_types: optional id -> change type (e.g. CLEVR-Change "color", "move", "distractor") for every
            prediction id (extra ids are ignored). Each type's metrics are recomputed on its subset, CIDEr-D's IDF
            included, like the CLEVR-Change community code.
        spice: try SPICE; it is reported as ``"unavailable (<reason>)"`` when it cannot run, never as 0.

    Returns:
        ``{"overall": {metric: score}, "per_type": {type: {metric: score}}, "per_type_num_pairs": {type: n},
        "num_pairs": n, "scale": "x100", "tokenizer": "PTB"}`` with metrics :data:`METRIC_KEYS`
        (``per_type*`` only when ``change_types`` is given). ``CIDEr-D`` is pycocoevalcap's ``Cider``.

    Raises:
        ValueError: ids differ between predictions and references (or lack a change type), a caption is not a
            string, or an id has no non-empty reference; the message names a few of the ids.
        RuntimeError: Java is missing or a Java scorer fails.
    """
    with CaptionEvaluator(spice=spice) as evaluator:
        return evaluator.evaluate(predictions, references, change_types=change_types)


def write_results(
    path: str | os.PathLike[str],
    predictions: Mapping[str, str],
    references: Mapping[str, Sequence[str]],
    scores: Mapping[str, Any],
) -> Path:
    """Write scores and every prediction beside its references as one JSON file.

    Layout: ``{"scores": scores, "captions": [{"id": id, "prediction": str, "references": [str]}, ...]}`` in the
    order of ``predictions``.

    Args:
        path: output file; parent folders are created.
        predictions: id -> predicted caption.
        references: id -> reference captions (every prediction id must be present).
        scores: the dict returned by :func:`evaluate_captions`.

    Returns:
        The path written.
    """
    missing = set(predictions) - set(references)
    if missing:
        raise ValueError(f"{len(missing)} prediction id(s) have no references: {_few(missing)}")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "scores": dict(scores),
        "captions": [
            {"id": key, "prediction": pred, "references": list(references[key])} for key, pred in predictions.items()
        ],
    }
    out.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return out


# ----------------------------------------------------------------------------------------------------------------
# Command line: `namc eval PREDICTIONS.json REFERENCES.json [--types TYPES.json] [--out RESULTS.json] [--no-spice]`


def _load_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: malformed JSON at line {err.lineno}, column {err.colno}: {err.msg}") from err
    except OSError as err:
        raise ValueError(f"{path}: cannot read ({err.strerror})") from err


def _load_predictions(path: str) -> dict[str, str]:
    """``{"id": "caption"}`` or COCO results ``[{"image_id": id, "caption": "..."}]``."""
    data = _load_json(path)
    if isinstance(data, dict):
        return {str(k): v for k, v in data.items()}
    if isinstance(data, list):
        preds: dict[str, str] = {}
        for i, item in enumerate(data):
            if not isinstance(item, dict) or "image_id" not in item or "caption" not in item:
                raise ValueError(f"{path}: entry {i} is not {{'image_id': ..., 'caption': ...}}")
            key = str(item["image_id"])
            if key in preds:
                raise ValueError(f"{path}: entry {i} repeats image_id {key!r}")
            preds[key] = item["caption"]
        return preds
    raise ValueError(f"{path}: expected an object {{id: caption}} or a list of {{image_id, caption}}")


def _load_references(path: str) -> dict[str, list[str]]:
    """``{"id": ["reference", ...]}`` (the layout of CLEVR-Change's ``change_captions.json``)."""
    data = _load_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object {{id: [reference, ...]}}")
    return {str(k): v for k, v in data.items()}


def _load_types(path: str) -> dict[str, str]:
    """``{"id": "type"}`` or, like CLEVR-Change's ``type_mapping.json``, ``{"type": [id, ...]}``."""
    data = _load_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object {{id: type}} or {{type: [id, ...]}}")
    if all(isinstance(v, list) for v in data.values()):
        types: dict[str, str] = {}
        for change_type, members in data.items():
            for key in members:
                if str(key) in types and types[str(key)] != change_type:
                    raise ValueError(f"{path}: id {key!r} has types {types[str(key)]!r} and {change_type!r}")
                types[str(key)] = change_type
        return types
    return {str(k): str(v) for k, v in data.items()}


def _format(value: float | str) -> str:
    return f"{value:7.2f}" if isinstance(value, float) and not math.isnan(value) else f"{value}"


def main(argv: Sequence[str] | None = None) -> int:
    """Score a predictions file against a references file and print the table (``namc eval``).

    Args:
        argv: arguments after ``eval`` (default ``sys.argv[1:]``).

    Returns:
        Exit status: 0 on success, 2 on bad input.
    """
    parser = argparse.ArgumentParser(
        prog="namc eval",
        description="Caption metrics x100 (PTB tokenizer; BLEU-1..4, METEOR, ROUGE-L, CIDEr-D, SPICE).",
    )
    parser.add_argument("predictions", help='{"id": "caption"} or [{"image_id": ..., "caption": ...}]')
    parser.add_argument("references", help='{"id": ["reference", ...]}')
    parser.add_argument("--types", help='per-type scores: {"id": "type"} or {"type": ["id", ...]}')
    parser.add_argument("--out", help="write scores and captions to this JSON file")
    parser.add_argument("--no-spice", action="store_true", help="do not try SPICE")
    args = parser.parse_args(argv)

    try:
        predictions = _load_predictions(args.predictions)
        references = _load_references(args.references)
        change_types = _load_types(args.types) if args.types else None
        scores = evaluate_captions(predictions, references, change_types=change_types, spice=not args.no_spice)
    except ValueError as err:
        print(f"namc eval: error: {err}", file=sys.stderr)
        return 2

    rows = [("overall", scores["num_pairs"], scores["overall"])]
    rows += [(t, scores["per_type_num_pairs"][t], s) for t, s in scores.get("per_type", {}).items()]
    print(f"{'set':<12} {'n':>6}  " + "  ".join(f"{k:>7}" for k in METRIC_KEYS[:-1]) + "  SPICE")
    for name, n, metrics in rows:
        print(f"{name:<12} {n:>6}  " + "  ".join(_format(metrics[k]) for k in METRIC_KEYS))
    print(f"scores x100; tokenizer PTB; CIDEr-D = pycocoevalcap Cider ({scores['num_pairs']} pairs)")
    if args.out:
        print(f"wrote {write_results(args.out, predictions, references, scores)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
