"""A byte-level BPE tokenizer for the corpus, trained offline with the ``tokenizers`` library.

Byte-level means every byte string has an encoding (no unknown token) and decoding returns the
original text exactly. Files are separated by one special token, :data:`END_OF_FILE`, so a model
sees where one file stops and the next begins. Trained tokenizers are cached as JSON, named by the
vocabulary size and the training text's hash, so a rerun on the same corpus loads instead of
training again.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["END_OF_FILE", "train_tokenizer", "load_or_train_tokenizer", "encode_files"]

END_OF_FILE = "<|endoftext|>"
"""The special token placed between files (id 0)."""


def _text_key(texts: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        data = text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


def train_tokenizer(texts: Sequence[str], vocab_size: int):
    """A ``tokenizers.Tokenizer`` with exactly ``vocab_size`` tokens learned from ``texts``.

    The vocabulary is the 256 byte symbols, :data:`END_OF_FILE`, and merges learned until the size
    is reached (pairs seen at least twice). Raises ``ValueError`` if the text is too small to
    learn that many merges.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 1:
        raise ValueError(f"vocab_size must be at least {len(alphabet) + 1} (bytes + {END_OF_FILE}), got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[END_OF_FILE],
                                  initial_alphabet=alphabet, show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    if tokenizer.get_vocab_size() != vocab_size:
        raise ValueError(f"the training text yields only {tokenizer.get_vocab_size()} tokens, fewer than "
                         f"vocab_size={vocab_size}: use more text or a smaller vocabulary")
    return tokenizer


def load_or_train_tokenizer(texts: Sequence[str], vocab_size: int, cache_dir: Path | str):
    """The tokenizer for ``texts`` from ``cache_dir`` if one was saved there, else trained and saved.

    Returns ``(tokenizer, path)``; the file is ``tokenizer-<vocab_size>-<hash of texts>.json``.
    """
    from tokenizers import Tokenizer

    cache_dir = Path(cache_dir)
    path = cache_dir / f"tokenizer-{vocab_size}-{_text_key(texts)[:16]}.json"
    if path.exists():
        return Tokenizer.from_file(str(path)), path
    tokenizer = train_tokenizer(texts, vocab_size)
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".json.{os.getpid()}.tmp")  # processes training it at once do not collide
    tokenizer.save(str(partial))
    os.replace(partial, path)
    return tokenizer, path


def encode_files(tokenizer, texts: Sequence[str]):
    """One int64 tensor of token ids: each text's tokens followed by :data:`END_OF_FILE`."""
    import torch

    separator = tokenizer.token_to_id(END_OF_FILE)
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(list(texts), add_special_tokens=False):
        ids.extend(encoding.ids)
        ids.append(separator)
    return torch.tensor(ids, dtype=torch.int64)
