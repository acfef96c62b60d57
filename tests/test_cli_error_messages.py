"""The errors a newcomer meets first, through the CLI: each message says what is wrong and what to do.

Wrong paths (a config, a store, a raw file given as a store, a checkpoint, an input file), config typos (in a
file, in a model parameter, a name from another library), a store whose features differ from the checkpoint's,
and embedding tables too large for this machine's memory at the chosen dimension.
"""

from __future__ import annotations

import json
import logging
import os

import pytest

from ctrkit.cli import main
from ctrkit.jobs.demo import REPO, SAMPLE
from ctrkit.nn.table_memory import available_memory

DEEPFM = str(REPO / "configs" / "criteo" / "deepfm.yaml")


@pytest.fixture(scope="module")
def prep(tmp_path_factory):
    d = tmp_path_factory.mktemp("newcomer")
    assert main(["preprocess", "criteo", str(SAMPLE), "--out", str(d / "st"), "--min-freq", "8"]) == 0
    return d


def _error(caplog, argv) -> str:
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="ctrkit"):
        assert main(argv) == 2
    return caplog.text


def _train(prep, *extra):
    st = prep / "st"
    return ["train", "--config", DEEPFM, "--quiet", f"--data.train={st / 'train'}", f"--data.valid={st / 'valid'}",
            f"--data.test={st / 'test'}", f"--run.dir={prep / 'runs'}", "--train.epochs=1", *extra]


def test_the_default_preprocess_output_trains_every_one_dim_model(prep):
    """`ctrkit preprocess criteo` without options, then a zoo config: trains (one embedding dim by default)."""
    assert main(_train(prep, "--run.name=defaults")) == 0


def test_a_config_path_typo_suggests_the_file(caplog):
    msg = _error(caplog, ["train", "--config", DEEPFM.replace("deepfm", "deepfmm")])
    assert "config file" in msg and f"did you mean {DEEPFM}?" in msg


def test_a_relative_config_path_names_the_working_directory(caplog, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    msg = _error(caplog, ["train", "--config", "configs/criteo/deepfm.yaml"])
    assert f"relative to the working directory {os.getcwd()}" in msg
    assert "the folder configs does not exist either" in msg and "configs/<dataset>/<model>.yaml" in msg


def test_the_preprocess_output_folder_as_a_store_names_its_splits(prep, caplog):
    st = prep / "st"
    msg = _error(caplog, [*_train(prep, "--run.name=x"), f"--data.train={st}"])
    assert f"data.train={st / 'train'}, data.valid={st / 'valid'}, data.test={st / 'test'}" in msg


def test_a_raw_file_as_a_store_says_to_preprocess_it(prep, caplog):
    msg = _error(caplog, [*_train(prep, "--run.name=x"), f"--data.train={SAMPLE}"])
    assert "is a file, not a ctrkit store" in msg and f"ctrkit preprocess criteo|table {SAMPLE} --out DIR" in msg


def test_a_missing_store_says_how_to_make_it(prep, caplog):
    msg = _error(caplog, [*_train(prep, "--run.name=x"), f"--data.valid={prep / 'st' / 'valdi'}"])
    assert "data.valid: store" in msg and f"did you mean {prep / 'st' / 'valid'}?" in msg
    assert "ctrkit preprocess ... --out DIR` and set data.valid=DIR/valid" in msg


def test_a_missing_checkpoint_says_where_checkpoints_are(caplog, tmp_path):
    msg = _error(caplog, ["evaluate", "--checkpoint", str(tmp_path / "runs" / "x" / "best.pt")])
    assert "checkpoint file" in msg and f"the folder {tmp_path / 'runs'} does not exist either" in msg
    assert "writes best.pt and last.pt into its run directory" in msg


def test_a_missing_input_file_is_named(caplog, tmp_path):
    msg = _error(caplog, ["preprocess", "criteo", str(tmp_path / "day_0.tsv"), "--out", str(tmp_path / "o")])
    assert f"input file {tmp_path / 'day_0.tsv'} does not exist" in msg


def test_a_typo_in_a_config_file_names_the_file_and_the_key(prep, caplog, tmp_path):
    cfg = tmp_path / "mine.yaml"
    cfg.write_text(f"defaults: [{DEEPFM}]\ntrain: {{learning_rate: 0.01}}\n")
    msg = _error(caplog, ["train", "--config", str(cfg)])
    assert str(cfg) in msg and "'train.learning_rate'" in msg and "(did you mean 'lr'?)" in msg


def test_a_typo_in_a_model_parameter_suggests_it(prep, caplog):
    msg = _error(caplog, _train(prep, "--run.name=x", "--model.params.dnn_hiden=[8]"))
    assert "model 'deepfm' has no parameter 'dnn_hiden' (did you mean 'dnn_hidden'?)" in msg


def test_a_store_of_other_features_than_the_checkpoint_names_them(prep, caplog, tmp_path):
    assert main(_train(prep, "--run.name=schema")) == 0
    csv = tmp_path / "t.csv"
    csv.write_text("label,age,city\n" + "".join(f"{i % 2},{20 + i},c{i % 3}\n" for i in range(40)))
    spec = tmp_path / "s.yaml"
    spec.write_text("label: label\ndense: [age]\nsparse: [city]\n")
    assert main(["preprocess", "table", str(csv), "--schema", str(spec), "--out", str(tmp_path / "o")]) == 0
    msg = _error(caplog, ["evaluate", "--checkpoint", str(prep / "runs" / "schema" / "best.pt"),
                          "--data", str(tmp_path / "o" / "test")])
    assert "other features than checkpoint" in msg and "missing from the store: I1, I2" in msg
    assert "not read by the model: age, city" in msg and "--vocab-from TRAIN_STORE" in msg


def test_tables_too_large_for_memory_name_the_table_and_the_options(prep, caplog, tmp_path):
    """A store whose vocabulary at the chosen dim needs more memory than the machine has (a real check, not a
    mocked one: 10^12 rows x 16 floats is 64 TB)."""
    import shutil

    big = tmp_path / "big"
    shutil.copytree(prep / "st" / "train", big)
    manifest = json.loads((big / "manifest.json").read_text())
    c3 = next(f for f in manifest["schema"]["sparse"] if f["name"] == "C3")
    c3["vocab_size"] = 10**12
    (big / "manifest.json").write_text(json.dumps(manifest))
    assert available_memory() is not None and available_memory() < 10**12 * 16 * 4
    msg = _error(caplog, [*_train(prep, "--run.name=big"), f"--data.train={big}", "--data.valid=null"])
    assert "the embedding tables need" in msg and "C3: 1,000,000,000,000 rows x 16" in msg
    assert "GiB of memory available" in msg and "model.params.embedding_dim" in msg and "minimum id frequency" in msg
