"""The Criteo TSV reader: transforms, hashing, missing values, rank sharding, resuming, errors."""
from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from neo_train.config import ModelConfig, preset
from neo_train.data.batch import Batch
from neo_train.data.criteo import CriteoReader, write_synthetic_criteo_tsv


@pytest.fixture(scope="module")
def model() -> ModelConfig:
    return preset("criteo_kaggle", row_scale=1e-3).model


def _line(label: str, ints: list[str], cats: list[str]) -> str:
    assert len(ints) == 13 and len(cats) == 26
    return "\t".join([label, *ints, *cats]) + "\n"


def _good_line(k: int = 0) -> str:
    return _line(str(k % 2), [str(k + j) for j in range(13)], [f"{k * 1000 + j:08x}" for j in range(26)])


def _assert_batch_equal(a: Batch, b: Batch) -> None:
    assert a.sparse.keys == b.sparse.keys
    assert torch.equal(a.dense, b.dense)
    assert torch.equal(a.labels, b.labels)
    assert torch.equal(a.sparse.values, b.sparse.values)
    assert torch.equal(a.sparse.lengths, b.sparse.lengths)


def _synthetic(tmp_path: Path, n: int, name: str = "data.tsv") -> Path:
    p = tmp_path / name
    write_synthetic_criteo_tsv(p, n, seed=3, missing_rate=0.2)
    return p


# ---- transforms ----------------------------------------------------------------------------------


def test_dense_transform_and_hashing(tmp_path: Path, model: ModelConfig) -> None:
    ints = ["0", "1", "-3", "7", "", "123456", "2", "3", "4", "5", "6", "999999999", "10"]
    cats = ["deadbeef", "00000000", "ffffffff", "0000000a", "ABCDEF01"] + [f"{j:08x}" for j in range(21)]
    p = tmp_path / "one.tsv"
    p.write_text(_line("1", ints, cats))
    (batch,) = list(CriteoReader(p, model, batch_size=1))

    # Dense: missing -> 0, negative -> 0, then log(x + 1) in float32.
    expected = [math.log(max(int(x), 0) + 1) if x else 0.0 for x in ints]
    assert batch.dense.dtype == torch.float32 and batch.dense.shape == (1, 13)
    assert batch.dense[0, 2].item() == 0.0 and batch.dense[0, 4].item() == 0.0
    assert torch.equal(batch.dense[0], torch.tensor(expected, dtype=torch.float32))
    assert batch.labels.tolist() == [1.0]

    # Hashing: int(hex, 16) % rows of that feature's table; one value written out by hand.
    rows = [t.num_rows for t in model.tables]
    assert rows[0] == 1 and rows[2] == 10131  # 1460 * 1e-3 rounds to 1, 10131227 * 1e-3 to 10131
    assert 0xFFFFFFFF == 4294967295 == 423943 * 10131 + 762
    assert batch.sparse.values[2].item() == 762
    expected_ids = [int(c, 16) % r for c, r in zip(cats, rows)]
    assert batch.sparse.values.tolist() == expected_ids
    assert batch.sparse.lengths.tolist() == [1] * 26
    assert batch.sparse.keys == tuple(f"C{i + 1}" for i in range(26))
    assert batch.sparse.values.dtype == torch.int64


def test_missing_values_give_empty_bags_and_zero_dense(tmp_path: Path, model: ModelConfig) -> None:
    cats_a = [""] * 26
    cats_b = [f"{j + 1:08x}" for j in range(26)]
    cats_b[2] = cats_b[25] = ""
    p = tmp_path / "missing.tsv"
    p.write_text(_line("0", [""] * 13, cats_a) + _line("1", ["5"] * 13, cats_b))
    (batch,) = list(CriteoReader(p, model, batch_size=2))
    assert batch.dense[0].tolist() == [0.0] * 13
    lens = batch.sparse.lengths_2d()  # (F, B)
    assert lens[:, 0].tolist() == [0] * 26
    assert lens[:, 1].tolist() == [0 if f in (2, 25) else 1 for f in range(26)]
    assert batch.sparse.values.numel() == 24
    batch.sparse.validate()
    # Feature-major: feature 3 (C4) of sample 1 is the 3rd value (C1, C2 precede it; C3 is empty).
    assert batch.sparse.values[2].item() == 4 % model.tables[3].num_rows


def test_crlf_and_no_final_newline(tmp_path: Path, model: ModelConfig) -> None:
    text = "".join(_good_line(k) for k in range(5))
    lf, crlf = tmp_path / "lf.tsv", tmp_path / "crlf.tsv"
    lf.write_text(text)
    crlf.write_bytes(text.replace("\n", "\r\n").rstrip("\r\n").encode())
    a, b = list(CriteoReader(lf, model, 5)), list(CriteoReader(crlf, model, 5))
    assert len(a) == len(b) == 1
    _assert_batch_equal(a[0], b[0])


# ---- sharding, resuming, drop_last -----------------------------------------------------------------


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_rank_batches_concatenate_to_global_batch(
    tmp_path: Path, model: ModelConfig, world_size: int, drop_last: bool
) -> None:
    # 47 lines, b = 4: every W leaves a short final global batch (47 % 4, 47 % 8, 47 % 12 != 0).
    p = _synthetic(tmp_path, 47)
    b = 4
    reference = list(CriteoReader(p, model, world_size * b, drop_last=drop_last))
    per_rank = [
        list(CriteoReader(p, model, b, rank=r, world_size=world_size, drop_last=drop_last))
        for r in range(world_size)
    ]
    assert all(len(batches) == len(reference) for batches in per_rank)
    assert len(reference) == (47 // (world_size * b) + (0 if drop_last else 1))
    for g, ref in enumerate(reference):
        _assert_batch_equal(Batch.concat([per_rank[r][g] for r in range(world_size)]), ref)
    if not drop_last:  # the short tail is split as evenly as possible
        tail = [per_rank[r][-1].batch_size for r in range(world_size)]
        assert sum(tail) == 47 % (world_size * b) and max(tail) - min(tail) <= 1


def test_tail_shorter_than_world_gives_empty_batches(tmp_path: Path, model: ModelConfig) -> None:
    p = _synthetic(tmp_path, 13)  # W*b = 12: one full global batch and a tail of one line
    per_rank = [list(CriteoReader(p, model, 4, rank=r, world_size=3, drop_last=False)) for r in range(3)]
    assert [[x.batch_size for x in batches] for batches in per_rank] == [[4, 0], [4, 0], [4, 1]]
    empty = per_rank[0][1]
    assert empty.dense.shape == (0, 13) and empty.sparse.lengths.numel() == 0
    (ref_tail,) = list(CriteoReader(p, model, 12, start_batch=1, drop_last=False))
    _assert_batch_equal(Batch.concat([per_rank[r][1] for r in range(3)]), ref_tail)


def test_drop_last(tmp_path: Path, model: ModelConfig) -> None:
    p = _synthetic(tmp_path, 23)
    assert [x.batch_size for x in CriteoReader(p, model, 5)] == [5, 5, 5, 5]
    assert [x.batch_size for x in CriteoReader(p, model, 5, drop_last=False)] == [5, 5, 5, 5, 3]
    assert list(CriteoReader(p, model, 24)) == []
    assert [x.batch_size for x in CriteoReader(p, model, 24, drop_last=False)] == [23]


def test_start_batch_resumes_where_global_batch_index_points(tmp_path: Path, model: ModelConfig) -> None:
    p = _synthetic(tmp_path, 40)
    W, b = 2, 3  # 6 full global batches of 6 lines
    full = CriteoReader(p, model, b, rank=1, world_size=W)
    assert full.global_batch_index == 0
    seen = []
    for k, batch in enumerate(full):
        assert full.global_batch_index == k + 1  # while batch k is held, the next is k + 1
        seen.append(batch)
        if k == 2:
            position = full.global_batch_index
    assert len(seen) == 6 and position == 3

    resumed = CriteoReader(p, model, b, rank=1, world_size=W, start_batch=position)
    rest = list(resumed)
    assert len(rest) == 3 and resumed.global_batch_index == 6
    for x, y in zip(rest, seen[3:]):
        _assert_batch_equal(x, y)
    # Iterating again starts again from start_batch.
    _assert_batch_equal(next(iter(resumed)), seen[3])
    assert list(CriteoReader(p, model, b, world_size=W, start_batch=100)) == []


def test_gzip_equals_plain(tmp_path: Path, model: ModelConfig) -> None:
    plain = _synthetic(tmp_path, 30, "d.tsv")
    gz = tmp_path / "d.tsv.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    also_gz = _synthetic(tmp_path, 30, "w.tsv.gz")  # the writer compresses by suffix
    assert gzip.decompress(also_gz.read_bytes()) == plain.read_bytes()
    a = list(CriteoReader(plain, model, 4, rank=1, world_size=2, drop_last=False))
    for other in (gz, also_gz):
        b = list(CriteoReader(other, model, 4, rank=1, world_size=2, drop_last=False))
        assert len(a) == len(b) == 4
        for x, y in zip(a, b):
            _assert_batch_equal(x, y)


# ---- the synthetic writer ---------------------------------------------------------------------------


def test_synthetic_file_is_realistic(tmp_path: Path, model: ModelConfig) -> None:
    p = _synthetic(tmp_path, 2000)
    lines = p.read_text().splitlines()
    assert len(lines) == 2000 and all(ln.count("\t") == 39 for ln in lines)
    cols = [ln.split("\t") for ln in lines]
    assert any(c[2].startswith("-") for c in cols)  # negative I2
    assert any(c[5] == "" for c in cols) and any(c[20] == "" for c in cols)  # missing I5, C7
    assert all(len(c[14]) in (0, 8) for c in cols)
    (batch,) = list(CriteoReader(p, model, 2000))
    rate = batch.labels.mean().item()
    assert 0.1 < rate < 0.5
    assert (batch.sparse.lengths == 0).float().mean().item() == pytest.approx(0.2, abs=0.02)
    # Labels depend on I1: the positive rate rises with it.
    i1 = batch.dense[:, 0]
    hi = batch.labels[i1 > i1.median()].mean().item()
    lo = batch.labels[i1 <= i1.median()].mean().item()
    assert hi > lo + 0.05
    write_synthetic_criteo_tsv(tmp_path / "again.tsv", 2000, seed=3, missing_rate=0.2)
    assert (tmp_path / "again.tsv").read_bytes() == p.read_bytes()


# ---- errors ----------------------------------------------------------------------------------------


def _with_bad_line(tmp_path: Path, bad: str) -> Path:
    """Eight lines, the 7th bad: with b = 2, W = 2 it is rank 1's first line of global batch 1."""
    p = tmp_path / "bad.tsv"
    p.write_text("".join(_good_line(k) for k in range(6)) + bad + _good_line(7))
    return p


def _replace(col: int, value: str) -> str:
    fields = _good_line(6).rstrip("\n").split("\t")
    fields[col] = value
    return "\t".join(fields) + "\n"


@pytest.mark.parametrize(
    "bad, where",
    [
        (_good_line(6).replace("\t", "", 1), "expected 40 tab-separated columns"),
        (_good_line(6).rstrip("\n") + "\textra\n", "got 41"),
        ("\n", "got 1"),
        (_replace(18, "xyz12345"), "column 19 (C5): not a hex string"),
        (_replace(18, "0x1f"), "column 19 (C5)"),
        (_replace(18, "1" * 17), "column 19 (C5): hex value longer than 16 digits"),
        (_replace(3, "1.5"), "column 4 (I3): not a decimal integer"),
        (_replace(3, "1_0"), "column 4 (I3)"),
        (_replace(3, " 5"), "column 4 (I3)"),
        (_replace(3, "-"), "column 4 (I3)"),
        (_replace(3, "5-"), "column 4 (I3)"),
        (_replace(3, "1" * 19), "column 4 (I3): integer longer than 18 digits"),
        (_replace(0, "2"), "column 1 (label): label must be 0 or 1"),
        (_replace(0, ""), "column 1 (label)"),
        (_replace(0, "01"), "column 1 (label)"),
    ],
)
def test_malformed_line_names_file_line_and_column(tmp_path: Path, model: ModelConfig, bad: str, where: str) -> None:
    p = _with_bad_line(tmp_path, bad)
    with pytest.raises(ValueError, match="line 7") as err:
        list(CriteoReader(p, model, 8))
    assert where in str(err.value) and str(p) in str(err.value)
    # Sharded: the rank that owns line 7 reports it by its line number in the file.
    with pytest.raises(ValueError, match="line 7"):
        list(CriteoReader(p, model, 2, rank=1, world_size=2))


def test_first_bad_field_is_reported(tmp_path: Path, model: ModelConfig) -> None:
    fields = _good_line(6).rstrip("\n").split("\t")
    fields[30], fields[5] = "nothex!!", "x"
    p = _with_bad_line(tmp_path, "\t".join(fields) + "\n")
    with pytest.raises(ValueError, match=r"line 7: column 6 \(I5\)"):
        list(CriteoReader(p, model, 4))


def test_edge_values_parse(tmp_path: Path, model: ModelConfig) -> None:
    ints = ["-" + "9" * 18, "9" * 18, "00012"] + ["0"] * 10
    cats = ["f" * 16, "A", "0"] + ["1"] * 23  # up to 16 digits, any case, short fields
    p = tmp_path / "edge.tsv"
    p.write_text(_line("0", ints, cats))
    (batch,) = list(CriteoReader(p, model, 1))
    assert batch.dense[0, :3].tolist() == pytest.approx([0.0, math.log(10**18), math.log(13)], rel=1e-6)
    rows = [t.num_rows for t in model.tables]
    assert batch.sparse.values.tolist() == [int(c, 16) % r for c, r in zip(cats, rows)]


def test_model_must_have_26_sparse_and_13_dense_features(tmp_path: Path, model: ModelConfig) -> None:
    p = _synthetic(tmp_path, 4)
    with pytest.raises(ValueError, match="26 categorical features .* 4 sparse features"):
        CriteoReader(p, preset("tiny").model, 2)
    with pytest.raises(ValueError, match="13 dense features .* num_dense_features = 12"):
        CriteoReader(p, model.replace(num_dense_features=12), 2)
    with pytest.raises(ValueError, match="rank"):
        CriteoReader(p, model, 2, rank=2, world_size=2)
    with pytest.raises(FileNotFoundError):
        CriteoReader(tmp_path / "nope.tsv", model, 2)


def test_reader_ids_fit_their_tables(tmp_path: Path, model: ModelConfig) -> None:
    p = _synthetic(tmp_path, 300)
    rows = np.array([t.num_rows for t in model.tables])
    for batch in CriteoReader(p, model, 100):
        for f, (vals, _, _) in enumerate(batch.sparse.by_feature().values()):
            assert vals.numel() == 0 or (0 <= int(vals.min()) and int(vals.max()) < rows[f])


def test_damaged_gzip_and_huge_fields_name_the_file(tmp_path):
    from neo_train.config import preset
    from neo_train.data.criteo import CriteoReader, write_synthetic_criteo_tsv

    model = preset("criteo_kaggle", row_scale=1e-4).model
    gz = tmp_path / "d.tsv.gz"
    write_synthetic_criteo_tsv(gz, 400, seed=1)
    data = gz.read_bytes()
    gz.write_bytes(data[: len(data) // 2])  # truncated mid-stream
    with pytest.raises(ValueError, match=r"d\.tsv\.gz: cannot read past line .*damaged gzip"):
        list(CriteoReader(gz, model, 16, 0, 1))
    big = tmp_path / "big.tsv"
    fields = ["1"] + ["2"] * 13 + ["x" * 1_000_000] + ["a1"] * 25
    big.write_text("\t".join(fields) + "\n")
    with pytest.raises(ValueError) as err:
        list(CriteoReader(big, model, 1, 0, 1))
    assert "big.tsv, line 1" in str(err.value) and len(str(err.value)) < 400 and "1,000,000 bytes" in str(err.value)


# ---- epochs and the evaluation hold-out ----------------------------------------------------------


def _firsts(reader) -> list[float]:
    """One fingerprint per batch: its first dense row's sum (distinct for every line here)."""
    return [round(float(b.dense[0].sum()), 4) for b in reader]


@pytest.mark.parametrize("drop_last", [True, False])
def test_epochs_holdout_and_resume_points(tmp_path: Path, model: ModelConfig, drop_last: bool) -> None:
    p = tmp_path / "e.tsv"
    p.write_text("".join(_good_line(k) for k in range(7 * 4 + 3)))  # 7 global batches of 4 and 3 lines
    W, b = 2, 2

    def firsts(**kw):
        return _firsts(CriteoReader(p, model, b, rank=1, world_size=W, drop_last=drop_last, **kw))

    one = firsts()
    assert len(one) == (7 if drop_last else 8)
    assert firsts(epochs=3) == one * 3
    train, held = firsts(holdout_every=3), firsts(holdout_every=3, split="eval")
    assert train == [one[g] for g in range(len(one)) if g % 3 != 2] and held == [one[2], one[5]]
    assert firsts(holdout_every=3, epochs=2) == train * 2  # the held-out batches stay out in every pass
    assert firsts(holdout_every=3, split="eval", epochs=5) == held  # evaluation is one pass
    for start in range(0, 3 * len(one) + 2):  # resuming anywhere, across pass boundaries
        assert firsts(epochs=3, start_batch=start) == (one * 3)[start:], start
        assert firsts(epochs=2, holdout_every=3, start_batch=start) == (train * 2)[start:], start
    import itertools

    endless = CriteoReader(p, model, b, rank=1, world_size=W, drop_last=drop_last, epochs=0, start_batch=50)
    assert _firsts(itertools.islice(endless, 4)) == (one * 20)[50:54]


def test_reader_rejects_bad_epoch_and_holdout_settings(tmp_path: Path, model: ModelConfig) -> None:
    p = _synthetic(tmp_path, 8)
    for kw, msg in (({"epochs": -1}, "epochs"), ({"holdout_every": 1}, "holdout_every"),
                    ({"split": "eval"}, "needs holdout_every"), ({"split": "test", "holdout_every": 3}, "split")):
        with pytest.raises(ValueError, match=msg):
            CriteoReader(p, model, 2, **kw)
    from neo_train.config import DataConfig

    with pytest.raises(ValueError, match="data.holdout_every"):
        DataConfig(holdout_every=1)
    with pytest.raises(ValueError, match="data.epochs"):
        DataConfig(epochs=-2)


def test_count_global_batches_reads_only_what_it_needs(tmp_path: Path) -> None:
    from neo_train.data.criteo import count_global_batches

    p = tmp_path / "c.tsv"
    p.write_text("".join(_good_line(k) for k in range(23)))
    assert count_global_batches(p, 4, at_most=100) == 5
    assert count_global_batches(p, 4, holdout_every=3, at_most=100) == 4  # batches 2 of 0..5 held out
    assert count_global_batches(p, 4) == 1 and count_global_batches(p, 24) == 0
    gz = tmp_path / "c.tsv.gz"
    gz.write_bytes(gzip.compress(p.read_bytes())[:40])  # truncated
    with pytest.raises(ValueError, match="c.tsv.gz"):
        count_global_batches(gz, 4, at_most=100)


def _criteo_run(tmp_path: Path, data: Path, *extra: str) -> tuple[int, dict, str]:
    import json

    from neo_train.cli import main

    out = tmp_path / f"m{len(list(tmp_path.glob('m*.json')))}.json"
    rc = main(["train", "--nproc", "1", "--preset", "criteo_kaggle", "--row-scale", "1e-4", "--data", "criteo",
               "--data-path", str(data), "--batch-size", "16", "--log-dir", "none", "--no-progress",
               "--backend", "reference", "--metrics-out", str(out), *extra])
    return rc, json.loads(out.read_text()) if out.exists() else {}, ""


def test_a_run_stops_at_the_end_of_its_data_and_keeps_what_it_trained(tmp_path: Path, capsys) -> None:
    """7 global batches of 16 with every 5th held out: 6 training batches a pass. --steps 100 with
    2 epochs trains 12 steps, says so, evaluates on the held-out batches, rc 0."""
    data = tmp_path / "d.tsv"
    write_synthetic_criteo_tsv(data, 16 * 7 + 5, seed=0)
    rc, m, _ = _criteo_run(tmp_path, data, "--steps", "100", "--epochs", "2", "--holdout-every", "5")
    out = capsys.readouterr().out
    assert rc == 0 and len(m["losses"]) == 12 and m["steps"] == 12 and not m["error"], m
    assert "the training data ended at step 12 of 100" in out and "steps=12" in out
    assert 0 <= m["eval"]["auc"] <= 1 and m["eval_history"][-1]["step"] == 12
    # without a hold-out and without --eval-path: no evaluation, said once; the run still succeeds
    rc, m, _ = _criteo_run(tmp_path, data, "--steps", "3", "--holdout-every", "0")
    assert rc == 0 and m["eval"] == {} and len(m["losses"]) == 3
    assert "no evaluation: no held-out data" in capsys.readouterr().out


def test_resume_across_an_epoch_boundary_is_exact(tmp_path: Path) -> None:
    data = tmp_path / "d.tsv"
    write_synthetic_criteo_tsv(data, 16 * 4, seed=1)
    common = ("--epochs", "3", "--holdout-every", "4", "--seed", "5")  # 3 training batches a pass
    rc, whole, _ = _criteo_run(tmp_path, data, "--steps", "8", *common)
    assert rc == 0 and len(whole["losses"]) == 8
    ck = str(tmp_path / "ck")
    assert _criteo_run(tmp_path, data, "--steps", "4", "--checkpoint-dir", ck, *common)[0] == 0
    rc, resumed, _ = _criteo_run(tmp_path, data, "--steps", "8", "--checkpoint-dir", ck, *common)
    assert rc == 0 and resumed["losses"] == whole["losses"]


def test_a_file_without_one_global_batch_is_refused_before_launch(tmp_path: Path, capsys) -> None:
    data = tmp_path / "short.tsv"
    write_synthetic_criteo_tsv(data, 20, seed=0)
    t0 = __import__("time").perf_counter()
    rc, m, _ = _criteo_run(tmp_path, data, "--steps", "5", "--batch-size", "32")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "short.tsv holds less than one global batch of 32 lines" in err[0], err
    assert __import__("time").perf_counter() - t0 < 10
