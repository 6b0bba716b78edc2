"""Every size limit that chooses between execution paths, in one place.

A step runs one of three ways (``runtime.execution.ExecutionPolicy`` picks and counts):
a CUDA graph (small uniform CUDA steps), the native decoder stack (small float32 CPU
steps: all layers in one native call), or op by op (native kernels where each op's limit
allows, torch's otherwise). These limits are where the native kernels stop paying (or stop
applying); each row's result is independent of them under ``torch.inference_mode``, where
the GEMMs run natively at any row count.
"""

# float32-weight GEMM: one pass over the weights serves up to this many rows; beyond it
# torch's BLAS GEMM is as fast or faster.
SMALL_M_MAX_ROWS = 8

# bfloat16 / block-quantized weights: rows up to which the native GEMM runs outside
# inference mode (beyond it both operands are widened for torch's GEMM), and the decoder
# stack's largest step.
COMPACT_MAX_ROWS = 64

# RMSNorm, SiLU-and-multiply, RoPE: rows up to which the native kernels run (one thread;
# beyond this torch's are as fast).
NATIVE_MAX_ROWS = 64

# Drafter re-runs through one native drafting call (``ops.stack_drafting``), and an EAGLE
# tree round's token budget: at most this many tokens.
NATIVE_ATTENTION_MAX_TOKENS = 64

# CUDA graphs: batch x queries per sequence of a graphed step.
CUDA_GRAPH_MAX_TOKENS = 64

# CUDA steps of at most this many query tokens take the paged attention kernel's key lists
# (decoding, verification, draft trees); larger ones (prefill) take SDPA's tensor-core kernels
CUDA_ATTENTION_MAX_TOKENS = 512
