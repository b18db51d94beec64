"""Caption metrics for image difference captioning, through pycocoevalcap (the COCO caption evaluation code).

Modules: :mod:`~namc.eval.captions.metrics` (:class:`CaptionEvaluator`, :func:`evaluate_captions`, SPICE's
availability, per-type scores), :mod:`~namc.eval.captions.tokenizer` (the PTB tokenizer),
:mod:`~namc.eval.captions.files` (the files ``namc eval`` reads, :func:`write_results`) and
:mod:`~namc.eval.captions.cli` (``namc eval``). pycocoevalcap is an optional extra (``pip install "namc[train]"``):
it is imported when something is scored, not when this package is.

The NAMC paper (section 4, "Experiments") reports BLEU (B), METEOR (M), CIDEr (C), ROUGE-L (R) and SPICE (S) on
CLEVR-DC, CLEVR-Change, Image-Editing-Request and Spot-the-Diff, as the IDC literature does with the COCO caption
evaluation code. This package reproduces those numbers:

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

from namc.eval.captions.cli import main
from namc.eval.captions.files import write_results
from namc.eval.captions.metrics import METRIC_KEYS, CaptionEvaluator, evaluate_captions, spice_status
from namc.eval.captions.tokenizer import ptb_tokenize

__all__ = [
    "METRIC_KEYS",
    "CaptionEvaluator",
    "evaluate_captions",
    "main",
    "ptb_tokenize",
    "spice_status",
    "write_results",
]
