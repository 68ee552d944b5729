import dataclasses

import pytest

from neo_train.config import (
    CRITEO_KAGGLE_CARDINALITIES,
    PRESETS,
    Config,
    DataConfig,
    DistConfig,
    ModelConfig,
    TableConfig,
    TrainConfig,
    preset,
)


@pytest.mark.parametrize("name", PRESETS)
def test_presets_round_trip_through_toml(name, tmp_path):
    cfg = preset(name, row_scale=1e-4 if name.startswith("model") else 1.0)
    path = tmp_path / "c.toml"
    cfg.dump(path)
    assert Config.load(path) == cfg


def test_every_field_has_a_docstring():
    import ast
    import inspect

    import neo_train.config as mod

    tree = ast.parse(inspect.getsource(mod))
    for cls in (TableConfig, ModelConfig, TrainConfig, DataConfig, DistConfig, Config):
        node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
        body = node.body
        documented = set()
        for a, b in zip(body, body[1:]):
            if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
                documented.add(a.target.id)
        fields = {f.name for f in dataclasses.fields(cls)}
        assert fields <= documented, f"{cls.__name__}: undocumented {fields - documented}"


def test_model_presets_carry_the_seed_statistics():
    a = preset("model_a").model
    assert len(a.tables) == 1000
    assert abs(a.num_embedding_params - 793e9) / 793e9 < 0.01
    dims = [t.dim for t in a.tables]
    assert min(dims) == 4 and max(dims) == 384 and 80 <= sum(dims) / len(dims) <= 105
    assert abs(sum(t.pooling_factor for t in a.tables) / 1000 - 15) < 0.1
    assert len(a.top_mlp) == 20 and a.top_mlp[0] == 3375
    assert preset("model_a").train.batch_size == 512
    f = preset("model_f").model
    assert abs(f.num_embedding_params - 12e12) / 12e12 < 0.01 and {t.dim for t in f.tables} == {256}
    i = preset("model_i").model
    assert abs(i.num_embedding_params - 332e9) / 332e9 < 0.01 and {t.dim for t in i.tables} == {92}
    assert preset("model_i").train.batch_size == 2048


def test_row_scale_keeps_the_shape():
    full, small = preset("model_a"), preset("model_a", row_scale=1e-4)
    assert [t.dim for t in full.model.tables] == [t.dim for t in small.model.tables]
    assert [t.pooling_factor for t in full.model.tables] == [t.pooling_factor for t in small.model.tables]
    assert all(s.num_rows == max(1, round(f.num_rows * 1e-4)) for f, s in zip(full.model.tables, small.model.tables))


def test_criteo_kaggle_preset():
    m = preset("criteo_kaggle").model
    assert [t.num_rows for t in m.tables] == list(CRITEO_KAGGLE_CARDINALITIES)
    assert m.num_dense_features == 13 and len(m.feature_names) == 26


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: TableConfig("t", 0, 8), "num_rows"),
        (lambda: TableConfig("t", 10, 8, pooling="max"), "pooling"),
        (lambda: TrainConfig(batch_size=0), "train.batch_size"),
        (lambda: TrainConfig(sparse_optimizer="lamb"), "train.sparse_optimizer"),
        (lambda: DataConfig(id_mode="wrap"), "data.id_mode"),
        (lambda: DataConfig(source="criteo"), "data.path"),
        (lambda: DistConfig(sharding="diagonal"), "dist.sharding"),
        (lambda: DistConfig(forward_comm_dtype="int4"), "dist.forward_comm_dtype"),
        (lambda: ModelConfig((TableConfig("t", 10, 8),), bottom_mlp=(16,)), "table 't'"),
        (lambda: ModelConfig((TableConfig("t", 10, 8), TableConfig("t", 5, 8)), bottom_mlp=(8,)), "duplicate table"),
    ],
)
def test_validation_names_the_bad_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_toml_errors_name_the_field(tmp_path):
    text = preset("tiny").dumps().replace("batch_size = 32", "batch_size = -4")
    with pytest.raises(ValueError, match="train.batch_size"):
        Config.loads(text)
    with pytest.raises(ValueError, match="unknown field"):
        Config.loads(preset("tiny").dumps() + "\n[extra]\nx = 1\n")
    with pytest.raises(ValueError, match="model.tables\\[0\\].num_rows"):
        Config.loads(preset("tiny").dumps().replace("num_rows = 100", 'num_rows = "a lot"'))
    with pytest.raises(FileNotFoundError):
        Config.load(tmp_path / "missing.toml")


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset"):
        preset("huge")


@pytest.mark.parametrize("section,field,value", [
    ("train", "eps", float("inf")), ("train", "sparse_lr", float("nan")), ("dist", "timeout_s", float("inf")),
    ("data", "zipf_alpha", float("inf")), ("train", "steps", 0),
])
def test_non_finite_and_zero_steps_are_rejected_naming_the_field(section, field, value):
    cfg = preset("tiny")
    with pytest.raises(ValueError, match=rf"{section}\.{field}: must be"):
        getattr(cfg, section).replace(**{field: value})


@pytest.mark.parametrize("argv", [
    ["train", "--nproc", "0"], ["train", "--local-world-size", "0"], ["simulate", "--nic-gbps", "0"],
    ["simulate", "--gpus-per-node", "0"], ["simulate", "--gpu-tflops", "0"], ["simulate", "--hbm-gbps", "inf"],
    ["replay", "traces", "--iters", "0"], ["plan", "--nodes", "0"],
])
def test_zero_or_non_finite_flags_are_one_line_usage_errors(argv, capsys):
    """A 0 must not silently mean "the default": one error line naming the flag, exit code 2."""
    from neo_train.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"error: argument {argv[1] if argv[0] != 'replay' else argv[2]}" in err[0], err
