"""The command line: bad input exits 2 with one line naming the flag and the rule, before
any process starts; a good run writes the JSON Lines the book reads."""
import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest

from minipar.plan import flags
from minipar.runtime import run
from minipar.plan.config import ParallelConfig, TrainConfig
from minipar.runtime.run import main

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
    # numbers: NaN passes every `x < 0`; absurd finite values train to NaN
    (["--lr", "nan"], "--lr nan must be in (0, 1]"),
    (["--lr", "inf"], "--lr inf must be in (0, 1]"),
    (["--lr", "1e30"], "--lr 1e+30 must be in (0, 1]"),
    (["--lr", "0"], "--lr 0.0 must be in (0, 1]"),
    (["--weight-decay", "nan"], "--weight-decay nan must be finite and >= 0"),
    (["--clip", "-1"], "--clip -1.0 must be finite and >= 0"),
    (["--clip", "nan"], "--clip nan must be finite and >= 0"),
    (["--bucket-mb", "nan"], "--bucket-mb nan must be >= 0"),
    (["--min-lr-ratio", "-5"], "--min-lr-ratio -5.0 must be in [0, 1]"),
    (["--min-lr-ratio", "1.5"], "--min-lr-ratio 1.5 must be in [0, 1]"),
    (["--timeout-s", "nan"], "--timeout-s nan must be finite and positive"),
    (["--stop-grace-s", "-1"], "--stop-grace-s -1.0 must be finite and >= 0"),
    # the rule names the flags given: no --cp when CP is off
    (["--seq-len", "33", "--tp", "2", "--sp"], "--sp needs --seq-len 33 divisible by --tp 2"),
    (["--seq-len", "33", "--cp", "2"], "--cp 2 needs --seq-len divisible by 2*cp=4"),
    # more than this machine holds: refused before a byte is allocated
    (["--model", "llama3-405b"], "--model llama3-405b needs at least"),
    # the default --microbatches is said when it is the reason
    (["--schedule", "interleaved", "--pp", "4", "--dp", "4"],
     "(--microbatches defaults to --pp 4 with --schedule interleaved)"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_exits_2_with_one_line(argv, message, capsys, no_rank_may_start):
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
    assert flags.parse([]) == TrainConfig()
    assert flags.parse(["--tp", "2", "--sp", "--no-progress", "--data", "x.txt"]) == TrainConfig(
        parallel=ParallelConfig(tp=2, sp=True), progress=False, data="x.txt")
    text = flags.build_parser().format_help()
    assert "python -m minipar.torchrun" in " ".join(text.split())   # the command under torchrun
    for cls in (ParallelConfig, TrainConfig):
        for f in dataclasses.fields(cls):
            if "help" in f.metadata:
                flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
                assert flag in text, flag


def test_problems_name_their_flag_and_rule():
    """A rule's line is what the user reads; code asks its flag and rule, never its words.
    The cost model allows the Llama 3 split's two extra stages: the same rule, a parameter."""
    from minipar.plan.config import ConfigError, ModelConfig
    from minipar.plan import costmodel as cm
    layout = ParallelConfig(pp=4, virtual_stages=4, schedule="interleaved")
    [p] = layout.problems(ModelConfig(), 32, 8)
    assert (p.flag, p.rule, p) == ("--pp", "stages",
                                   "--pp 4 x --virtual-stages 4 = 16 stages exceeds n_layers=8")
    assert layout.problems(ModelConfig(), 32, 8, end_stages=8) == []
    with pytest.raises(ConfigError) as e:
        ParallelConfig(tp=3).validate(ModelConfig(), 32, 8)
    assert [(q.flag, q.rule) for q in e.value.problems] == [("--tp", "divides")] * 4
    assert str(e.value) == "; ".join(e.value.problems)
    work = cm.Workload(32, 8)
    assert cm.layout_problems(ModelConfig(), ParallelConfig(pp=4, virtual_stages=2,
                                                            schedule="interleaved"), work) == []
    [q] = cm.layout_problems(ModelConfig(n_layers=4), layout, work)
    assert q.rule == "stages" and "n_layers + 2 = 6" in q


def bad_paths(tmp):
    """Files and paths the ranks would trip over, each with the line that names it."""
    empty, short, afile = tmp / "empty.txt", tmp / "short.txt", tmp / "a_file"
    empty.write_bytes(b"")
    short.write_bytes(b"0123456789")
    afile.write_text("x")
    out = [
        (["--data", str(empty)], f"--data {empty} holds 0 bytes; --seq-len 32 needs at least seq_len + 2 = 34"),
        (["--data", str(short)], f"--data {short} holds 10 bytes"),
        (["--data", str(short), "--seq-len", "4"], None),               # long enough for 4
        (["--log-json", str(tmp / "no" / "log.jsonl")], f"{tmp / 'no'} does not exist"),
        (["--log-json", str(afile / "log.jsonl")], f"{afile} is a file, not a directory"),
        (["--log-json", str(tmp)], f"--log-json {tmp} is a directory, not a file"),
    ]
    if os.path.isdir("/proc/self"):  # no file can be made there, not even by root
        out.append((["--log-json", "/proc/minipar.jsonl"], "--log-json /proc/minipar.jsonl"))
    if os.getuid() != 0:             # root may write a read-only file
        ro = tmp / "ro.jsonl"
        ro.write_text("")
        ro.chmod(0o444)
        out.append((["--log-json", str(ro)],
                    f"--log-json {ro} cannot be written: Permission denied"))
    return out


def test_files_and_paths_are_checked_before_any_rank(tmp_path, capsys, monkeypatch):
    from minipar.runtime import launch
    started = []
    monkeypatch.setattr(launch, "run_local", lambda *a, **k: started.append(a) or [{"records": [], "ended": None}])
    for argv, message in bad_paths(tmp_path):
        code = main([*argv, "--steps", "1", "--no-progress"])
        err = capsys.readouterr().err
        if message is None:
            assert code == 0 and started, (argv, err)
            continue
        assert code == 2, (argv, err)
        assert message in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert len(started) == 1


def test_memory_a_preset_needs_is_compared_with_the_machine(monkeypatch):
    """The per-rank lower bound: the stage built whole in float32, or its TP shard with
    gradients and AdamW's m and v (16 B a weight), ZeRO-sharded; all local ranks add up."""
    from minipar.runtime import preflight
    from minipar.plan.flops import param_count
    from minipar.plan.config import ConfigError, ModelConfig
    big = TrainConfig(model="llama3-8b")
    n = param_count(ModelConfig.preset("llama3-8b"))
    assert preflight.stage_bytes(big.model_config(), big, 0)[:2] == (4 * n, 16 * n)
    tp4 = TrainConfig(model="llama3-8b", parallel=ParallelConfig(tp=4, dp=2, zero=1))
    built, held, _ = preflight.stage_bytes(tp4.model_config(), tp4, 0)
    assert built == 4 * n              # built whole before TP cuts it
    assert 3 * n <= held < 3.01 * n    # n/4 x (4 weight + 4 grad + 8/2 Adam); norms replicated
    dp2 = TrainConfig(model="llama3-8b", parallel=ParallelConfig(dp=2))
    step = preflight.stage_bytes(dp2.model_config(), dp2, 0, 4)[2]    # + the batch, activations
    monkeypatch.setattr(preflight, "available_ram", lambda: (16 * n + step) * 2 - 1)
    with pytest.raises(ConfigError, match=r"--model llama3-8b needs at least .* GiB .* of its 2 rank"):
        preflight.check_memory(dp2)
    monkeypatch.setattr(preflight, "available_ram", lambda: (16 * n + step) * 2)
    preflight.check_memory(dp2)
    assert preflight.available_ram() is None or preflight.available_ram() > 0


def test_odd_seq_len_trains_without_cp_and_interleaved_picks_its_microbatches(capsys):
    """--seq-len 33 needs no CP rule when CP is off (nor SP's when TP runs without SP);
    --schedule interleaved without --microbatches takes --pp of them and gives the
    reference loss (the global batch, not its cut, sets the loss)."""
    assert ParallelConfig(pp=2, schedule="interleaved").microbatches == 2
    assert ParallelConfig(pp=2).microbatches == ParallelConfig(schedule="interleaved").microbatches == 1
    assert main(["--seq-len", "33", "--tp", "2", "--steps", "1", "--no-progress"]) == 0
    from helpers import losses, max_rel_diff
    from minipar.runtime.run import train
    ref = losses(train(TrainConfig(steps=2, progress=False)))
    cfg = TrainConfig(parallel=ParallelConfig(pp=2, schedule="interleaved", virtual_stages=2),
                      steps=2, progress=False)
    assert max_rel_diff(losses(train(cfg)), ref) <= 1e-5


def poison_gradients_at(monkeypatch, step_to_poison: int):
    """Every gradient of step `step_to_poison` becomes NaN (as an overflow would make it),
    on every rank: the forked ranks inherit the patched Trainer."""
    from minipar.trainer import step as train_module
    probe = train_module.Trainer.probe

    def poisoned(self, step):
        if step == step_to_poison:
            for g, _ in self.model.dp.grads():
                g.fill_(float("nan"))
        return probe(self, step)
    monkeypatch.setattr(train_module.Trainer, "probe", poisoned)


def test_a_nonfinite_step_stops_the_run_naming_it(monkeypatch, capsys, tmp_path):
    poison_gradients_at(monkeypatch, 2)
    log = tmp_path / "log.jsonl"
    assert main(["--dp", "2", "--steps", "4", "--no-progress", "--log-json", str(log)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "step 2: loss" in err and "is not finite" in err and "--skip-nonfinite" in err
    assert [json.loads(x)["step"] for x in log.read_text().splitlines()] == [0, 1]


def weight_sum(step, chunks, dp, grid):
    """after_backward probe: a fingerprint of this rank's weights before the step's update."""
    return float(sum(p.detach().double().sum() for m in chunks for p in m.parameters()))


def test_skip_nonfinite_skips_the_update_and_goes_on(monkeypatch):
    from helpers import losses
    from minipar.runtime.run import train
    text = " ".join(flags.build_parser().format_help().split())
    assert "--skip-nonfinite" in text and "instead of stopping the run" in text
    poison_gradients_at(monkeypatch, 1)
    out = train(TrainConfig(parallel=ParallelConfig(dp=2), steps=4, progress=False,
                            skip_nonfinite=True), after_backward=weight_sum)
    assert [r.get("skipped", False) for r in out["records"]] == [False, True, False, False]
    assert all(math.isfinite(x) for x in losses(out)[2:])
    w = out["probes"]
    assert w[1] == w[2] != w[3] and w[0] != w[1]      # no update at step 1, updates after


def test_make_lab_passes_allow_root_as_root(repo_root):
    """JupyterLab refuses to start as root without --allow-root (containers run as root)."""
    out = subprocess.run(["make", "-n", "lab"], cwd=repo_root, capture_output=True, text=True,
                         timeout=60).stdout
    [line] = [x for x in out.splitlines() if "jupyter lab" in x]
    assert ("--allow-root" in line) == (os.getuid() == 0), line


def test_an_error_with_detail_prints_its_first_line_once(capsys):
    assert run.error(RuntimeError("rank 1 died\n(then ranks [0] failed)"), 1, detail=True) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{flags.PROG}: error: rank 1 died", "(then ranks [0] failed)"]
