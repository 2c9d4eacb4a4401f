"""analysis.lm: the trained input family's corpus, tokenizer, training and head dumps, on a tiny corpus;
and the committed dumps of the real run."""

from __future__ import annotations

import json
import platform
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import lce
from analysis.core.head_dumps import (
    MAKE_COMMAND,
    available_checkpoints,
    from_byte_planes,
    load_head_dump,
    save_head_dump,
    to_byte_planes,
)
from analysis.lm.corpus import is_heldout, load_corpus
from analysis.lm.dumps import compute_head_dump
from analysis.lm.model import ModelConfig, TinyLM
from analysis.lm.pipeline import run_pipeline, unigram_entropy
from analysis.lm.tokenizer import END_OF_FILE, encode_files, load_or_train_tokenizer, train_tokenizer
from analysis.lm.train import TrainConfig, load_snapshot, train
from analysis.paths import LM_DATA_DIR

HELDOUT = 0.3  # a tiny corpus needs a larger held-out share to hold out anything at all
VOCAB = 300
TINY_MODEL = ModelConfig(VOCAB, d_model=32, n_layers=2, n_heads=2, context=16)


def _module_text(index: int) -> str:
    names = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta"]
    name = names[index % len(names)]
    lines = [f'"""Module {index}: helpers for {name}."""', "", "import os", ""]
    for k in range(12):
        lines += [f"def {name}_{k}(value, scale={k}):", f'    """Return value times {k} for {name}."""',
                  "    if value is None:", f"        return {k}", f"    return value * scale + {index}", ""]
    lines += [f"class {name.title()}Store:", "    def __init__(self):", "        self.items = {}", ""]
    return "\n".join(lines)


def _write_corpus(root, order=None):
    paths = [f"pkg{i % 3}/mod_{i}.py" for i in range(12)]
    for relative in order(paths) if order else paths:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_module_text(int(relative.split("_")[1].split(".")[0])), encoding="utf-8")
    return paths


@pytest.fixture(scope="module")
def corpus_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    paths = _write_corpus(root)
    assert any(is_heldout(p, HELDOUT) for p in paths) and not all(is_heldout(p, HELDOUT) for p in paths)
    return root


def _run(corpus_root, tmp_path, tag, steps=8, seed=0, stop_after=None, rows=64):
    config = TrainConfig(steps=steps, batch_size=4, eval_every=4, eval_windows=4, checkpoint_every=100)
    return run_pipeline(steps=steps, seed=seed, out=tmp_path / f"out-{tag}", cache=tmp_path / f"cache-{tag}",
                        corpus_root=corpus_root, heldout_fraction=HELDOUT, vocab_size=VOCAB, model=TINY_MODEL,
                        train_config=config, rows=rows, windows=8, progress=False, stop_after=stop_after)


def test_corpus_is_deterministic_independent_of_file_order_and_leaves_out_foreign_files(corpus_root, tmp_path):
    first = load_corpus(corpus_root, HELDOUT)
    assert [f.path for f in first.files] == sorted(f.path for f in first.files) and len(first.files) == 12
    assert load_corpus(corpus_root, HELDOUT) == first
    shuffled = tmp_path / "shuffled"
    _write_corpus(shuffled, order=lambda paths: list(reversed(paths)))  # created in the opposite order
    (shuffled / "site-packages" / "thirdparty").mkdir(parents=True)
    (shuffled / "site-packages" / "thirdparty" / "x.py").write_text("import this\n", encoding="utf-8")
    (shuffled / "latin1.py").write_bytes(b"# caf\xe9\n")
    outside = tmp_path / "outside.py"
    outside.write_text("print('outside')\n", encoding="utf-8")
    (shuffled / "link.py").symlink_to(outside)
    second = load_corpus(shuffled, HELDOUT)
    assert second.sha256 == first.sha256 and second.num_bytes == first.num_bytes
    assert [f.path for f in second.heldout_files] == [f.path for f in first.heldout_files]
    assert second.undecodable == ("latin1.py",)
    meta = second.provenance()
    assert meta["python_version"] == platform.python_version() and meta["corpus_undecodable_files"] == 1
    (shuffled / "pkg0" / "mod_0.py").write_text("changed = True\n", encoding="utf-8")
    assert load_corpus(shuffled, HELDOUT).sha256 != first.sha256


def test_heldout_split_depends_on_the_path_alone():
    paths = [f"lib/module_{i}.py" for i in range(4000)]
    share = sum(is_heldout(p) for p in paths) / len(paths)
    assert 0.04 < share < 0.06
    assert [is_heldout(p) for p in paths] == [is_heldout(p) for p in reversed(paths)][::-1]
    with pytest.raises(ValueError, match="fraction"):
        is_heldout("a.py", 1.5)


def test_tokenizer_round_trips_has_the_vocab_size_and_is_cached(corpus_root, tmp_path):
    texts = [f.text for f in load_corpus(corpus_root, HELDOUT).train_files]
    tokenizer, path = load_or_train_tokenizer(texts, VOCAB, tmp_path)
    assert tokenizer.get_vocab_size() == VOCAB and tokenizer.token_to_id(END_OF_FILE) == 0
    sample = "def f(x):\n    return 'é' + x  # ünïcode\n"
    assert tokenizer.decode(tokenizer.encode(sample).ids) == sample
    assert train_tokenizer(texts, VOCAB).to_str() == tokenizer.to_str()  # deterministic
    again, again_path = load_or_train_tokenizer(texts, VOCAB, tmp_path)
    assert again_path == path and again.to_str() == tokenizer.to_str()
    stream = encode_files(tokenizer, texts[:2])
    assert stream.dtype == torch.int64 and (stream == 0).sum() == 2 and stream[-1] == 0
    with pytest.raises(ValueError, match="fewer than vocab_size"):
        train_tokenizer(["ab"], 400)


@pytest.mark.slow
def test_training_is_deterministic_and_resumes_bitwise(corpus_root, tmp_path):
    straight = _run(corpus_root, tmp_path, "a")
    repeat = _run(corpus_root, tmp_path, "b")
    interrupted = _run(corpus_root, tmp_path, "r", stop_after=4)
    assert interrupted.dumps == {} and torch.load(interrupted.run_dir / "latest.pt")["step"] == 4
    resumed = _run(corpus_root, tmp_path, "r")
    other_seed = _run(corpus_root, tmp_path, "s", seed=1)
    for name in ("early", "final"):
        reference = load_head_dump(name, straight.dumps[name][0].parent)
        for result in (repeat, resumed):
            dump = load_head_dump(name, result.dumps[name][0].parent)
            for field in ("x", "weight", "target"):
                assert torch.equal(getattr(dump, field), getattr(reference, field)), (name, field)
            assert dump.meta["heldout_loss"] == reference.meta["heldout_loss"]
    assert not torch.equal(load_head_dump("final", other_seed.dumps["final"][0].parent).weight, reference.weight)


@pytest.mark.slow
def test_resuming_with_another_configuration_or_head_loss_is_refused(tmp_path):
    tokens = torch.randint(0, VOCAB, (200,))
    config = TrainConfig(steps=2, batch_size=2, eval_windows=2)
    train(TINY_MODEL, config, tokens, tokens, tmp_path, progress=False)
    with pytest.raises(ValueError, match="another configuration"):
        train(TINY_MODEL, replace(config, steps=3), tokens, tokens, tmp_path, progress=False)
    with pytest.raises(ValueError, match="another configuration"):
        train(TINY_MODEL, config, tokens, tokens, tmp_path, head_loss=_lce_head_loss, progress=False)


def _lce_head_loss(hidden, weight, targets):
    return lce.linear_cross_entropy(hidden, weight, targets, options=lce.LinearCrossEntropyOptions())


@pytest.mark.slow
def test_the_head_loss_is_pluggable(tmp_path):
    tokens = torch.randint(0, VOCAB, (400,))
    config = TrainConfig(steps=3, batch_size=2, eval_windows=2, snapshot_steps=(1,))
    calls = []

    def counted(hidden, weight, targets):
        calls.append((hidden.shape, weight.shape, targets.shape))
        return _lce_head_loss(hidden, weight, targets)

    default = train(TINY_MODEL, config, tokens, tokens, tmp_path / "default", progress=False)
    fused = train(TINY_MODEL, config, tokens, tokens, tmp_path / "lce", head_loss=counted, progress=False)
    assert calls == [((2 * 16, 32), (VOCAB, 32), (2 * 16,))] * 3  # (N, D), (C, D), (N,) on every step
    first = [load_snapshot(result.snapshots[1]).head.weight for result in (default, fused)]
    assert torch.allclose(*first, rtol=0, atol=1e-5)  # another implementation of the same loss
    assert fused.heldout_loss == pytest.approx(default.heldout_loss, abs=1e-3)


@pytest.mark.slow
def test_loss_decreases_below_the_unigram_entropy(corpus_root, tmp_path):
    result = _run(corpus_root, tmp_path, "long", steps=48)
    log = [line.split(",") for line in (result.run_dir / "log.csv").read_text().splitlines()[1:]]
    heldout = [float(row[3]) for row in log if row[3]]
    assert [int(row[0]) for row in log] == list(range(49))
    assert heldout[-1] < heldout[0] - 1.0 and heldout[-1] < result.heldout_losses["early"]
    assert result.heldout_losses["final"] < result.unigram_entropy
    assert unigram_entropy(torch.tensor([0, 1, 1, 2]), 4) == pytest.approx(1.0397207708399179)


def test_dumps_have_the_documented_shapes_and_round_trip(tmp_path):
    torch.manual_seed(0)
    model = TinyLM(TINY_MODEL)
    heldout = torch.randint(0, VOCAB, (500,))
    dump = compute_head_dump(model, heldout, rows=64, windows=8, seed=3)
    assert dump.x.shape == (64, 32) and dump.x.dtype == torch.float32
    assert dump.weight.shape == (VOCAB, 32) and dump.weight.dtype == torch.float32
    assert dump.target.shape == (64,) and dump.target.dtype == torch.int64
    assert 0 <= int(dump.target.min()) and int(dump.target.max()) < VOCAB
    with torch.no_grad():
        assert torch.equal(dump.weight, model.head.weight)
        assert dump.meta["dump_loss"] == pytest.approx(F.cross_entropy(model.head(dump.x).double(), dump.target).item())
    assert dump.meta["model_loss_at_rows"] == pytest.approx(dump.meta["dump_loss"], abs=1e-5)
    assert 0 < dump.meta["rows_standard_error"] < 1 and dump.meta["heldout_positions"] == 8 * 16
    assert torch.equal(compute_head_dump(model, heldout, rows=64, windows=8, seed=3).x, dump.x)
    save_head_dump(dump.__class__(dump.x, dump.weight, dump.target, {**dump.meta, "step": 9}), "final", tmp_path)
    save_head_dump(dump.__class__(dump.x, dump.weight, dump.target, {**dump.meta, "step": 2}), "early", tmp_path)
    assert available_checkpoints(tmp_path) == ["early", "final"]
    loaded = load_head_dump("final", tmp_path)
    assert all(torch.equal(getattr(loaded, f), getattr(dump, f)) for f in ("x", "weight", "target"))
    assert loaded.meta["step"] == 9 and loaded.x.device.type == "cpu"
    with pytest.raises(ValueError, match="rows=60"):
        compute_head_dump(model, heldout, rows=60, windows=8)
    with pytest.raises(ValueError, match="checkpoint name"):
        save_head_dump(dump, "../x", tmp_path)


def test_byte_planes_keep_every_bit_and_a_dump_of_plain_arrays_is_refused(tmp_path):
    """The dumps are stored as compressed byte planes: every bit comes back, odd values and byte orders included."""
    odd = np.array([0.0, -0.0, np.inf, -np.inf, np.finfo(np.float32).tiny / 3, 1e-45, 3.4e38, 1.5], np.float32)
    odd = np.concatenate([odd, np.frombuffer(np.array([0x7FC00001, 0xFFBADBAD], np.uint32).tobytes(), np.float32)])
    for array in (odd.reshape(2, 5), np.array([0, -1, 2**63 - 1, -(2**63)], np.int64), odd.astype(">f4")):
        planes = to_byte_planes(array)
        assert planes.dtype == np.uint8 and planes.shape == (array.itemsize, *array.shape)
        back = from_byte_planes(planes, array.dtype.newbyteorder("="))
        assert back.tobytes() == array.astype(array.dtype.newbyteorder("=")).tobytes() and back.shape == array.shape
    with pytest.raises(ValueError, match=r"planes must be uint8 of shape \(4, ...\) for float32, got float32"):
        from_byte_planes(odd, np.float32)
    np.savez(tmp_path / "head-final.npz", x=np.zeros((2, 3), np.float32), weight=np.zeros((5, 3), np.float32),
             target=np.zeros(2, np.int64))
    (tmp_path / "head-final.json").write_text("{}")
    with pytest.raises(ValueError, match=f"does not hold a head dump's byte planes .*`{MAKE_COMMAND}`"):
        load_head_dump("final", tmp_path)


def test_a_missing_dump_names_the_command_that_makes_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=MAKE_COMMAND) as error:
        load_head_dump("final", tmp_path / "nowhere")
    assert "'final'" in str(error.value) and "none" in str(error.value)


def test_committed_dumps_load_and_match_their_metadata():
    assert available_checkpoints() == ["early", "final"], f"run `{MAKE_COMMAND}` and commit {LM_DATA_DIR}"
    total = sum(p.stat().st_size for p in LM_DATA_DIR.iterdir())
    assert total < 16 * 2**20  # compressed byte planes: about 15 MiB for both (19 MB as plain arrays)
    losses = {}
    for name in ("early", "final"):
        dump = load_head_dump(name)
        meta = dump.meta
        assert dump.x.shape == (2048, 128) and dump.x.dtype == torch.float32
        assert dump.weight.shape == (16384, 128) and dump.weight.dtype == torch.float32
        assert dump.target.shape == (2048,) and dump.target.dtype == torch.int64
        assert 0 <= int(dump.target.min()) and int(dump.target.max()) < 16384
        assert meta["checkpoint"] == name and meta["tokenizer_vocab_size"] == 16384
        assert meta["python_version"].count(".") == 2 and len(meta["corpus_sha256"]) == 64
        assert meta["model_config"]["d_model"] == 128 and meta["step"] <= meta["train_steps"]
        loss = F.cross_entropy(dump.x.double() @ dump.weight.double().T, dump.target).item()
        assert loss == pytest.approx(meta["dump_loss"], abs=1e-9)
        assert loss == pytest.approx(meta["model_loss_at_rows"], abs=1e-4)  # x and W are what the model's head saw
        losses[name] = loss
    heldout, error = meta["heldout_loss"], meta["rows_standard_error"]
    # The rows are 2048 of the 32768 held-out positions the recorded loss averages: by sampling alone
    # their mean strays by about one standard error (~0.07 nats here), so a 0.05 bound would be luck.
    assert error < 0.1 and abs(losses["final"] - heldout) < 3 * error
    assert heldout < meta["unigram_entropy"] - 1.0 and losses["final"] < losses["early"] - 0.5
    json.dumps(meta)  # the metadata is plain JSON


def test_heldout_losses_per_bucket_match_a_direct_computation(tmp_path):
    # training counts chosen so the buckets are known by hand: class 0 alone holds 50% of the targets
    # (frequent); 1-4 and 9 the next 40% (middle); the rest, from class 10 at 92% on, are rare
    model = ModelConfig(16, d_model=16, n_layers=1, n_heads=2, context=8)
    counts = [500, 150, 100, 80, 50, 10, 5, 3, 2, 40, 20, 15, 10, 8, 5, 2]
    train_tokens = torch.cat([torch.full((n,), c) for c, n in enumerate(counts)])
    train_tokens = train_tokens[torch.randperm(len(train_tokens), generator=torch.Generator().manual_seed(0))]
    heldout = torch.randint(0, 16, (400,), generator=torch.Generator().manual_seed(1))
    config = TrainConfig(steps=2, batch_size=2, eval_every=2, eval_windows=5, checkpoint_every=2)
    result = train(model, config, train_tokens, heldout, tmp_path, progress=False)

    # independently: rank by count (ties by class), cumulative share of the targets before each class
    ranked = sorted(range(16), key=lambda c: (-counts[c], c))
    total, before, bucket = sum(counts), 0, {}
    for c in ranked:
        bucket[c] = "frequent" if before / total < 0.5 else "rare" if before / total >= 0.9 else "middle"
        before += counts[c]
    assert [c for c in range(16) if bucket[c] == "frequent"] == [0]
    assert [c for c in range(16) if bucket[c] == "rare"] == [5, 6, 7, 8, 10, 11, 12, 13, 14, 15]
    starts = torch.linspace(0, len(heldout) - 9, 5).round().long()
    windows = torch.stack([heldout[s:s + 9] for s in starts.tolist()])
    with torch.no_grad():
        logits = load_snapshot(result.snapshots[2])(windows[:, :-1]).double()
    nll = -logits.log_softmax(-1).gather(-1, windows[:, 1:, None]).squeeze(-1)
    names = [bucket[c] for c in windows[:, 1:].flatten().tolist()]
    want = {name: float(nll.flatten()[[n == name for n in names]].mean()) for name in ("frequent", "middle", "rare")}

    last = pd.read_csv(result.log_path).set_index("step").loc[2]
    assert last["heldout_loss"] == pytest.approx(float(nll.mean()), rel=1e-9)
    for name, value in want.items():
        assert last[f"heldout_{name}"] == pytest.approx(value, rel=1e-9), name
    assert len(set(want.values())) == 3  # each bucket had positions, and they differ
