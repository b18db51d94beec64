"""Building a model whose every weight a strict load then fills, without drawing its random initial weights."""

from __future__ import annotations

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

__all__ = ["skip_random_init"]


class skip_random_init(TorchFunctionMode):  # noqa: N801 (used as a context manager, like torch.no_grad)
    """Build modules without drawing their random initial weights, for a strict load to fill: ``with
    skip_random_init(): model = NAMC(config, tokenizer)``, then :func:`~namc.models.io.load_strict`.

    Random initialisation is most of the time it takes to build a model only to overwrite it (namc_base: 0.8 of 1.0
    s, ``normal_`` and ``uniform_`` over 106M parameters). Inside the block ``torch.nn.init``'s random fills and the
    tensor methods ``normal_``, ``uniform_`` and ``random_`` leave their tensor as allocated, and ``torch.randn``
    and ``torch.rand`` (open_clip's class and position embeddings) allocate without drawing; everything else runs
    (constant fills, BatchNorm's ones and zeros, non-persistent buffers such as the grid's ImageNet mean and CLIP's
    causal mask, which no state dict carries), and the random generator is left as it was. The parameters hold
    whatever memory they were given until the load, so use it only where :func:`~namc.models.io.load_strict`
    follows, which refuses a state dict that misses any key. Unlike building on the ``meta`` device, it needs no way
    to rebuild the buffers a state dict lacks.
    """

    _INIT_FILLS = (
        "uniform_",
        "normal_",
        "trunc_normal_",
        "kaiming_uniform_",
        "kaiming_normal_",
        "xavier_uniform_",
        "xavier_normal_",
        "orthogonal_",
        "sparse_",
    )
    _SKIPPED = frozenset(
        [
            *(getattr(nn.init, name) for name in _INIT_FILLS),
            torch.Tensor.normal_,
            torch.Tensor.uniform_,
            torch.Tensor.random_,
        ]
    )
    _DRAWN = frozenset({torch.randn, torch.rand})

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (PyTorch's protocol)
        kwargs = kwargs or {}
        if func in self._SKIPPED:
            return args[0] if args else kwargs["tensor"]  # the filled tensor, as the in-place fill returns it
        if func in self._DRAWN:  # the same sizes and options, no generator
            return torch.empty(*args, **{key: value for key, value in kwargs.items() if key != "generator"})
        return func(*args, **kwargs)
