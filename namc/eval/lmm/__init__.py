"""namc beside a multimodal LLM on the same pairs: ``namc eval lmm`` and the change-level judge ``namc eval judge``.

- :mod:`~namc.eval.lmm.presets`: the prompts (Table 13's zero-shot question, appendix D.2's, the judge's), shipped
  as text files in ``namc/eval/lmm/prompts``;
- :mod:`~namc.eval.lmm.pairs`: the pairs compared (a registered benchmark's split, or a pair list);
- :mod:`~namc.eval.lmm.caption`: ``namc eval lmm`` (captions through any OpenAI-compatible chat server, resumable);
- :mod:`~namc.eval.lmm.report`: the comparison's report and table;
- :mod:`~namc.eval.lmm.changes`: the judge's answers read and scored (change precision, recall, F1, distractors);
- :mod:`~namc.eval.lmm.judge`: ``namc eval judge``.

The server steps reuse :mod:`namc.llm` (client, store, runner), imported inside the functions that talk to
a server, so ``namc eval`` itself runs without the ``[curate]`` extra. docs/comparison.md is the guide.
"""

from namc.eval.lmm.changes import Judgement, MalformedJudgement, parse_judgement, score_judgements
from namc.eval.lmm.pairs import EvalPair, benchmark_pairs, read_pair_list
from namc.eval.lmm.presets import CAPTION_PRESETS, Prompt, load_prompt

__all__ = [
    "CAPTION_PRESETS",
    "EvalPair",
    "Judgement",
    "MalformedJudgement",
    "Prompt",
    "benchmark_pairs",
    "load_prompt",
    "parse_judgement",
    "read_pair_list",
    "score_judgements",
]
