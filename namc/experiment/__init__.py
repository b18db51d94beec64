"""Studies: the paper's ablations as one command (``namc experiment run STUDY.yaml``), each (variant, seed) an
ordinary ``namc fit`` / ``namc test`` subprocess, aggregated over seeds with intervals and paired tests.

:mod:`~namc.experiment.study` (the YAML schema), :mod:`~namc.experiment.runner` (subprocesses, skipping finished
runs), :mod:`~namc.experiment.results` (``results.jsonl``), :mod:`~namc.experiment.stats` (means, t-intervals, the
paired t-test), :mod:`~namc.experiment.report` (markdown and PNG plots), :mod:`~namc.experiment.cli`.
"""

from namc.experiment.report import aggregate, format_report, write_report
from namc.experiment.results import read_results, write_results
from namc.experiment.runner import RunError, run_study
from namc.experiment.stats import paired, summarise
from namc.experiment.study import Study, StudyError, Variant, load_study

__all__ = [
    "RunError",
    "Study",
    "StudyError",
    "Variant",
    "aggregate",
    "format_report",
    "load_study",
    "paired",
    "read_results",
    "run_study",
    "summarise",
    "write_report",
    "write_results",
]
