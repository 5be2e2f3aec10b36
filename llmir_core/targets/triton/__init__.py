"""The `triton` target: llmir's own Triton kernels on CUDA GPUs (torch tensors hold the memory).

Nothing here is imported by llmir_core at module import time: `kernels/` imports triton and
torch, and is loaded only when this target builds, opens or tests an artifact. Set
`TRITON_INTERPRET=1` before the first import to run every kernel on the CPU (tests).
"""
