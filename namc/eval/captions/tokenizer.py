"""pycocoevalcap's PTB tokenizer, run without writing into its package folder.

pycocoevalcap is an optional extra (``namc[train]``): nothing here imports it at module level, and
:func:`require_pycocoevalcap` turns its absence into an error that says how to install it. The Java tools it wraps
need a Java runtime on ``PATH``.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["java", "ptb_tokenize", "require_java", "require_pycocoevalcap"]

# Characters str.splitlines() treats as line boundaries; the Java tokenizer splits on some of them too.
_LINE_BREAKS = str.maketrans({c: " " for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"})


@functools.cache
def require_pycocoevalcap() -> Path:
    """Check that pycocoevalcap is installed and return its folder, which holds its jars.

    Raises:
        ModuleNotFoundError: pycocoevalcap is not installed; the message says ``pip install "namc[train]"``.
    """
    try:
        from pycocoevalcap.tokenizer import ptbtokenizer
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(
            'caption metrics need pycocoevalcap, an optional extra: pip install "namc[train]"', name=err.name
        ) from err
    # pycocoevalcap has no __init__.py (a namespace package): locate it through a module file.
    return Path(ptbtokenizer.__file__).resolve().parent.parent


def java() -> str | None:
    """The ``java`` executable on ``PATH``, or None."""
    return shutil.which("java")


def require_java() -> None:
    """Raise a ``RuntimeError`` that says how to install Java when it is missing."""
    if java() is None:
        raise RuntimeError(
            "Java was not found on PATH; pycocoevalcap's PTB tokenizer and METEOR need a Java runtime "
            "(e.g. `apt-get install default-jre-headless`)."
        )


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
        ModuleNotFoundError: pycocoevalcap is not installed.
        RuntimeError: Java is missing, the tokenizer fails, or it returns a different number of lines.
    """
    tokenizer_dir = require_pycocoevalcap() / "tokenizer"  # imports pycocoevalcap, or says how to install it
    from pycocoevalcap.tokenizer import ptbtokenizer

    jar = tokenizer_dir / ptbtokenizer.STANFORD_CORENLP_3_4_1_JAR
    require_java()
    ids = [key for key, caps in captions.items() for _ in caps]
    lines = [cap.translate(_LINE_BREAKS) for caps in captions.values() for cap in caps]
    if not lines:
        return {key: [] for key in captions}
    with tempfile.TemporaryDirectory(prefix="namc_ptb_") as tmp:
        path = Path(tmp) / "captions.txt"
        path.write_bytes("\n".join(lines).encode())
        cmd = ["java", "-cp", str(jar), "edu.stanford.nlp.process.PTBTokenizer", "-preserveLines", "-lowerCase"]
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
