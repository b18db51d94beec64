"""Models on the Hugging Face Hub: ``hf-hub:org/name[@revision]`` ids, resolved to a local model folder, and
:func:`push_to_hub`.

A namc model repo on the Hub holds what :meth:`NAMC.save_pretrained` writes (``config.json``,
``model.safetensors``, ``tokenizer.json``, the BPE vocabulary of CLIP-tokenizer models, ``README.md``, and where
saved ``int8_calibration.json`` and ``shortlist.json``).
:func:`resolve_model_path` turns a Hub id into the folder of that snapshot with ``huggingface_hub.snapshot_download``
(only those files, never a pickle), so every loader that takes a folder takes a Hub id too::

    namc.from_pretrained("hf-hub:org/namc-clevr")               # the main branch
    namc.load_model("hf-hub:org/namc-clevr@v1.0")               # a tag, a branch or a commit hash
    namc describe A.png B.png --model hf-hub:org/namc-clevr

``huggingface_hub`` decides where files live and whether the network may be used: its cache (``HF_HUB_CACHE``,
or ``HF_HOME``/hub, by default ``~/.cache/huggingface/hub``) and its offline mode (``HF_HUB_OFFLINE=1``: the cache
only; a model that is not there is a one-line error saying what to download and where). Uploads take the token from
the environment (``HF_TOKEN``) or from ``hf auth login``, never from an argument.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from namc._version import __version__
from namc.paths import check_revision, contained

__all__ = [
    "HUB_PREFIX",
    "MODEL_FILE_PATTERNS",
    "HubError",
    "HubModelNotFoundError",
    "is_hub_id",
    "parse_hub_id",
    "push_to_hub",
    "resolve_model_path",
]

HUB_PREFIX = "hf-hub:"
# The files of a model folder: config, weights (safetensors only), tokenizer, BPE vocabulary, model card; a
# checksum manifest, if any, is JSON too. Pickle-bearing files (.bin, .pt, .ckpt) are never fetched or pushed.
MODEL_FILE_PATTERNS = ("*.json", "*.safetensors", "*.txt.gz", "*.md")
_CONFIG_FILE = "config.json"  # namc.models.io.CONFIG_FILE (not imported: this module stays free of torch)


class HubError(OSError):
    """A model could not be fetched from or pushed to the Hugging Face Hub; the message says why and what to do."""


class HubModelNotFoundError(HubError, FileNotFoundError):
    """A Hub model (or revision) is neither in the local cache nor reachable."""


def is_hub_id(spec: object) -> bool:
    """Whether ``spec`` is a Hub model id (a string starting with ``hf-hub:``)."""
    return isinstance(spec, str) and spec.startswith(HUB_PREFIX)


def parse_hub_id(spec: str) -> tuple[str, str | None]:
    """Split ``hf-hub:org/name[@revision]`` into the repo id and the revision (``None``: the main branch).

    The ``hf-hub:`` prefix is optional here (``push_to_hub`` takes a bare ``org/name`` too).

    Raises:
        ValueError: not of the form ``org/name[@revision]``, or a revision that is neither a 40-hex commit nor a valid
            git branch or tag name (:func:`namc.paths.check_revision`).
    """
    body = spec[len(HUB_PREFIX) :] if spec.startswith(HUB_PREFIX) else spec
    repo_id, at, revision = body.partition("@")
    owner, slash, name = repo_id.partition("/")
    if not (owner and slash and name) or "/" in name or (at and not revision):
        raise ValueError(f"not a Hub model id: {spec!r}; expected hf-hub:org/name or hf-hub:org/name@revision")
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except ValueError as err:  # HFValidationError: characters the Hub does not allow
        raise ValueError(f"not a Hub model id: {spec!r}: {str(err).splitlines()[0]}") from None
    if revision:  # it names a file under the cache's refs/: '..' or an absolute path would read one outside it
        check_revision(revision, spec)
    return repo_id, revision or None


def _is_true(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _offline() -> bool:
    """huggingface_hub's offline mode: set when it was imported, or in the environment since."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or _is_true(os.environ.get("HF_HUB_OFFLINE"))


def _cache_dir(cache_dir: str | Path | None) -> Path:
    """``cache_dir``, else ``HF_HUB_CACHE`` as the environment has it now, else huggingface_hub's (``HF_HOME``/hub)."""
    from huggingface_hub import constants

    if cache_dir is None:
        cache_dir = os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE
    return Path(cache_dir).expanduser()


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def _download_command(repo_id: str, revision: str | None, cache: Path) -> str:
    """The ``hf download`` command that puts the model into ``cache``."""
    rev = f" --revision {revision}" if revision else ""
    include = " ".join(f"--include '{p}'" for p in MODEL_FILE_PATTERNS)
    return f"hf download {repo_id}{rev} {include} --cache-dir {cache}"


def _not_found(spec: str, repo_id: str, revision: str | None, cache: Path, err: BaseException, offline: bool) -> str:
    """One line: what is missing, where it was looked for, and the command that fetches it."""
    fetch = _download_command(repo_id, revision, cache)
    if offline:
        why = "HF_HUB_OFFLINE=1 forbids downloading it"
        todo = f"run `{fetch}` on a machine with network access (or unset HF_HUB_OFFLINE)"
    else:
        why = f"the Hub could not be reached ({_first_line(err.__cause__ or err)})"
        todo = f"check the network and run `{fetch}`"
    return (
        f"{spec}: model {repo_id} (revision {revision or 'main'}) is not in the Hugging Face cache {cache} and {why}; "
        f"{todo}, or set HF_HUB_CACHE to a cache that holds it"
    )


def resolve_model_path(spec: str | Path, *, cache_dir: str | Path | None = None) -> Path:
    """The local folder (or file) a model spec names: a Hub id is fetched into the Hub cache, a path is kept.

    Args:
        spec: ``hf-hub:org/name`` or ``hf-hub:org/name@revision`` (a branch, a tag or a commit hash), or a local
            path (returned as a :class:`~pathlib.Path`, unchecked).
        cache_dir: the Hub cache to use (default: huggingface_hub's, from ``HF_HUB_CACHE`` / ``HF_HOME``).

    Returns:
        the path; for a Hub id, the snapshot folder inside the cache (``models--org--name/snapshots/<commit>``).

    Raises:
        ValueError: a malformed Hub id.
        HubModelNotFoundError: the model or revision is not in the cache and cannot be downloaded (offline mode,
            no network, no such repo); the message names the cache and the command that fetches it.
        HubError: the snapshot is not a namc model folder (no ``config.json``), or the Hub refused the request.
    """
    if not is_hub_id(spec):
        return Path(spec)
    spec = str(spec)
    repo_id, revision = parse_hub_id(spec)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    offline = _offline()
    cache = _cache_dir(cache_dir)
    try:
        folder = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache,
            allow_patterns=list(MODEL_FILE_PATTERNS),
            local_files_only=offline,
            library_name="namc",
            library_version=__version__,
        )
    except IncompleteSnapshotError as err:  # an interrupted download, and offline or unreachable now
        missing = str(err).split(". ")[0]
        raise HubModelNotFoundError(
            f"{spec}: {missing}; run `{_download_command(repo_id, revision, cache)}` with network access"
        ) from None
    except LocalEntryNotFoundError as err:  # not cached, and offline or unreachable
        raise HubModelNotFoundError(_not_found(spec, repo_id, revision, cache, err, offline)) from None
    except RepositoryNotFoundError as err:  # the Hub answered: no such repo, or private / gated without access
        raise HubModelNotFoundError(
            f"{spec}: the Hub has no model {repo_id} that this account can read ({_first_line(err)}); check the name, "
            "or log in (`hf auth login` or HF_TOKEN) for a private or gated repo"
        ) from None
    except RevisionNotFoundError as err:
        raise HubModelNotFoundError(
            f"{spec}: {repo_id} has no revision {revision!r} on the Hub ({_first_line(err)}); name a branch, a tag "
            "or a commit hash of the repo"
        ) from None
    except HfHubHTTPError as err:  # the Hub down, rate limits, ...
        raise HubError(f"{spec}: cannot fetch {repo_id} from the Hugging Face Hub: {_first_line(err)}") from None
    # the snapshot must be in the cache under the repo's own folder, whatever a ref file in the cache said
    repo_folder = cache / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    path = contained(repo_folder, Path(folder).name, f"{spec}: snapshot")
    if path.resolve() != Path(folder).resolve():
        raise HubError(f"{spec}: the Hub cache resolved {repo_id} to {folder}, outside its snapshots in {repo_folder}")
    if not (path / _CONFIG_FILE).is_file():
        raise HubError(
            f"{spec}: {repo_id} (revision {revision or 'main'}) is not a namc model: its snapshot {path} has no "
            f"{_CONFIG_FILE}; a namc model repo holds the files model.save_pretrained(dir) writes"
        )
    return path


def push_to_hub(
    model_or_folder: Any,
    repo_id: str,
    *,
    revision: str | None = None,
    private: bool | None = None,
    commit_message: str | None = None,
    create_repo: bool = True,
) -> str:
    """Upload a model folder (what ``save_pretrained`` writes) to a Hub model repo.

    The token is huggingface_hub's: ``HF_TOKEN`` in the environment or the one ``hf auth login`` stored. Only the
    model folder's files are uploaded (:data:`MODEL_FILE_PATTERNS`); anything else in the folder stays local.

    Args:
        model_or_folder: a :class:`~namc.models.NAMC` (saved to a temporary folder first) or a model folder.
        repo_id: ``org/name`` or ``hf-hub:org/name`` (an ``@revision`` suffix is the branch to push to).
        revision: the branch to push to (default: the id's ``@revision``, else ``main``).
        private: create the repo private (``None``: the Hub's default); ignored when the repo exists.
        commit_message: default ``"Upload namc model"``.
        create_repo: create the repo when it does not exist.

    Returns:
        the URL of the commit.

    Raises:
        ValueError: a malformed repo id, or a folder that is not a model folder.
        HubError: offline mode, no token, or the Hub refused or could not be reached (one line, with the cause).
    """
    repo, id_revision = parse_hub_id(repo_id)
    revision = revision or id_revision
    if _offline():
        raise HubError(
            f"push_to_hub {repo}: HF_HUB_OFFLINE=1 is set and uploading needs the network; unset HF_HUB_OFFLINE "
            "(and have a token: HF_TOKEN or `hf auth login`) to push"
        )
    from huggingface_hub import HfApi, get_token

    if get_token() is None:
        raise HubError(f"push_to_hub {repo}: no Hugging Face token; set HF_TOKEN or run `hf auth login`")
    with tempfile.TemporaryDirectory(prefix="namc-push-") as tmp:
        if hasattr(model_or_folder, "save_pretrained"):
            folder = Path(model_or_folder.save_pretrained(Path(tmp) / "model"))
        else:
            folder = Path(model_or_folder)
        if not (folder / _CONFIG_FILE).is_file():
            raise ValueError(
                f"push_to_hub: {folder} is not a model folder (no {_CONFIG_FILE}); pass a NAMC or the folder "
                "model.save_pretrained(dir) wrote"
            )
        api = HfApi(library_name="namc", library_version=__version__)
        try:
            if create_repo:
                api.create_repo(repo, repo_type="model", private=private, exist_ok=True)
            if revision and revision != "main":
                api.create_branch(repo, branch=revision, repo_type="model", exist_ok=True)
            commit = api.upload_folder(
                repo_id=repo,
                folder_path=folder,
                repo_type="model",
                revision=revision,
                commit_message=commit_message or "Upload namc model",
                allow_patterns=list(MODEL_FILE_PATTERNS),
            )
        except Exception as err:  # any failure of the upload (HTTP, network, auth) is one line naming the repo
            raise HubError(f"push_to_hub {repo}: upload of {folder} failed: {_first_line(err)}") from err
    return str(commit.commit_url)
