"""Two pre-training steps of a width-32 namc_tiny on a corpus a test built: the check that a curated or generated
corpus is one NAMC trains on (the loader reads it, the losses are finite)."""

from __future__ import annotations

from pathlib import Path


def pretrain_two_steps(train: str | Path, root: Path, batch_size: int, shuffle_buffer: int, max_text_len: int = 48):
    """Pre-train two steps on ``train`` (a manifest or a shard folder), logs under ``root``; the trainer after them,
    its two steps taken and its loss finite."""
    import lightning.pytorch as pl

    from namc.lit import PretrainModule
    from namc.lit.datamodules import CorpusDataModule

    pl.seed_everything(0)
    dm = CorpusDataModule(
        train=str(train),
        batch_size=batch_size,
        num_workers=0,
        image_size=64,
        max_text_len=max_text_len,
        max_caption_len=64,
        shuffle_buffer=shuffle_buffer,
    )
    module = PretrainModule(
        "namc_tiny", tokenizer=dm.caption_tokenizer, overrides={"dropout": 0.0, "dim": 32, "heads": 2}
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(root),
    )
    trainer.fit(module, datamodule=dm)
    assert trainer.global_step == 2
    loss = trainer.callback_metrics.get("train/loss")
    assert loss is not None and bool(loss.isfinite())
    return trainer
