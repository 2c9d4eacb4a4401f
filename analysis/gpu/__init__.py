"""``python -m analysis gpu-check``: the one prepared command a lent GPU runs within its budget
(:mod:`~analysis.gpu.check`), and the wheels it carries there (:mod:`~analysis.gpu.wheels`)."""
