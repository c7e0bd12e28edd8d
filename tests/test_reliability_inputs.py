"""Issue 30, item 5: every malformed input is one line `error: ...` naming the flag, file or
field and the rule, exit 2, before any work (no rank, no traceback). Hugging Face config.json
fields (`hf.config_problems`), generation's inputs (`minipar.generate`), the cost model's
numbers (`costmodel.cli.number_problem`) and the run's --seed and --timeout-s (`config.py`).

The Hugging Face directories are written by minipar itself (`hf.save_pretrained`), without
transformers, and the tokenizers are word-level vocabularies built in memory: fast."""
from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from minipar.plan import costmodel as cm
from minipar.runtime import generate as gen
from minipar.runtime import hf
from minipar.plan.config import ConfigError, ModelConfig, TrainConfig
from minipar.plan.costmodel.cli import build_parser, build_plan_parser, number_problem
from minipar.trainer.model import Transformer
from minipar.runtime.run import main as train_main

VOCAB, POSITIONS = 320, 64       # the test model's vocabulary and max_seq_len


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def run(module: str, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True,
                          timeout=timeout)


def word_tokenizer(path, size: int):
    """A tokenizer.json of `size` tokens: the words w0 .. w{size-2} and [UNK]."""
    vocab = {f"w{i}": i for i in range(size - 1)} | {"[UNK]": size - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return path


def save(path, edit=lambda state: None, **model):
    """A Hugging Face directory of a 2-layer Llama, its weights changed by `edit` in place."""
    mcfg = ModelConfig(**{"n_layers": 2, "vocab_size": VOCAB, "max_seq_len": POSITIONS, **model})
    state = Transformer(mcfg, seed=0).state_dict()
    edit(state)
    hf.save_pretrained(state, mcfg, str(path))
    return path


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path = save(tmp_path_factory.mktemp("hf") / "llama")
    word_tokenizer(path / "tokenizer.json", VOCAB)
    return path


def edited(good, tmp_path, change) -> str:
    """A copy of `good` whose config.json is `change(config)` (or what it returns)."""
    path = shutil.copytree(good, tmp_path / "llama")
    cfg = json.loads((path / "config.json").read_text())
    cfg = change(cfg) or cfg
    (path / "config.json").write_text(json.dumps(cfg))
    return str(path)


# ---------------------------------------------------------------- Hugging Face config.json
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
BAD_CONFIG = [
    # transformers reads rope_scaling first: it would build yarn; minipar must not train plain RoPE
    ("yarn beside default", lambda c: c.update(rope_parameters={"rope_type": "default",
                                                                "rope_theta": 1e4},
                                               rope_scaling=YARN), ["rope_scaling", "'yarn'"]),
    ("yarn under rope_parameters", lambda c: c.update(rope_scaling=LLAMA3, rope_parameters=YARN),
     ["rope_parameters", "'yarn'"]),
    ("legacy type key", lambda c: c.update(rope_scaling={"type": "linear", "factor": 2.0}),
     ["rope_scaling", "'linear'"]),
    ("type beside rope_type", lambda c: c.update(rope_scaling={"rope_type": "default",
                                                               "type": "dynamic"}), ["'dynamic'"]),
    ("hidden_size a string", lambda c: c.update(hidden_size="64"),
     ["hidden_size='64'", "positive integer"]),
    ("layers a bool", lambda c: c.update(num_hidden_layers=True),
     ["num_hidden_layers=True", "positive integer"]),
    ("heads a float", lambda c: c.update(num_attention_heads=8.0), ["num_attention_heads=8.0"]),
    ("eps NaN", lambda c: c.update(rms_norm_eps=math.nan), ["rms_norm_eps=nan", "finite"]),
    ("theta negative", lambda c: c.update(rope_theta=-1), ["rope_theta=-1", "> 0"]),
    ("tie a string", lambda c: c.update(tie_word_embeddings="no"),
     ["tie_word_embeddings='no'", "true or false"]),
    ("llama3 factor a string", lambda c: c.update(rope_parameters={**LLAMA3, "factor": "8"}),
     ["factor='8'", "finite number"]),
    ("vocab null", lambda c: c.update(vocab_size=None), ["missing field 'vocab_size'"]),
    ("a JSON list", lambda c: [c], ["must be a JSON object"]),
    ("rope_scaling a string", lambda c: c.update(rope_scaling="yarn"),
     ["rope_scaling", "objects or null"]),
]


@pytest.mark.parametrize("case,change,words", BAD_CONFIG, ids=[c for c, *_ in BAD_CONFIG])
def test_bad_config_json_exits_2_in_one_line(case, change, words, good, tmp_path, capsys,
                                             no_rank_may_start):
    path = edited(good, tmp_path, change)
    assert train_main(["--init-hf", path, "--no-progress"]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"--init-hf {path}/config.json" in line
    for word in words:
        assert word in line, line


def test_the_supported_rope_types_still_read():
    """Transformers 5's `rope_parameters` (default or llama3) and the older `rope_scaling`."""
    base = hf.to_hf(ModelConfig())
    v5 = hf.model_config({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}})
    assert v5.rope_theta == 5e5 and v5.llama3_rope is None
    for key in hf.ROPE_KEYS:
        m = hf.model_config({**base, "rope_scaling": None, key: LLAMA3})
        assert m.llama3_rope == (8.0, 1.0, 4.0, 32)
    with pytest.raises(ConfigError, match="rope_type='yarn'"):
        hf.model_config({**base, "rope_scaling": {"type": "yarn", "factor": 2.0}})


def test_the_yarn_probe_as_users_run_it(good, tmp_path):
    """The probe end to end, in real processes: training and generation refuse it."""
    path = edited(good, tmp_path, lambda c: c.update(rope_parameters={"rope_type": "default"},
                                                     rope_scaling=YARN))
    for module, short in (("minipar.train", "--steps"), ("minipar.generate", "--max-new-tokens")):
        p = run(module, "--init-hf", path, short, "1")
        assert p.returncode == 2, p.stderr
        assert "rope_type='yarn' is not supported" in one_line(p.stderr)


# ---------------------------------------------------------------- the run's --seed and --timeout-s
@pytest.mark.parametrize("argv,words", [
    (["--seed", str(10**25)], ["--seed", "[0, 2**44)", "2**64"]),
    (["--seed", "-1"], ["--seed -1", "[0, 2**44)"]),
    (["--timeout-s", "0.001"], ["--timeout-s 0.001", ">= 1 s"]),
    (["--timeout-s", "inf"], ["--timeout-s inf", "finite"]),
])
def test_seed_and_timeout_out_of_range_exit_2(argv, words, capsys, no_rank_may_start):
    assert train_main([*argv, "--no-progress"]) == 2
    line = one_line(capsys.readouterr().err)
    assert all(w in line for w in words), line


def test_the_largest_seed_and_shortest_timeout_pass_the_rules():
    TrainConfig(seed=2**44 - 1, timeout_s=1.0).validate()
    # the data's generator takes seed * 1000003 + step: under 2**64 at the largest seed
    torch.Generator().manual_seed((2**44 - 1) * 1_000_003 + 10**6)


def test_a_huge_seed_in_a_real_process():
    p = run("minipar.train", "--seed", str(10**25), "--no-progress")
    assert p.returncode == 2 and "--seed" in one_line(p.stderr)


# ---------------------------------------------------------------- generation
def generate(*argv, capsys):
    code = gen.main([*argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_tokenizer_dir_as_help_says_and_a_file(good, tmp_path, capsys):
    own = word_tokenizer(tmp_path / "tokenizer.json", 300)        # fits the 320 ids
    for given in (str(tmp_path), str(own)):
        code, out, err = generate("--init-hf", str(good), "--tokenizer", given, "--prompt",
                                  "w1 w2", "--max-new-tokens", "4", capsys=capsys)
        assert code == 0, err
        assert out.startswith("w1 w2") and len(out.split()) > 2, out


@pytest.mark.parametrize("argv,words", [
    (["--temperature", "nan"], ["--temperature nan", "finite"]),
    (["--temperature", "inf"], ["--temperature inf", "finite"]),
    (["--temperature", "-0.5"], ["--temperature -0.5", ">= 0"]),
    (["--seed", str(2**64)], ["--seed", "2**64"]),
    (["--max-new-tokens", "61"], ["--max-new-tokens 61", "65 positions", "max_seq_len=64"]),
    (["--tokenizer", "/no/such/dir"], ["--tokenizer /no/such/dir", "no such file"]),
])
def test_bad_generation_flags_exit_2(argv, words, good, capsys):
    code, out, err = generate("--init-hf", str(good), "--prompt", "w1 w2 w3 w4", *argv,
                              capsys=capsys)
    line = one_line(err)
    assert code == 2 and out == ""
    assert all(w in line for w in words), line


def test_tokenizer_dir_without_tokenizer_json(good, tmp_path, capsys):
    code, _, err = generate("--init-hf", str(good), "--tokenizer", str(tmp_path), capsys=capsys)
    assert code == 2 and "no tokenizer.json in the directory" in one_line(err)


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(good, tmp_path, capsys):
    big = word_tokenizer(tmp_path / "tokenizer.json", VOCAB + 80)
    code, out, err = generate("--init-hf", str(good), "--tokenizer", str(tmp_path), "--prompt",
                              f"w{VOCAB + 10}", capsys=capsys)
    line = one_line(err)
    assert code == 2 and out == ""
    assert f"tokenizer {big}" in line and f"{VOCAB + 80} tokens" in line
    assert f"vocab_size={VOCAB}" in line


def test_a_prompt_longer_than_max_seq_len_is_refused_before_any_attention(good, capsys):
    t0 = time.monotonic()
    code, out, err = generate("--init-hf", str(good), "--tokenizer", str(good), "--prompt",
                              "w1 " * 100_000, "--max-new-tokens", "5", capsys=capsys)
    line = one_line(err)
    assert code == 2 and out == ""
    assert "100000 tokens" in line and "max_seq_len=64" in line
    assert time.monotonic() - t0 < 20       # a 100000 x 100000 mask would take 10 GB


def test_bytes_past_the_vocabulary_are_refused(tmp_path, capsys):
    small = save(tmp_path / "small", vocab_size=128)
    code, _, err = generate("--init-hf", str(small), "--prompt", "héllo", capsys=capsys)
    assert code == 2 and "vocab_size=128" in one_line(err)


def test_nan_weights_are_one_line_before_sampling(tmp_path):
    path = save(tmp_path / "llama", lambda state: state["norm.weight"].__setitem__(0, math.nan))
    p = run("minipar.generate", "--init-hf", str(path), "--max-new-tokens", "3")
    assert p.returncode == 2 and p.stdout == ""
    assert "weights are not finite" in one_line(p.stderr)
    assert "multinomial" not in p.stderr


def test_logits_that_overflow_stop_generation_in_one_line(tmp_path, capsys):
    path = save(tmp_path / "llama", lambda state: state["lm_head.weight"].fill_(3e38))  # finite
    code, out, err = generate("--init-hf", str(path), "--max-new-tokens", "3", capsys=capsys)
    assert code == 1
    assert "logits at position" in err.strip().splitlines()[-1] and "Traceback" not in err


@pytest.mark.slow
def test_ctrl_c_in_generation_exits_130_in_one_line(tmp_path):
    path = save(tmp_path / "long", max_seq_len=1_000_000)
    proc = subprocess.Popen([sys.executable, "-m", "minipar.generate", "--init-hf", str(path),
                             "--max-new-tokens", "900000", "--temperature", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.read(1)          # the prompt is out: generating
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines()[-1] == "python -m minipar.generate: interrupted"


# ---------------------------------------------------------------- the cost model's numbers
def cost(*argv):
    try:
        return cm.main(list(argv))
    except SystemExit as e:          # argparse's own errors exit from inside parse_args
        return e.code


@pytest.mark.parametrize("argv,words", [
    (["--global-batch-tokens", "1e400"], ["--global-batch-tokens", "'1e400'", "finite"]),
    (["plan", "--gpus", "8", "--global-batch-tokens", "1e400"], ["--global-batch-tokens"]),
    (["plan", "--gpus", "8", "--seq-len", "0"], ["--seq-len 0", "positive integer"]),
    (["plan", "--gpus", "64", "--model", "llama3-8b", "--top", "0"], ["--top 0", "positive"]),
    (["plan", "--gpus", "64", "--model", "llama3-8b", "--top", "-1"], ["--top -1", "positive"]),
    (["--tp", "0"], ["--tp 0", "positive integer"]),
    (["--gpus", "-8"], ["--gpus -8", "positive integer"]),
    (["--peak-tflops", "inf"], ["--peak-tflops inf", "finite"]),
    (["plan", "--gpus", "8", "--inter-node-Gbps", "nan"], ["--inter-node-Gbps nan", "finite"]),
])
def test_cost_model_probes_exit_2_in_one_line(argv, words, capsys):
    assert cost(*argv) == 2
    out, err = capsys.readouterr()
    line = one_line(err)
    assert out == "" and line.startswith("error: ")
    assert all(w in line for w in words), line


def numeric_flags(parser):
    """Each flag of `parser` that takes a number: (flag, a value its rule refuses)."""
    for a in parser._actions:
        if number_problem(a, math.inf if a.type is float else 0):
            yield a.option_strings[0], "inf" if a.type is float else "0"


@pytest.mark.parametrize("command", ["estimate", "plan"])
def test_every_numeric_flag_of_both_commands_has_its_rule(command, capsys):
    """Generated with the flags: every count is a positive integer, every real finite."""
    parser, pre = (build_parser(), []) if command == "estimate" else (build_plan_parser(), ["plan"])
    flags = list(numeric_flags(parser))
    assert {"--gpus", "--seq-len", "--global-batch-tokens"} <= {f for f, _ in flags}
    assert len(flags) >= (20 if command == "estimate" else 15)
    for flag, bad in flags:
        gpus = ["--gpus", "8"] if command == "plan" and flag != "--gpus" else []
        assert cost(*pre, *gpus, flag, bad) == 2, flag
        line = one_line(capsys.readouterr().err)
        assert flag in line and ("positive integer" in line or "finite" in line), line


def test_the_cost_model_probe_in_a_real_process():
    p = run("minipar.costmodel", "--global-batch-tokens", "1e400")
    assert p.returncode == 2 and "--global-batch-tokens" in one_line(p.stderr)
