"""Names read out of files that must stay where they belong: :func:`contained` for a file a model folder names
(``tokenizer.json``'s ``bpe``), :func:`check_revision` for a Hub revision (a git branch, tag or commit).

A model folder is untrusted input: a name in one of its files that is absolute, climbs out with ``..`` or reaches
out through a symlink would make namc read whatever file it points at. Both checks raise :class:`PathEscapeError`,
a ``ValueError`` whose message is one line naming the file (and key) the name came from.

This module imports nothing heavy, so any layer of namc can use it.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath, PureWindowsPath

__all__ = ["PathEscapeError", "check_revision", "contained"]

_COMMIT = re.compile(r"[0-9a-f]{40}")
# git check-ref-format: no control characters, space, ~ ^ : ? * [ or backslash anywhere in a ref name
_REF_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")
_MAX_REVISION_CHARS = 255  # git allows longer; no real branch or tag comes near this


class PathEscapeError(ValueError):
    """A name read from a file would leave the folder it must stay in, or is not a valid git revision."""


def contained(folder: str | Path, name: object, what: str) -> Path:
    """``folder / name``, refusing a ``name`` that would leave ``folder``.

    Refused: a non-string or empty name, an absolute path (POSIX or Windows, a drive included), a ``..`` component,
    a NUL byte, and a name that resolves outside ``folder`` through a symlink (the folder itself may be a link).

    Args:
        folder: the folder the file must be in (a model folder).
        name: the relative name, as read from a file.
        what: where the name came from, for the message, e.g. ``"model/tokenizer.json: bpe"``.

    Returns:
        the path (not resolved, so messages show what the file named).

    Raises:
        PathEscapeError: one line naming ``what``, the name and why.
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        raise PathEscapeError(f"{what}: {name!r} is not a file name")
    windows = PureWindowsPath(name)
    if PurePosixPath(name).is_absolute() or windows.is_absolute() or windows.drive or windows.root:
        raise PathEscapeError(f"{what}: {name!r} is an absolute path; it must name a file inside {folder}")
    if ".." in re.split(r"[\\/]", name):
        raise PathEscapeError(f"{what}: {name!r} contains '..'; it must name a file inside {folder}")
    path = Path(folder) / name
    if not path.resolve().is_relative_to(Path(folder).resolve()):
        raise PathEscapeError(f"{what}: {name!r} resolves outside {folder} (through a symbolic link)")
    return path


def check_revision(revision: str, what: str) -> str:
    """``revision`` if it is a 40-hex commit or a valid git ref name (branch, tag, ``refs/pr/1``), else an error.

    The rules are git's (``git check-ref-format --allow-onelevel``): no ``..``, no component starting with ``.`` or
    ending in ``.lock``, no empty component, no ``@{``, not ``@``, no trailing ``.``, no control characters,
    spaces, ``~ ^ : ? * [`` or backslashes. So a revision can never name a file outside the Hub cache's ``refs/``.

    Raises:
        PathEscapeError: one line naming ``what`` and the rule broken.
    """
    if _COMMIT.fullmatch(revision):
        return revision
    problem = None
    if not revision or len(revision) > _MAX_REVISION_CHARS:
        problem = f"must have 1 to {_MAX_REVISION_CHARS} characters"
    elif _REF_FORBIDDEN.search(revision):
        problem = "contains a space, a control character or one of ~ ^ : ? * [ \\"
    elif ".." in revision or "@{" in revision or revision == "@":
        problem = "contains '..' or '@{', or is '@'"
    elif revision.endswith(".") or any(not p or p.startswith(".") or p.endswith(".lock") for p in revision.split("/")):
        problem = (
            "ends in '.', has an empty part ('/' at an end, '//'), or a part that starts with '.' or ends in .lock"
        )
    if problem:
        raise PathEscapeError(
            f"{what}: revision {revision!r} is not a branch, tag or commit name: it {problem} (git's ref-name rules)"
        )
    return revision
