"""Caption your own image pairs: ``namc.describe(model, "before.png", "after.png")`` and ``namc describe``.

(The module is ``namc.inference``, not ``namc.describe``, so that ``namc.describe`` stays the function.)

Both take a saved model (a ``save_pretrained`` folder, a Hub id or a namc Lightning ``.ckpt``) through the one
loader, :func:`namc.models.load_model`, and read images through :func:`namc.data.transforms.open_image`.

``namc describe`` never answers a user's mistake with a traceback: it prints one line, ``namc describe: error:
...``, naming the file and what to do, and exits with 2 for a usage error (a bad option value, a path that does not
exist or is a directory, a device that is not there) or 1 for a file that cannot be used (an image that is corrupt
or over the pixel cap, damaged or mismatched weights, an unreadable config or tokenizer, a pickle checkpoint). Where
the reader of its output stops early (``namc describe --pairs LIST | head``) it stops too, quietly, with 141, as a
process that SIGPIPE ended.

``namc describe --pairs LIST`` captions every pair a list file names (:func:`namc.data.pairs.read_pair_list`) with
one load of the model, in batches: one JSON line per pair, in the list's order, to stdout or ``--output``. A pair
whose image is missing, corrupt or over the pixel cap is skipped, written with its ``issue`` and ``error`` instead
of a caption and counted; the run goes on, and exits with 1 at the end where any pair was skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pickle
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image
from tqdm.auto import tqdm

from namc.backends.compile import Captioner, compile, default_backend
from namc.data.errors import IssueKind, RecordError
from namc.data.pairs import ListedPair, read_pair_list
from namc.data.transforms import MAX_IMAGE_PIXELS, ImageTooLargeError, ImageTransform
from namc.deploy.captioner import RuntimeMissingError, load_captioner
from namc.deploy.manifest import MANIFEST_FILE
from namc.models import NAMC, list_models, load_model
from namc.models.files import WeightsError
from namc.models.hub import HUB_PREFIX, parse_hub_id
from namc.models.shortlist import Shortlist
from namc.runtime import stdout_closed
from namc.text.tokenizer import WordTokenizer
from namc.text.vocab import read_captions

if TYPE_CHECKING:
    from namc.deploy.captioner import OnnxCaptioner

    Runner = NAMC | Captioner | OnnxCaptioner

ImageLike = str | Path | Image.Image

__all__ = ["caption_pair_list", "describe", "read_captions", "run"]


def _load(image: ImageLike, transform: ImageTransform) -> torch.Tensor:
    """(3, H, W) tensor of a PIL image or an image file; a missing, unreadable or oversized file names itself."""
    if isinstance(image, Image.Image):
        return transform(image)
    path = Path(image)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory, not an image file")
    if not path.is_file():
        raise FileNotFoundError(f"image not found: {path}")
    try:
        return transform.load(path)
    except ImageTooLargeError:
        raise
    except (OSError, SyntaxError, ValueError) as err:
        raise OSError(f"cannot read image {path}: {err}") from err


def _device_of(model: Runner) -> torch.device:
    """Where ``model`` takes its inputs: a NAMC's parameters' device, an exported model's (the CPU)."""
    return next(model.parameters()).device if isinstance(model, NAMC) else model.device


def describe(
    model: Runner | str | Path,
    images_1: ImageLike | Sequence[ImageLike],
    images_2: ImageLike | Sequence[ImageLike],
    num_beams: int = 1,
    max_new_tokens: int | None = None,
    batch_size: int = 32,
    max_image_pixels: int | None = MAX_IMAGE_PIXELS,
    precision: str = "fp32",
    vocabulary: Shortlist | Iterable[int] | None = None,
) -> str | list[str]:
    """Say what changed between image pairs.

    Any PIL mode is converted to RGB and every image is resized to the model's ``image_size``.

    Args:
        model: a :class:`NAMC` (put in eval mode and run on :func:`namc.compile`'s default backend for its device
            here), a captioner (:func:`namc.compile`, :func:`namc.deploy.load_captioner`), or a ``save_pretrained``
            folder or namc ``.ckpt`` to load.
        images_1: a path / PIL image, or a list of them (the "before" images).
        images_2: the "after" images, as many as ``images_1``.
        num_beams: 1 for greedy decoding (the paper), more for beam search.
        max_new_tokens: at most this many tokens (default: the model's, 23).
        batch_size: pairs per forward pass.
        max_image_pixels: an image file whose width x height exceeds this is refused before decoding
            (:class:`~namc.data.transforms.ImageTooLargeError`); None: no cap.
        precision: for a :class:`NAMC`: ``fp32`` (default), ``bf16`` (CPU: bf16 weights where bf16 pays; CUDA:
            autocast) or ``int8`` (CPU: dynamic int8 linear layers; the grid in static int8 once
            :func:`~namc.backends.precision.calibrate_int8` has calibrated the model, or its saved folder carries a
            calibration, else fp32); see :mod:`namc.backends.precision` for speed and agreement with fp32. A
            captioner runs its own precision (another is a ValueError).
        vocabulary: the only tokens to write (a :class:`~namc.models.shortlist.Shortlist`, e.g.
            ``model.shortlist(captions)`` of the captions the model was fine-tuned on, a fine-tuned model's
            ``model.training_shortlist``, or token ids); decoding then projects onto those rows of the vocabulary
            only. None (default): the whole vocabulary.

    Returns:
        one caption, or a list of captions when lists were given.
    """
    for name, value in (("num_beams", num_beams), ("batch_size", batch_size), ("max_new_tokens", max_new_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    if isinstance(model, (str, Path)):
        model = load_model(model, pretraining=False)
    model = _runner(model, precision)
    single = isinstance(images_1, (str, Path, Image.Image))
    if single != isinstance(images_2, (str, Path, Image.Image)):  # a str is iterable: it would split into letters
        raise ValueError("give two images, or two lists of images, not one image and a list")
    firsts = [images_1] if single else list(images_1)
    seconds = [images_2] if single else list(images_2)
    if len(firsts) != len(seconds):
        raise ValueError(f"{len(firsts)} first images but {len(seconds)} second images")
    transform = ImageTransform(model.config.image_size, max_image_pixels)
    device = _device_of(model)
    captions: list[str] = []
    for start in range(0, len(firsts), batch_size):
        a = torch.stack([_load(x, transform) for x in firsts[start : start + batch_size]]).to(device)
        b = torch.stack([_load(x, transform) for x in seconds[start : start + batch_size]]).to(device)
        captions += model.generate(a, b, max_new_tokens, num_beams, vocabulary=vocabulary)
    return captions[0] if single else captions


def _runner(model: Runner, precision: str) -> Captioner | OnnxCaptioner:
    """``model`` ready to caption at ``precision``: a NAMC compiled on its device's default backend, a captioner as
    it is (ValueError where it runs another precision)."""
    if isinstance(model, NAMC):
        return compile(model.eval(), default_backend(_device_of(model)), precision)
    if precision != model.precision:
        raise ValueError(f"this captioner runs {model.precision}, not {precision}: compile the model again")
    return model


def caption_pair_list(
    model: Runner,
    pairs: Sequence[ListedPair],
    batch_size: int = 32,
    max_image_pixels: int | None = MAX_IMAGE_PIXELS,
    progress: bool | None = None,
    **generate: Any,
) -> Iterator[dict[str, Any]]:
    """Caption listed pairs in batches, skipping a pair whose image cannot be used; yields one record per pair, in
    order: ``{"line", "image1", "image2", "caption"}`` (the paths as the list writes them), or ``"caption": None``
    with the ``issue`` (an :class:`~namc.data.errors.IssueKind` value) and the one-line ``error``.

    Args:
        model: an eval-mode :class:`NAMC` (run as it is: eager PyTorch) or a captioner (:func:`namc.compile`,
            :mod:`namc.deploy`).
        pairs: from :func:`namc.data.pairs.read_pair_list`.
        batch_size: pairs per forward pass (a batch with skipped pairs runs the ones left).
        max_image_pixels: as :func:`describe`'s.
        progress: a tqdm bar on stderr; None: where stderr is a terminal.
        **generate: keywords of :meth:`NAMC.generate` (``max_new_tokens``, ``num_beams``, ``vocabulary``).
    """
    transform = ImageTransform(model.config.image_size, max_image_pixels)
    device = _device_of(model)
    quiet = None if progress is None else not progress  # tqdm: None disables the bar where stderr is no terminal
    with tqdm(total=len(pairs), unit="pair", disable=quiet, file=sys.stderr, dynamic_ncols=True) as bar:
        for start in range(0, len(pairs), batch_size):
            records, loaded = _read_batch(pairs[start : start + batch_size], transform)
            if loaded:
                a = torch.stack([x for _, x, _ in loaded]).to(device)
                b = torch.stack([y for _, _, y in loaded]).to(device)
                for (record, _, _), caption in zip(loaded, model.generate(a, b, **generate), strict=True):
                    record["caption"] = caption
            bar.update(len(records))
            yield from records


def _read_batch(
    chunk: Sequence[ListedPair], transform: ImageTransform
) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], torch.Tensor, torch.Tensor]]]:
    """One batch's records (an unusable pair's with its issue and error already) and the (record, first, second)
    images of the pairs to caption."""
    records, loaded = [], []
    for pair in chunk:
        record: dict[str, Any] = {"line": pair.line, "image1": pair.written[0], "image2": pair.written[1]}
        records.append(record)
        try:
            loaded.append((record, _load(pair.first, transform), _load(pair.second, transform)))
        except (OSError, ValueError) as err:  # _load's errors: each names its file
            record |= {"caption": None, "issue": _issue(err).value, "error": " ".join(str(err).split())}
    return records, loaded


def _issue(err: Exception) -> IssueKind:
    """The kind under which an image error is counted."""
    if isinstance(err, RecordError):
        return err.kind
    if isinstance(err, (FileNotFoundError, IsADirectoryError)):
        return IssueKind.MISSING_IMAGE
    return IssueKind.CORRUPT_IMAGE


# ------------------------------------------------------------- the command (parsed in namc.describe_cli)


def _device(text: str) -> torch.device:
    """A device that exists on this machine (argparse type: an unusable one is a usage error)."""
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"not a device: {text!r} (cpu, cuda, cuda:1, mps, ...)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(
                f"{text}: no CUDA device is available (torch.cuda.is_available() is False); use --device cpu"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(f"{text}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"{text}: no MPS device is available; use --device cpu")
    return device


def _describe_list(
    model: Captioner | OnnxCaptioner, pairs: list[ListedPair], args: argparse.Namespace, vocabulary: Shortlist | None
) -> int:
    """``--pairs``: every listed pair's record as a JSON line (flushed per batch), then one summary line on stderr;
    1 where any pair was skipped."""
    issues: Counter[str] = Counter()
    first_error = ""
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        out = sys.stdout
        if args.output is not None:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            out = stack.enter_context(args.output.open("w", encoding="utf-8"))
        records = caption_pair_list(
            model,
            pairs,
            args.batch_size,
            args.max_image_pixels,
            num_beams=args.beams,
            max_new_tokens=args.max_new_tokens,
            vocabulary=vocabulary,
        )
        for number, record in enumerate(records, start=1):
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            if record["caption"] is None:
                issues[record["issue"]] += 1
                first_error = first_error or f"line {record['line']}: {record['error']}"
            if number % args.batch_size == 0 or number == len(pairs):
                out.flush()
    seconds = time.perf_counter() - start
    done = len(pairs) - sum(issues.values())
    summary = f"captioned {done} of {len(pairs)} pairs in {seconds:.1f} s ({done / seconds:.1f} pairs/s)"
    if issues:
        kinds = ", ".join(f"{kind}={n}" for kind, n in sorted(issues.items()))
        print(
            f"namc describe: {summary}; skipped {sum(issues.values())} ({kinds}), first at {args.pairs} {first_error}",
            file=sys.stderr,
        )
        return 1
    print(f"namc describe: {summary}", file=sys.stderr)
    return 0


def _note_unknown_words(model: Captioner | OnnxCaptioner, captions: list[str], source: str) -> None:
    """One line on stderr naming the words of ``captions`` outside a word vocabulary: they are listed as [UNK], so
    decoding over the list can write "[UNK]" (CLIP's byte-level BPE has no unknown words)."""
    tokenizer = model.tokenizer
    if not isinstance(tokenizer, WordTokenizer):
        return
    unknown = sorted({word for caption in captions for word in tokenizer.split(caption) if word not in tokenizer.index})
    if unknown:
        shown = ", ".join(unknown[:8]) + (", ..." if len(unknown) > 8 else "")
        print(
            f"namc describe: note: {source}: {len(unknown)} word(s) outside the model's vocabulary ({shown}) are "
            "listed as [UNK], which the caption may then use",
            file=sys.stderr,
        )


def _error(message: str, code: int) -> int:
    print(f"namc describe: error: {' '.join(str(message).split())}", file=sys.stderr)
    return code


def _load_backend(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Captioner | OnnxCaptioner:
    """``--model`` on ``--backend`` (default: :func:`namc.compile`'s for ``--device``): torch, cpu and cuda load the
    model onto ``--device`` and compile it; onnxruntime and openvino load an export folder (``namc export onnx``) on
    that runtime at the export's precision, or export a model folder in fp32 first (CPU, greedy; a setting they do
    not run is a usage error)."""
    backend = args.backend or default_backend(args.device)
    if backend in ("onnxruntime", "openvino"):
        if args.device.type != "cpu":
            parser.error(f"argument --device: the {backend} backend runs on the CPU, not on {args.device}")
        if args.beams != 1:
            parser.error(f"argument --beams: the {backend} backend decodes greedily (--beams 1)")
        if (Path(args.model) / MANIFEST_FILE).is_file():
            captioner = load_captioner(args.model, backend)
            if captioner.precision != args.precision:
                parser.error(
                    f"argument --precision: {args.model} is a {captioner.precision} export: --precision "
                    f"{captioner.precision}"
                )
            return captioner
        if args.precision != "fp32":
            parser.error(
                f"argument --precision: {args.precision} on {backend} runs an export calibrated on your images: "
                f"namc export onnx MODEL OUT --precision {args.precision} --calibration PAIRS, then --model OUT"
            )
    if backend == "cuda" and args.device.type != "cuda":
        parser.error(f"argument --backend: cuda needs --device cuda, not {args.device}")
    if backend == "cpu" and args.device.type != "cpu":
        parser.error(f"argument --backend: cpu runs on --device cpu, not {args.device}")
    if args.precision == "int8" and backend != "cpu":
        parser.error(f"argument --precision: int8 runs on the cpu, onnxruntime and openvino backends, not {backend}")
    return compile(load_model(args.model, pretraining=False).to(args.device), backend, args.precision)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``namc describe`` on arguments :func:`namc.describe_cli.build_parser` parsed and checked: load the model,
    caption, print; 0, or 1 / 2 after one line on stderr (a usage error through ``parser.error``)."""
    try:
        args.device = _device(args.device)
    except argparse.ArgumentTypeError as err:
        parser.error(f"argument --device: {err}")
    if args.model in list_models() and not Path(args.model).exists():
        return _error(
            f"--model {args.model} is a preset name, which has no trained weights: pass a folder written by "
            "save_pretrained (or `namc fit` / `namc demo`), a hf-hub: id, or a namc .ckpt",
            2,
        )
    if args.model.startswith(HUB_PREFIX):
        try:
            parse_hub_id(args.model)
        except ValueError as err:  # a malformed id is a usage error, like a missing path
            return _error(f"--model: {err}", 2)
    try:
        pairs = None if args.pairs is None else read_pair_list(args.pairs)  # a bad list stops before the model loads
        model = _load_backend(args, parser)
        limit = model.config.max_caption_len - 1
        if args.max_new_tokens is not None and args.max_new_tokens > limit:
            parser.error(f"argument --max-new-tokens: this model generates at most {limit} tokens")
        vocabulary = None
        if args.vocabulary is not None:
            captions = read_captions(args.vocabulary)
            vocabulary = model.shortlist(captions)
            _note_unknown_words(model, captions, args.vocabulary)
        if args.shortlist:
            if model.training_shortlist is None:
                return _error(
                    f"--shortlist: {args.model} has no training shortlist (shortlist.json, which "
                    "fine-tuning saves): pass --vocabulary CAPTIONS.txt instead",
                    2,
                )
            vocabulary = model.training_shortlist
        if pairs is not None:
            return _describe_list(model, pairs, args, vocabulary)
        caption = describe(
            model,
            args.image1,
            args.image2,
            args.beams,
            args.max_new_tokens,
            max_image_pixels=args.max_image_pixels,
            precision=model.precision,
            vocabulary=vocabulary,
        )
    except BrokenPipeError:  # the reader of stdout stopped (`namc describe --pairs LIST | head`): stop too
        return stdout_closed()
    except RuntimeMissingError as err:  # --backend onnxruntime / openvino without its package: the extra to install
        return _error(str(err), 2)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as err:  # a path on the command line
        return _error(str(err), 2)
    except (OSError, ValueError, WeightsError, pickle.UnpicklingError) as err:  # a file that cannot be used
        return _error(str(err), 1)
    print(caption)
    return 0
