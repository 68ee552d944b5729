import json
import math

import pytest
import torch

from neo_train.cli import main
from neo_train.config import preset
from neo_train.data import Batch, SyntheticData
from neo_train.kernels import available_backends
from neo_train.train import Trainer


def _tiny(**train):
    cfg = preset("tiny")
    return cfg.replace(train=cfg.train.replace(**train))


def test_training_is_deterministic():
    a = Trainer(_tiny(steps=8, kernel_backend="reference"), progress=False).run()
    b = Trainer(_tiny(steps=8, kernel_backend="reference"), progress=False).run()
    assert a.losses == b.losses and len(a.losses) == 8


@pytest.mark.parametrize("backend", [b for b in available_backends() if b != "reference"])
def test_backends_train_alike(backend):
    ref = Trainer(_tiny(steps=6, kernel_backend="reference"), progress=False).run()
    other = Trainer(_tiny(steps=6, kernel_backend=backend), progress=False).run()
    assert other.backend == backend
    torch.testing.assert_close(torch.tensor(other.losses), torch.tensor(ref.losses), rtol=1e-4, atol=1e-5)


def test_small_model_learns_the_teacher():
    cfg = preset("small")
    cfg = cfg.replace(train=cfg.train.replace(steps=120, eval_batches=8))
    result = Trainer(cfg, progress=False).run()
    assert result.eval["auc"] > 0.65, result.eval
    assert result.eval["ne"] < 1.0
    first, last = sum(result.losses[:10]) / 10, sum(result.losses[-10:]) / 10
    assert last < first


def test_nan_loss_stops_and_names_the_step():
    cfg = _tiny(steps=6)
    data = SyntheticData(cfg.model, cfg.data, cfg.train.batch_size)

    def batches():
        for step in range(10):
            b = data.batch(step)
            if step == 3:
                b = Batch(torch.full_like(b.dense, float("nan")), b.sparse, b.labels)
            yield b

    # the input checks name the field first; without them the loss check still stops the run
    with pytest.raises(ValueError, match=r"dense features hold non-finite values \(nan\) \(the batch of step 3\)"):
        Trainer(cfg, progress=False, train_data=batches()).run()
    unchecked = cfg.replace(train=cfg.train.replace(check_inputs=False))
    with pytest.raises(FloatingPointError, match="at step 3"):
        Trainer(unchecked, progress=False, train_data=batches()).run()


@pytest.mark.parametrize("batch_size", [8, 64])
def test_a_diverging_loss_stops_the_run_at_any_batch_size(batch_size):
    """A dense learning rate of 100 sends the loss to ~1e6 within a few steps, finite: the run
    stops at the first step above train.max_loss, keeping the losses before it."""
    cfg = _tiny(steps=12, batch_size=batch_size, dense_optimizer="sgd", dense_lr=100.0, log_every=4)
    t = Trainer(cfg, progress=False)
    with pytest.raises(FloatingPointError, match=r"> train.max_loss = 50: the model diverged"):
        t.run()
    kept = t.result.losses
    assert len(kept) < 12 and all(math.isfinite(v) and v <= 50 for v in kept), kept
    unbounded = Trainer(cfg.replace(train=cfg.train.replace(max_loss=0.0)), progress=False).run()
    assert len(unbounded.losses) == 12 and max(unbounded.losses) > 50  # the bound is what stopped it


def test_cli_train_writes_metrics_and_tensorboard(tmp_path, capsys):
    out = tmp_path / "m.json"
    rc = main(["train", "--nproc", "1", "--preset", "tiny", "--steps", "5", "--batch-size", "16", "--metrics-out", str(out),
               "--log-dir", str(tmp_path / "tb"), "--no-progress", "--backend", "reference"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "eval_auc=" in text and "samples/s=" in text and "backend=reference" in text
    m = json.loads(out.read_text())
    assert len(m["losses"]) == 5 and all(math.isfinite(x) for x in m["losses"])
    assert {"auc", "ne", "log_loss"} <= set(m["eval"]) and m["samples_per_s"] > 0
    assert m["batch_size"] == 16 and m["backend"] == "reference"
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_cli_reports_bad_input(tmp_path, capsys):
    assert main(["train", "--nproc", "1", "--preset", "tiny", "--batch-size", "0", "--log-dir", "none"]) == 2
    assert "train.batch_size" in capsys.readouterr().err
    assert main(["train", "--nproc", "1", "--config", str(tmp_path / "nope.toml"), "--log-dir", "none"]) == 2
    assert main(["train", "--nproc", "1", "--preset", "tiny", "--backend", "nosuch", "--log-dir", "none"]) == 2
    assert "nosuch" in capsys.readouterr().err


def test_cli_config_round_trip(tmp_path):
    path = tmp_path / "tiny.toml"
    assert main(["config", "--preset", "tiny", "--out", str(path)]) == 0
    assert main(["train", "--nproc", "1", "--config", str(path), "--steps", "2", "--log-dir", "none", "--no-progress"]) == 0


@pytest.mark.parametrize("label", [2.0, -1.0])
def test_labels_outside_0_1_are_an_error(label):
    cfg = _tiny(steps=3)
    data = SyntheticData(cfg.model, cfg.data, cfg.train.batch_size)
    b = data.batch(0)
    bad = Batch(b.dense, b.sparse, torch.full_like(b.labels, label))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 1\]; got .* \(the batch of step 0\)"):
        Trainer(cfg, progress=False).train_step(bad, 0)
    empty = Batch(b.dense[:0], SyntheticData(cfg.model, cfg.data, 0).batch(0).sparse, b.labels[:0])
    with pytest.raises(ValueError, match="the batch is empty"):
        Trainer(cfg, progress=False).train_step(empty, 0)


def test_a_failing_run_still_writes_its_summary_and_metrics(tmp_path, capsys):
    """A malformed line in the Criteo file's 6th global batch: the five steps trained before it
    are reported and written, with the error, rc 2."""
    from neo_train.data.criteo import write_synthetic_criteo_tsv

    data = tmp_path / "d.tsv"
    write_synthetic_criteo_tsv(data, 16 * 8, seed=0)
    lines = data.read_text().splitlines(keepends=True)
    lines[16 * 5 + 3] = "2" + lines[16 * 5 + 3][1:]  # label 2: line 84
    data.write_text("".join(lines))
    out = tmp_path / "m.json"
    rc = main(["train", "--nproc", "1", "--preset", "criteo_kaggle", "--row-scale", "1e-4", "--data", "criteo",
               "--data-path", str(data), "--holdout-every", "0", "--steps", "9", "--batch-size", "16",
               "--log-dir", "none", "--no-progress", "--backend", "reference", "--metrics-out", str(out)])
    assert rc == 2
    m = json.loads(out.read_text())
    assert "line 84" in m["error"] and 0 < len(m["losses"]) <= 5, m
    assert "FAILED after" in capsys.readouterr().out


@pytest.mark.parametrize(
    "name,row_scale,learns",
    [
        ("criteo_kaggle", 1e-2, True),
        ("model_f", 1e-6, False),
        pytest.param("model_a", 1e-4, False, marks=pytest.mark.slow),  # 40 layers of 3375: ~1 min a step on 2 cores
        pytest.param("model_i", 1e-4, False, marks=pytest.mark.slow),
    ],
)
def test_a_documented_preset_trains_stably_with_its_own_learning_rates(name, row_scale, learns):
    """The presets' own optimizer settings keep the loss bounded from step 1 (Adagrad at the
    old dense_lr = 0.05 sent model_a's loss to 2e13 at step 1 and criteo_kaggle's to 520)."""
    cfg = preset(name, row_scale)
    steps = 30 if learns else 8
    cfg = cfg.replace(train=cfg.train.replace(steps=steps, batch_size=64, eval_batches=1, kernel_backend="reference"))
    result = Trainer(cfg, progress=False).run()
    assert len(result.losses) == steps and max(result.losses) < 5.0, result.losses
    if learns:
        assert sum(result.losses[-10:]) / 10 < sum(result.losses[:3]) / 3 - 0.03, result.losses
