"""The passes: the chunk loop that computes the loss, the per-token log-probabilities and their gradients a chunk
of rows (and a block of classes) at a time, as a :class:`~lce.planning.plan.Plan` says, with the GEMMs it calls
(``gemm``) and fp16's power-of-two gradient scales (``headroom``). The arithmetic of every backend is written here
once; :mod:`lce.kernels` replaces some of its elementwise passes on CUDA.
"""
