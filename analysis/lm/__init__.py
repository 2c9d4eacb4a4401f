"""The ``trained`` input family's source: a small language model trained here, and its head's ``(x, W, y)``.

Stages, one module each (``python -m analysis lm`` runs them all, :mod:`analysis.lm.pipeline`):

* :mod:`analysis.lm.corpus` -- the standard library's ``.py`` source, split by file into train and held-out;
* :mod:`analysis.lm.tokenizer` -- a byte-level BPE tokenizer (``tokenizers``), cached as JSON;
* :mod:`analysis.lm.model` -- a small decoder-only transformer with an untied, bias-free head;
* :mod:`analysis.lm.train` -- deterministic, resumable AdamW training with a pluggable head loss;
* :mod:`analysis.lm.dumps` -- the head dumps on held-out text.

The dumps are read back with :func:`analysis.core.head_dumps.load_head_dump`::

    from analysis.core.head_dumps import load_head_dump
    dump = load_head_dump("final")   # dump.x (2048, 128), dump.weight (16384, 128), dump.target (2048,)
"""
