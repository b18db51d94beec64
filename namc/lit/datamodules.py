"""LightningDataModules: the pre-training corpus and the IDC benchmarks, batched for :mod:`namc.lit`.

Both datamodules own the caption tokenizer the model is built with (LightningCLI links ``data.caption_tokenizer`` to
the model, and the model's preset / pretrained folder to ``data.tokenizer``): ``tokenizer`` is ``"word"`` (a word
vocabulary built here from the training texts: corpus descriptions, or benchmark training captions), ``"clip_bpe"``
(CLIP's BPE), or the path of a saved model (a ``save_pretrained`` folder or a namc ``.ckpt``) whose tokenizer is
reused, as fine-tuning must.

DDP: the benchmark's training set is split by a ``DistributedSampler`` (seeded, reshuffled per epoch); the corpus
streams disjoint shards / manifest lines to every rank and DataLoader worker, and every reader yields exactly the
same number of samples (a short reader starts its share again) so all ranks run the same number of steps.

Resuming: both training loaders are a :class:`~namc.data.views.ResumableLoader`, whose position (epoch, batches,
every rank's and reader's place) Lightning keeps in its checkpoints, so ``--ckpt_path`` from a mid-epoch checkpoint
continues with exactly the batches an uninterrupted run would have seen (see :mod:`namc.data.views`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from torch.utils.data import DataLoader, Dataset

from namc.data.collate import CaptionCollator, PretrainCollator, SkipNone
from namc.data.corpus import CorpusDataset, RecordError, iter_manifest, parse_record
from namc.data.corpus.records import parse_line
from namc.data.corruptions import CORRUPTIONS, CaptionNoiseView, CorruptedView
from namc.data.idc import BENCHMARKS, BenchmarkDataset, build_benchmark, check_benchmark_root
from namc.data.pairs import PairListDataset
from namc.data.transforms import MAX_IMAGE_PIXELS
from namc.data.views import EpochSampler, EvenStream, ReferencePicker, ResumableLoader, loader_workers
from namc.models.io import read_tokenizer
from namc.text.tokenizer import CaptionTokenizer, ClipBPETokenizer, WordTokenizer

__all__ = [
    "BenchmarkDataModule",
    "CorpusDataModule",
    "NAMCDataModule",
    "tokenizer_from_spec",
]

logger = logging.getLogger(__name__)


def tokenizer_from_spec(spec: str | None, texts: Callable[[], Iterable[str]], min_freq: int = 1) -> CaptionTokenizer:
    """Build or load a tokenizer: ``"word"``/None (from ``texts()``), ``"clip_bpe"``, or a saved model's path."""
    if spec in (None, "word"):
        tok = WordTokenizer.build(texts(), min_freq=min_freq)
        logger.info("built a word vocabulary of %d entries (min_freq %d)", tok.vocab_size, min_freq)
        return tok
    if spec == "clip_bpe":
        return ClipBPETokenizer()
    return read_tokenizer(spec)


def _rank_world(trainer: Any) -> tuple[int, int]:
    if trainer is None:
        return 0, 1
    return int(trainer.global_rank), int(trainer.world_size)


def _trainer_epoch(trainer: Any) -> int:
    """The epoch about to run (restored from a checkpoint when resuming), 0 without a trainer."""
    return int(trainer.current_epoch) if trainer is not None else 0


class NAMCDataModule(pl.LightningDataModule):
    """Base of namc's datamodules: they own the caption tokenizer (see the module docstring)."""

    def __init__(self, tokenizer: str | None, min_freq: int) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.min_freq = min_freq
        self._tokenizer: CaptionTokenizer | None = None
        self._train: Any = None  # the training dataset view, which has set_epoch(epoch)
        self._sampler: EpochSampler | None = None  # the training sampler of a map-style dataset

    def vocabulary_texts(self) -> Iterable[str]:
        raise NotImplementedError

    @property
    def caption_tokenizer(self) -> CaptionTokenizer:
        """The tokenizer of the data and the model (built or loaded on first access)."""
        if self._tokenizer is None:
            self._tokenizer = tokenizer_from_spec(self.tokenizer, self.vocabulary_texts, self.min_freq)
        return self._tokenizer

    def set_tokenizer(self, tokenizer: CaptionTokenizer) -> None:
        """Use ``tokenizer`` (e.g. the one of a model built outside LightningCLI)."""
        self._tokenizer = tokenizer

    def set_epoch(self, epoch: int) -> None:
        """Seed the data-side randomness of training epoch ``epoch`` (called by the LightningModule)."""
        if self._train is not None:
            self._train.set_epoch(epoch)
        if self._sampler is not None:
            self._sampler.set_epoch(epoch)


class BenchmarkDataModule(NAMCDataModule):
    """One IDC benchmark in its official layout: fine-tuning, validation, test and prediction.

    Args:
        name: ``clevr_change``, ``clevr_dc``, ``spot_the_diff`` or ``ier``.
        root: the dataset folder.
        batch_size: training pairs per step and per process (the paper's 128 is the global batch).
        eval_batch_size: pairs per validation/test/predict step (default ``batch_size``).
        num_workers: DataLoader worker processes.
        image_size: side of the square input images (linked from the model).
        tokenizer: ``"word"``, ``"clip_bpe"`` or a saved model's path (linked from the model).
        min_freq: keep words seen at least this often in the training captions (word vocabularies).
        max_caption_len: most caption ids with [BOS]/[EOS] (linked from the model).
        include_distractors: CLEVR-Change: also the no-change pairs (as trained and evaluated in the literature).
        predict_pairs: a text file of image pairs to caption with ``namc predict`` (one pair per line, two paths
            separated by a tab or whitespace, relative to the file; ``#`` starts a comment; the format of
            :func:`namc.data.pairs.read_pair_list`, as ``namc describe --pairs``); default: ``predict_split``.
        predict_split: the split ``namc predict`` captions when ``predict_pairs`` is not given.
        shuffle_seed: seed of the training shuffle.
        cache_images: keep the decoded images in memory after their first read (small benchmarks such as the
            demo's; needs ``num_workers=0``, since worker processes restart every epoch).
        max_image_pixels: images with more pixels are skipped as ``oversized_image`` before decoding (None: no
            cap; the policy is in :mod:`namc.data.transforms`).
        corruption: corrupt both images of every train / val / test pair (Table 10): ``"gaussian_noise"`` or
            ``"fog"`` (:mod:`namc.data.corruptions`, Hendrycks and Dietterich 2019); None: clean images.
        corruption_severity: its severity, 1..5 (Table 10: 5).
        caption_noise: fraction of the words of every training caption replaced by other vocabulary words (Table
            10: 0.2 .. 0.8); validation and test references stay clean.
        shift_seed: seed of the corruptions and word replacements (fixed per item: the same every epoch).
    """

    def __init__(
        self,
        name: str = "clevr_change",
        root: str = "data/clevr_change",
        batch_size: int = 128,
        eval_batch_size: int | None = None,
        num_workers: int = 4,
        image_size: int = 224,
        tokenizer: str | None = None,
        min_freq: int = 1,
        max_caption_len: int = 64,
        include_distractors: bool = True,
        predict_pairs: str | None = None,
        predict_split: str = "test",
        shuffle_seed: int = 0,
        cache_images: bool = False,
        max_image_pixels: int | None = MAX_IMAGE_PIXELS,
        corruption: str | None = None,
        corruption_severity: int = 5,
        caption_noise: float = 0.0,
        shift_seed: int = 0,
    ) -> None:
        super().__init__(tokenizer, min_freq)
        if corruption is not None and corruption not in CORRUPTIONS:
            raise ValueError(f"unknown corruption {corruption!r}; choose from {sorted(CORRUPTIONS)}")
        if not 0.0 <= caption_noise <= 1.0:
            raise ValueError(f"caption_noise must be in [0, 1], got {caption_noise}")
        if name not in BENCHMARKS:
            raise ValueError(f"unknown benchmark {name!r}; choose from {sorted(BENCHMARKS)}")
        if cache_images and num_workers > 0:
            raise ValueError(
                "cache_images keeps decoded images in this process, but DataLoader workers restart every epoch and "
                "would lose them: set num_workers: 0 with cache_images (or leave the cache off)"
            )
        self.save_hyperparameters()
        self.name = name
        self.root = root
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.image_size = image_size
        self.max_caption_len = max_caption_len
        self.include_distractors = include_distractors
        self.predict_pairs = predict_pairs
        self.predict_split = predict_split
        self.shuffle_seed = shuffle_seed
        self.cache_images = cache_images
        self.max_image_pixels = max_image_pixels
        self.corruption, self.corruption_severity = corruption, corruption_severity
        self.caption_noise, self.shift_seed = caption_noise, shift_seed
        self._splits: dict[str, Dataset] = {}

    def _shifted(self, split: str) -> Dataset:
        """``split`` with Table 10's shifts: word replacement in training captions, corrupted images."""
        ds: Dataset = self.split(split)
        if split == "train" and self.caption_noise > 0:
            vocabulary = [w for c in self.vocabulary_texts() for w in c.split()]
            ds = CaptionNoiseView(ds, self.caption_noise, vocabulary, self.shift_seed)
        if self.corruption is not None:
            ds = CorruptedView(ds, self.corruption, self.corruption_severity, self.shift_seed)
        return ds

    def split(self, split: str) -> BenchmarkDataset:
        """The benchmark dataset of ``split`` (built once)."""
        if split not in self._splits:
            check_benchmark_root(self.name, self.root)
            kwargs: dict[str, Any] = {"max_image_pixels": self.max_image_pixels}
            if self.name == "clevr_change":
                kwargs["include_distractors"] = self.include_distractors
            ds = build_benchmark(self.name, self.root, split, self.image_size, **kwargs)
            self._splits[split] = ds.enable_image_cache() if self.cache_images else ds
        return self._splits[split]  # type: ignore[return-value]

    def vocabulary_texts(self) -> Iterable[str]:
        """The training captions (never validation or test ones)."""
        ds = self.split("train")
        return [c for entry in ds.entries for c in entry[3]]

    def setup(self, stage: str) -> None:
        splits = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",)}.get(stage, ())
        for split in splits:
            ds = self.split(split)
            if len(ds) == 0:
                raise ValueError(f"{self.name} {split} split at {self.root} has no usable pairs")
        if stage == "predict":
            self._splits["predict"] = (
                PairListDataset(self.predict_pairs, self.image_size)
                if self.predict_pairs
                else self.split(self.predict_split)
            )

    def _loader(self, dataset: Dataset, train: bool) -> DataLoader:
        # training items already carry one reference, drawn by ReferencePicker
        collate = SkipNone(CaptionCollator(self.caption_tokenizer, self.max_caption_len, sample_reference=False))
        rank, world = _rank_world(self.trainer)
        if train:
            self._sampler = EpochSampler(dataset, num_replicas=world, rank=rank, seed=self.shuffle_seed)
            self._sampler.set_epoch(_trainer_epoch(self.trainer))
            return ResumableLoader(
                dataset,
                batch_size=self.batch_size,
                sampler=self._sampler,
                collate_fn=collate,
                persistent_workers=False,
                **loader_workers(self.num_workers, world),
            )
        return DataLoader(
            dataset,
            batch_size=self.eval_batch_size,
            collate_fn=collate,
            persistent_workers=False,
            **loader_workers(self.num_workers, world),
        )

    def train_dataloader(self) -> DataLoader:
        self._train = ReferencePicker(self._shifted("train"), self.shuffle_seed)
        self._train.set_epoch(_trainer_epoch(self.trainer))
        return self._loader(self._train, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self._shifted("val"), train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self._shifted("test"), train=False)

    def predict_dataloader(self) -> DataLoader:
        if "predict" not in self._splits:
            self.setup("predict")
        return self._loader(self._splits["predict"], train=False)

    def teardown(self, stage: str) -> None:
        for split, ds in self._splits.items():
            issues = getattr(ds, "issues", None)
            if issues is not None and issues.skipped:
                logger.warning("%s %s: %s", self.name, split, issues.summary())


class CorpusDataModule(NAMCDataModule):
    """The pre-training corpus (JSONL manifest or tar shards, :mod:`namc.data.corpus`).

    Args:
        train: manifest (``.jsonl``), a shard, or a folder of shards.
        val: an optional held-out corpus (validation losses, and NIM's noise AUROC when it carries noise labels).
        batch_size: pairs per step and per process (the paper: 512 globally, appendix F).
        num_workers: DataLoader worker processes per rank.
        image_size: side of the square images (linked from the model).
        tokenizer: ``"word"``, ``"clip_bpe"`` or a saved model's path (linked from the model).
        min_freq: keep words seen at least this often (word vocabularies).
        vocab_benchmarks: ``{benchmark name: root}`` whose training captions join the word vocabulary, so a model
            pre-trained here can later be fine-tuned on them without unknown words.
        max_text_len: most ids of one description half with [SOS]/[EOS] (the CLIP context; linked from the model).
        max_caption_len: most ids of a whole description (linked from the model).
        swap_prob: probability of exchanging the two images of a pair and the halves of its description (appendix
            B.3, Table 12; 0: the paper's NAMC, whose IER scores in Table 3 are Table 12's "without order exchange").
            Free-text descriptions (appendix B.2) have no halves to exchange and need 0.
        shuffle_buffer: samples held by each reader's shuffle buffer (shard order is permuted per epoch too).
        shuffle_seed: seed of the shard permutation and the shuffle buffers.
        max_image_pixels: images with more pixels are skipped as ``oversized_image`` before decoding (None: no
            cap; the policy is in :mod:`namc.data.transforms`).
        precomputed: use the VQGAN codes / ResNet grids that ``namc data precompute`` wrote beside the shards, when
            present, so the frozen encoders do not run for those samples (:mod:`namc.data.corpus.targets`).
        sources: train on the records of these sources only (e.g. ``[ip2p, cc3m]``; the pre-training data ablation
            of Figures 4 and 9); None: all. Validation is not filtered.
        fraction: train on the records whose hash of ``(subset_seed, id)`` falls below it: a deterministic subset
            of about that fraction; smaller ones nest inside larger ones. With ``sources`` or ``fraction < 1`` a
            text-only pass counts the kept records at start. ``subset_seed``: seed of that hash.
    """

    def __init__(
        self,
        train: str = "data/corpus",
        val: str | None = None,
        batch_size: int = 64,
        num_workers: int = 4,
        image_size: int = 224,
        tokenizer: str | None = None,
        min_freq: int = 1,
        vocab_benchmarks: dict[str, str] | None = None,
        max_text_len: int = 77,
        max_caption_len: int = 160,
        swap_prob: float = 0.0,
        shuffle_buffer: int = 1000,
        shuffle_seed: int = 0,
        max_image_pixels: int | None = MAX_IMAGE_PIXELS,
        precomputed: bool = True,
        sources: list[str] | None = None,
        fraction: float = 1.0,
        subset_seed: int = 0,
    ) -> None:
        super().__init__(tokenizer, min_freq)
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        if not 0.0 <= swap_prob <= 1.0:
            raise ValueError(f"data.init_args.swap_prob must be a probability in [0, 1], got {swap_prob}")
        self.save_hyperparameters()
        self.precomputed = precomputed
        self.subset = {
            "sources": list(sources) if sources is not None else None,
            "fraction": fraction,
            "subset_seed": subset_seed,
        }
        self.train_path = train
        self.val_path = val
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.image_size = image_size
        self.vocab_benchmarks = dict(vocab_benchmarks or {})
        self.max_text_len = max_text_len
        self.max_caption_len = max_caption_len
        self.swap_prob = swap_prob
        self.shuffle_buffer = shuffle_buffer
        self.shuffle_seed = shuffle_seed
        self.max_image_pixels = max_image_pixels
        self._val: CorpusDataset | None = None

    @staticmethod
    def _check(path: str, what: str) -> None:
        if not Path(path).exists():
            raise FileNotFoundError(
                f"pre-training corpus ({what}) not found at {path}: point data.init_args.{what} at a JSONL manifest or "
                "a folder of shards (see namc.data.corpus; `namc data` builds them), or run `namc demo` for a shapes "
                "world corpus"
            )

    def vocabulary_texts(self) -> Iterable[str]:
        """Every training description (all shards, text only) and the named benchmarks' training captions."""
        self._check(self.train_path, "train")
        texts = [
            it["description"] for it in CorpusDataset(self.train_path, None, rank=0, world_size=1, load_images=False)
        ]
        for name, root in self.vocab_benchmarks.items():
            check_benchmark_root(name, root)
            ds = build_benchmark(name, root, "train", None)
            texts += [c for entry in ds.entries for c in entry[3]]
        return texts

    def free_text_example(self) -> str | None:
        """The id of the training corpus's first record when it is free text (appendix B.2), else None: one record
        read without its images, so pre-training can refuse NIM / MIR before its first step."""
        self._check(self.train_path, "train")
        ds = CorpusDataset(self.train_path, None, rank=0, world_size=1, load_images=False, precomputed=False)
        if ds.mode == "manifest":  # the first line that parses (the dataset would scan every id for duplicates first)
            for _, line in iter_manifest(ds.paths[0]):
                try:
                    rec = parse_record(parse_line(line))
                except RecordError:  # skipped and counted when training reads it
                    continue
                return rec.id if rec.free_text else None
            return None
        first = next(iter(ds), None)
        return first["id"] if first is not None and first["free_text"] else None

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self._check(self.train_path, "train")
        if stage in ("fit", "validate") and self.val_path is not None:
            self._check(self.val_path, "val")

    def _collate(self) -> SkipNone:
        # swapping is done by EvenStream (seeded); the collator's own swap would use the global RNG
        return SkipNone(PretrainCollator(self.caption_tokenizer, self.max_text_len, self.max_caption_len))

    def train_dataloader(self) -> DataLoader:
        rank, world = _rank_world(self.trainer)
        base = CorpusDataset(
            self.train_path,
            self.image_size,
            shuffle_buffer=self.shuffle_buffer,
            seed=self.shuffle_seed,
            rank=rank,
            world_size=world,
            max_image_pixels=self.max_image_pixels,
            precomputed=self.precomputed,
            **self.subset,
        )
        readers = world * max(self.num_workers, 1)
        if self.subset["sources"] is None and self.subset["fraction"] >= 1.0:
            total = base.count()
        else:  # one text-only pass: how many records the subset keeps
            total = sum(
                1
                for _ in CorpusDataset(
                    self.train_path, None, rank=0, world_size=1, load_images=False, precomputed=False, **self.subset
                )
            )
            logger.info("training subset %s: %d pairs", self.subset, total)
        per_reader = (total // readers) // self.batch_size * self.batch_size
        if per_reader == 0:
            raise ValueError(
                f"corpus {self.train_path} has {total} pairs (after sources/fraction): too few for {readers} readers "
                f"(ranks x workers) with batch_size {self.batch_size}"
            )
        self._train = EvenStream(base, per_reader, self.num_workers, self.swap_prob)
        self._train.set_epoch(_trainer_epoch(self.trainer))
        return ResumableLoader(
            self._train,
            batch_size=self.batch_size,
            collate_fn=self._collate(),
            drop_last=True,
            persistent_workers=False,
            **loader_workers(self.num_workers, world),
        )

    def val_dataloader(self) -> DataLoader | list:
        if self.val_path is None:
            return []
        rank, world = _rank_world(self.trainer)
        self._val = CorpusDataset(
            self.val_path,
            self.image_size,
            rank=rank,
            world_size=world,
            max_image_pixels=self.max_image_pixels,
            precomputed=self.precomputed,
        )
        return DataLoader(
            self._val, batch_size=self.batch_size, collate_fn=self._collate(), **loader_workers(self.num_workers, world)
        )

    def teardown(self, stage: str) -> None:
        for ds in (self._train.dataset if self._train else None, self._val):
            if ds is not None and ds.issues.skipped:  # this process's counts (workers included)
                logger.warning("%s", ds.issues.summary())
