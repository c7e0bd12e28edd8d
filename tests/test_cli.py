"""The command line: bad input exits 2 with one line naming the flag and the rule, before
any process starts; a good run writes the JSON Lines the book reads."""
import dataclasses
import json
import subprocess
import sys

import pytest

from minipar import cli
from minipar.config import ParallelConfig, TrainConfig
from minipar.train import main

BAD = [
    (["--dp", "0"], "--dp 0 must be a positive integer"),
    (["--tp", "3"], "--tp 3 does not divide n_heads=8"),
    (["--tp", "8"], "--tp 8 does not divide n_kv_heads=4"),
    (["--cp", "3"], "--cp 3 needs --seq-len divisible by 2*cp=6"),
    (["--dp", "4", "--global-batch", "6"], "--global-batch 6 is not divisible by dp*microbatches"),
    (["--dp", "2", "--microbatches", "3"], "--global-batch 8 is not divisible by dp*microbatches"),
    (["--model", "gpt5"], "--model 'gpt5' is unknown"),
    (["--zero", "4"], "--zero 4 is unknown"),
    (["--data", "/no/such/file.txt"], "--data /no/such/file.txt: no such file"),
    (["--bucket-mb", "-1"], "--bucket-mb -1.0 must be >= 0"),
    (["--sp"], "--sp needs --tp > 1"),
    (["--schedule", "gpipe", "--pp", "2"], "--schedule 'gpipe' is unknown"),
    (["--steps", "many"], "argument --steps: invalid int value"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_exits_2_with_one_line(argv, message, capsys):
    try:
        code = main(argv)
    except SystemExit as e:          # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1, err


def test_real_process_exit_status_and_no_traceback():
    p = subprocess.run([sys.executable, "-m", "minipar.train", "--tp", "3"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    assert "--tp 3 does not divide n_heads=8" in p.stderr


def test_log_json_has_the_contract_keys(tmp_path):
    path = tmp_path / "log.jsonl"
    assert main(["--dp", "2", "--steps", "3", "--log-json", str(path), "--no-progress"]) == 0
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert {"step", "loss", "grad_norm", "lr", "step_time_s", "tokens_per_s", "mfu", "comm"} <= set(r)
        op = r["comm"]["dp"]["all_reduce"]
        assert set(op) == {"calls", "payload_bytes", "wire_bytes"}
    assert rows[-1]["loss"] < rows[0]["loss"]


def test_byte_data_trains(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    log = tmp_path / "l.jsonl"
    assert main(["--data", str(text), "--steps", "2", "--log-json", str(log), "--no-progress"]) == 0
    assert len(log.read_text().splitlines()) == 2


def test_flags_are_generated_from_the_config_fields():
    """One place for each default and its help: no flag, no default, no field is written
    twice."""
    assert cli.parse([]) == TrainConfig()
    assert cli.parse(["--tp", "2", "--sp", "--no-progress", "--data", "x.txt"]) == TrainConfig(
        parallel=ParallelConfig(tp=2, sp=True), progress=False, data="x.txt")
    text = cli.build_parser().format_help()
    for cls in (ParallelConfig, TrainConfig):
        for f in dataclasses.fields(cls):
            if "help" in f.metadata:
                flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
                assert flag in text, flag
