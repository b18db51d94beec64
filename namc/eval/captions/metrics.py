"""The COCO caption metrics x100 (BLEU-1..4, METEOR, ROUGE-L, CIDEr-D, SPICE), overall and per change type.

See :mod:`namc.eval.captions` for what each metric is, the per-type protocol and where this differs from calling
pycocoevalcap directly. pycocoevalcap (``namc[train]``) is imported inside the functions that score.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from namc.eval.captions.tokenizer import java, ptb_tokenize, require_java, require_pycocoevalcap

logger = logging.getLogger(__name__)

__all__ = [
    "METRIC_KEYS",
    "NO_CHANGE_CAPTION",
    "CaptionEvaluator",
    "evaluate_captions",
    "few_ids",
    "spice_status",
    "trivial_baselines",
]

#: Keys of every metric dict, in the order the papers print them.
METRIC_KEYS: tuple[str, ...] = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D", "SPICE")

#: The constant caption of the judge-free diagnostic (:func:`trivial_baselines`): a captioner that names no change.
NO_CHANGE_CAPTION = "no change"

#: The jars ``spice-1.0.jar``'s manifest puts on its class path and ``get_stanford_models()`` would download.
_SPICE_CORENLP_JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")
_MAX_IDS_IN_ERROR = 5


def few_ids(ids: Sequence[str] | set[str]) -> str:
    """Name at most a few ids in an error message."""
    ids = sorted(ids)
    shown = ", ".join(repr(i) for i in ids[:_MAX_IDS_IN_ERROR])
    more = f" and {len(ids) - _MAX_IDS_IN_ERROR} more" if len(ids) > _MAX_IDS_IN_ERROR else ""
    return f"{shown}{more}"


def _spice_dir() -> Path:
    """pycocoevalcap's ``spice`` folder (its jar, ``lib/``, and the ``tmp``/``cache`` folders SPICE writes)."""
    return require_pycocoevalcap() / "spice"


def spice_status() -> tuple[bool, str]:
    """Whether pycocoevalcap's SPICE can run here, checked without constructing ``Spice()``.

    ``Spice()`` calls ``get_stanford_models()``, which downloads Stanford CoreNLP 3.6.0 when
    ``spice/lib/stanford-corenlp-3.6.0.jar`` is missing; ``spice-1.0.jar`` also needs
    ``stanford-corenlp-3.6.0-models.jar`` on its manifest class path, and writes ``spice/tmp`` and
    ``spice/cache`` inside the package folder.

    Returns:
        ``(True, "available")``, or ``(False, reason)`` with a one-line reason.

    Raises:
        ModuleNotFoundError: pycocoevalcap is not installed.
    """
    spice_dir = _spice_dir()
    if java() is None:
        return False, "java not found on PATH"
    if not (spice_dir / "spice-1.0.jar").is_file():
        return False, f"spice-1.0.jar missing from {spice_dir}"
    missing = [name for name in _SPICE_CORENLP_JARS if not (spice_dir / "lib" / name).is_file()]
    if missing:
        # pycocoevalcap would download them (stanford-corenlp-full-2015-12-09.zip); copying both there enables SPICE.
        return False, f"Stanford CoreNLP 3.6.0 jars missing from {spice_dir / 'lib'}: {', '.join(missing)}"
    if not os.access(spice_dir, os.W_OK):
        return False, f"pycocoevalcap writes SPICE temp and cache files into {spice_dir}, which is not writable"
    return True, "available"


def _validate(
    predictions: Mapping[str, str],
    references: Mapping[str, Sequence[str]],
    change_types: Mapping[str, str | Sequence[str]] | None,
) -> None:
    """Raise a ``ValueError`` naming offending ids; see :func:`evaluate_captions`."""
    if not predictions:
        raise ValueError("no predictions to score")
    pred_ids, ref_ids = set(predictions), set(references)
    only_pred, only_ref = pred_ids - ref_ids, ref_ids - pred_ids
    if only_pred or only_ref:
        parts = []
        if only_pred:
            parts.append(f"{len(only_pred)} prediction id(s) have no references: {few_ids(only_pred)}")
        if only_ref:
            parts.append(f"{len(only_ref)} reference id(s) have no prediction: {few_ids(only_ref)}")
        raise ValueError("predictions and references must have the same ids; " + "; ".join(parts))
    bad_pred = [k for k, v in predictions.items() if not isinstance(v, str)]
    if bad_pred:
        raise ValueError(f"predictions must be strings; not for id(s) {few_ids(bad_pred)}")
    bad_ref = [
        k
        for k, refs in references.items()
        if isinstance(refs, str) or not refs or not all(isinstance(r, str) and r.strip() for r in refs)
    ]
    if bad_ref:
        raise ValueError(f"references must be non-empty lists of non-empty strings; not for id(s) {few_ids(bad_ref)}")
    if change_types is not None:
        untyped = pred_ids - set(change_types)
        if untyped:
            raise ValueError(f"{len(untyped)} prediction id(s) have no change type: {few_ids(untyped)}")


class CaptionEvaluator:
    """Holds the pycocoevalcap scorers; the METEOR JVM starts on first use and lives until :meth:`close`.

    Scores are x100 (see :mod:`namc.eval.captions` for the metric definitions, CIDEr-D and the per-type protocol).
    Use as a context manager, or call :meth:`close`. Thread-safe: evaluations are serialised.

    Args:
        spice: compute SPICE when :func:`spice_status` says it can run; when False, SPICE is reported as
            ``"unavailable (disabled: spice=False)"``.
    """

    def __init__(self, spice: bool = True) -> None:
        self.spice = spice
        self._meteor: Any = None  # pycocoevalcap's Meteor, once started
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

    def _meteor_scorer(self) -> Any:
        """The running METEOR scorer (pycocoevalcap's ``Meteor``), started on first use."""
        if self._meteor is None:
            require_pycocoevalcap()
            from pycocoevalcap.meteor.meteor import Meteor

            require_java()
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
        from pycocoevalcap.bleu.bleu import Bleu
        from pycocoevalcap.cider.cider import Cider
        from pycocoevalcap.rouge.rouge import Rouge

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

    def _score_per_type(
        self,
        gts: dict[str, list[str]],
        res: dict[str, list[str]],
        change_types: Mapping[str, str | Sequence[str]],
        spice: float | str,
        spice_per_id: dict[str, float],
    ) -> tuple[dict[str, dict[str, float | str]], dict[str, int]]:
        """Every metric recomputed on the pairs of each change type (CIDEr-D's IDF from that subset).

        Args:
            gts: id -> tokenized references.
            res: id -> [tokenized prediction], the same ids.
            change_types: id -> change type, for every id of ``res``; a tuple or list of types (OmniDiff's pairs
                have several) puts the pair in each of its types' subsets (none when it is empty).
            spice: the overall SPICE (a float, or the "unavailable (...)" string every type then reports).
            spice_per_id: id -> SPICE x100 of that pair (empty when SPICE did not run).

        Returns:
            ``(per_type, per_type_num_pairs)``: type -> metric -> score x100, and type -> number of pairs, types
            sorted.
        """
        groups: dict[str, list[str]] = {}
        for k in res:
            types = change_types[k]
            for change_type in types if isinstance(types, (tuple, list)) else (types,):
                groups.setdefault(str(change_type), []).append(k)
        per_type: dict[str, dict[str, float | str]] = {}
        for change_type, members in sorted(groups.items()):
            scores: dict[str, float | str] = dict(
                self._score({k: gts[k] for k in members}, {k: res[k] for k in members})
            )
            # SPICE is a mean of per-pair scores: the subset's mean is what a subset run would give.
            scores["SPICE"] = float(np.mean([spice_per_id[k] for k in members])) if spice_per_id else spice
            per_type[change_type] = scores
        return per_type, {t: len(m) for t, m in sorted(groups.items())}

    def evaluate(
        self,
        predictions: Mapping[str, str],
        references: Mapping[str, Sequence[str]],
        *,
        change_types: Mapping[str, str | Sequence[str]] | None = None,
    ) -> dict[str, Any]:
        """Score predicted captions against references; see :func:`evaluate_captions`."""
        _validate(predictions, references, change_types)
        require_pycocoevalcap()
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
                raise ValueError(f"references are empty after PTB tokenization for id(s) {few_ids(empty_refs)}")

            overall: dict[str, float | str] = dict(self._score(gts, res))
            spice, spice_per_id = self._spice(gts, res)
            overall["SPICE"] = spice
            result: dict[str, Any] = {"overall": overall}
            if change_types is not None:
                result["per_type"], result["per_type_num_pairs"] = self._score_per_type(
                    gts, res, change_types, spice, spice_per_id
                )
            result.update({"num_pairs": len(ids), "scale": "x100", "tokenizer": "PTB"})
            logger.info("scored %d caption pairs in %.1f s", len(ids), time.perf_counter() - start)
        return result


def evaluate_captions(
    predictions: dict[str, str],
    references: dict[str, list[str]],
    *,
    change_types: Mapping[str, str | Sequence[str]] | None = None,
    spice: bool = True,
) -> dict[str, Any]:
    """Score predicted captions with the COCO caption metrics, x100, as IDC papers report them.

    Starts (and stops) one METEOR JVM; to score many sets, keep a :class:`CaptionEvaluator` instead.

    Args:
        predictions: id -> one predicted caption (may be ``""``: it is scored, mostly as 0).
        references: id -> list of N_id >= 1 reference captions; the same ids as ``predictions``.
        change_types: optional id -> change type (e.g. CLEVR-Change "color", "move", "distractor") for every
            prediction id (extra ids are ignored). Each type's metrics are recomputed on its subset, CIDEr-D's IDF
            included, like the CLEVR-Change community code. A tuple of types (OmniDiff: a pair has one or more of
            12) counts the pair under each, so ``per_type_num_pairs`` may sum to more than ``num_pairs``.
        spice: try SPICE; it is reported as ``"unavailable (<reason>)"`` when it cannot run, never as 0.

    Returns:
        ``{"overall": {metric: score}, "per_type": {type: {metric: score}}, "per_type_num_pairs": {type: n},
        "num_pairs": n, "scale": "x100", "tokenizer": "PTB"}`` with metrics :data:`METRIC_KEYS`
        (``per_type*`` only when ``change_types`` is given). ``CIDEr-D`` is pycocoevalcap's ``Cider``.

    Raises:
        ValueError: ids differ between predictions and references (or lack a change type), a caption is not a
            string, or an id has no non-empty reference; the message names a few of the ids.
        RuntimeError: Java is missing or a Java scorer fails.
        ModuleNotFoundError: pycocoevalcap (``pip install "namc[train]"``) is not installed.
    """
    with CaptionEvaluator(spice=spice) as evaluator:
        return evaluator.evaluate(predictions, references, change_types=change_types)


def trivial_baselines(
    references: Mapping[str, Sequence[str]], change_types: Mapping[str, str | Sequence[str]] | None = None
) -> dict[str, Any]:
    """CIDEr-D (x100) of two captions that look at no image, predicted for every pair: the constant
    :data:`NO_CHANGE_CAPTION` and the most frequent reference caption of the set (ties broken alphabetically).

    A judge-free diagnostic printed beside a model's CIDEr-D: on a set with no-change distractors these captions
    score well on the distractors, so a model's score near theirs says it may name few real changes. Per change
    type, CIDEr-D is recomputed on the type's subset, as :meth:`CaptionEvaluator.evaluate` does.

    Args:
        references: id -> reference captions (non-empty lists of non-empty strings).
        change_types: optional id -> change type (or several), for per-type scores.

    Returns:
        ``{"no_change": {"caption", "CIDEr-D", "per_type"}, "most_frequent_reference": {...}}`` (``per_type`` only
        with ``change_types``).

    Raises:
        ValueError: no references, or an empty reference list.
        ModuleNotFoundError: pycocoevalcap (``pip install "namc[train]"``) is not installed.
    """
    from collections import Counter

    _validate({k: "" for k in references}, references, change_types)
    require_pycocoevalcap()
    from pycocoevalcap.cider.cider import Cider

    ids = list(references)
    counts = Counter(" ".join(r.split()) for k in ids for r in references[k])
    frequent = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]
    constants = {"no_change": NO_CHANGE_CAPTION, "most_frequent_reference": frequent}
    tokens = ptb_tokenize(
        {**{f"r:{k}": list(references[k]) for k in ids}, **{f"c:{n}": [c] for n, c in constants.items()}}
    )
    gts = {k: tokens[f"r:{k}"] for k in ids}
    groups: dict[str, list[str]] = {}
    for k in ids if change_types is not None else ():
        types = change_types[k]
        for change_type in types if isinstance(types, (tuple, list)) else (types,):
            groups.setdefault(str(change_type), []).append(k)

    def cider(caption: list[str], members: list[str]) -> float:
        score, _ = Cider().compute_score({k: gts[k] for k in members}, {k: caption for k in members})
        return 100.0 * float(score)

    out: dict[str, Any] = {}
    for name, caption in constants.items():
        entry: dict[str, Any] = {"caption": caption, "CIDEr-D": cider(tokens[f"c:{name}"], ids)}
        if change_types is not None:
            entry["per_type"] = {t: cider(tokens[f"c:{name}"], m) for t, m in sorted(groups.items())}
        out[name] = entry
    return out
