"""``namc demo``: the whole method end to end on a CPU, with no downloads.

1. Generate a shapes world (:mod:`namc.data.synthetic`): a noisy implicit-change pre-training corpus (a controlled
   fraction of injected noise phrases, labelled word by word), a held-out corpus for measuring noise identification,
   and a benchmark in the CLEVR-Change layout.
2. Pre-train ``namc_tiny`` on the corpus and fine-tune it on the benchmark, both through LightningCLI and the
   Lightning Trainer (the configs it runs are written to ``<out>/configs``, so ``namc fit --config`` repeats a stage).
3. Fine-tune the same model from scratch (the no-pre-training baseline), and score the most frequent training
   caption predicted for every pair (the trivial baseline).
4. Report on the test split: CIDEr-D, BLEU-4 and the other metrics of the three systems; NIM's noise identification
   (AUROC of irrelevance ``1 - R_T`` on injected-noise tokens against clean ones, held-out corpus); a few example
   captions; where the model (``from_pretrained`` folder), the TensorBoard logs and a PNG of relevance maps are.
   The report is printed and written as ``<out>/report.json``.

``--fast`` shrinks everything to a smoke test of about a minute (used by the tests); its numbers mean nothing.
The full demo takes about 9 minutes on 2 CPU cores. It says so when it starts, then shows where it is on stderr (a
line per stage, bars over the shapes world written, a line per training epoch with its rate and ETA); ``--quiet``
leaves only the report.

Modules: :mod:`~namc.lit.demo.settings` (sizes, hyper-parameters, measured wall times and the LightningCLI configs),
:mod:`~namc.lit.demo.run` (the stages and the command line), :mod:`~namc.lit.demo.progress` (the per-epoch progress
callback), :mod:`~namc.lit.demo.report` (the trivial baseline, noise identification and the report).
"""

from namc.lit.demo.report import format_report
from namc.lit.demo.run import main, run_demo
from namc.lit.demo.settings import FAST, FULL, DemoSettings, demo_configs

__all__ = ["FAST", "FULL", "DemoSettings", "demo_configs", "format_report", "main", "run_demo"]
