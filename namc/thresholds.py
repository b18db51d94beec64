"""Cut-offs chosen by measurement, in one table: each picks a kernel, a dtype, a thread count or a search by size.

Every value sits at or just below the size where the measured choice flips, so a size near it gains or loses little
either way. The figures behind each are in docs/performance.md (section "Thresholds"); change a value only with new
measurements there. The modules that use a value import it by name (``from namc.thresholds import ...``), which keeps
it patchable per module in tests. This module imports nothing, so every layer of namc may read it.
"""

from __future__ import annotations

__all__ = [
    "ARGMAX_MIN_ROWS",
    "BF16_MIN_WEIGHT",
    "CROSS_KV_BF16_MIN",
    "GELU_ATEN_MAX",
    "INT8_MIN_WEIGHT",
    "KNN_EXACT_MAX",
    "KNN_NPROBE",
    "MIR_BF16_MIN_WEIGHT",
    "SERIAL_ELEMENTS",
    "SERIAL_FLOPS",
]

# Precision of an inference copy's parts (namc.backends.precision), by the number of entries of a weight matrix.

#: a bf16 copy runs MIR in bf16 where its largest matrix has this many entries: below, bf16's per-call cost
#: outweighs its faster products (a width-64 MIR is slower in bf16 at batch 1-8, a width-128 one faster from 8)
MIR_BF16_MIN_WEIGHT = 1 << 15
#: a bf16 copy keeps a decoding-step matrix (FDG's layers, the vocabulary, an int8 copy's bf16 prefill) in bf16 from
#: this many entries: oneDNN's bf16 call costs about 15 us however small, which smaller products do not earn back
BF16_MIN_WEIGHT = 1 << 17
#: an int8 copy quantises a matrix from this many entries: below, dynamic int8 is no faster than fp32 at any row count
INT8_MIN_WEIGHT = 1 << 13
#: an int8 copy writes a generation's cross-attention keys / values in bf16 from a (B, N, D) memory of this many
#: elements (4 MB of fp32 keys a layer): reading half the bytes pays from there, below fp32's fused kernel is as fast
CROSS_KV_BF16_MIN = 1 << 20

# One thread or all (namc.kernels.run): under OMP_WAIT_POLICY=PASSIVE a second thread sleeps between parallel
# regions, and waking it costs more than a small product gains from it.

#: a product of fewer FLOPs than its kind's value runs on one thread (attention: 4 B H Q S E FLOPs); each sits at or
#: below the size where two threads start to win
SERIAL_FLOPS = {
    "int8": 1 << 25,  # dynamic int8 products (namc.backends.qlinear); one thread stops winning at 38-113 MFLOP
    "bf16": 1 << 24,  # oneDNN's bf16 linear kernel; crossing at 28-38 MFLOP
    "fp32": 1 << 23,  # F.linear; crossing at 9-28 MFLOP
    "sdpa_fp32": 1 << 20,  # F.scaled_dot_product_attention in fp32; crossing at 1-2.4 MFLOP
    "sdpa_bf16": 1 << 17,  # ... in bf16, whose fused kernel is slow on one thread over many keys; also where
    # namc.backends.step.attend_step switches bf16 to attend_one (ONE_QUERY_FUSED_FLOPS)
    "attend_one": 1 << 23,  # namc.backends.step.attend_one, two batched products; crossing at 5-10 MFLOP
}
#: a kernel that passes once over its input runs on one thread below this many elements of input
SERIAL_ELEMENTS = {
    "layer_norm": 1 << 17,  # backends.step.ThreadedLayerNorm: 32 x 768 is 4x faster on one thread, 512 x 768 is not
    "gelu": 1 << 17,  # backends.step.InplaceGELU above GELU_ATEN_MAX: oneDNN's kernel, faster on one up to 32 x 3072
    "argmax": 1 << 22,  # backends.step.first_max_index on fp32 logits: two threads win from 128 x 49,409
}
#: namc's inference GELU runs ATen's own kernel up to this many elements (ATen keeps it on one thread there) instead
#: of oneDNN's, which opens a parallel region at any size
GELU_ATEN_MAX = 16_384
#: the greedy pick's blocked first-max (namc.backends.step.first_max_index) from this many rows: at one row
#: ``max`` with indices is as fast
ARGMAX_MIN_ROWS = 2

# Corpus mining (namc.curate.mining.knn).

#: ``index="auto"`` searches up to this many images exactly and with IVF above: IVF (its training included) gets
#: faster between 20,000 and 40,000 images of 768-d features
KNN_EXACT_MAX = 25_000
#: IVF cells searched per query by default: recall of the exact top-10 stays at or above 0.95
KNN_NPROBE = 32
