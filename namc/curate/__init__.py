"""Corpus curation: image sources, similar-pair mining (appendix D.1), LLM captions and descriptions (appendix D.2),
template filtering and the noise audit. Needs the ``[curate]`` extra; ``namc curate embed`` also needs ``[train]``.

Nothing is imported here: use the submodules.
"""
