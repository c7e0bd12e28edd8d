"""Issue 43, part A: every directory and file minipar reads is untrusted until checked, and
every check runs before a rank starts (one line naming the flag, file or field; exit 2; no
traceback; nothing left behind; nothing of the user's lost).

Paths inside a Hugging Face directory or a checkpoint stay inside it (`hf.inside`,
`checkpoint.check_files`); the sizes a config.json or a manifest gives are bounded by the
RAM before anything is built (`preflight.check_model_memory`, `check_memory` first);
pickles are unpickled as the ranks would, before them (`checkpoint.check_contents`);
manifests are checked as a whole (`checkpoint.check_manifest`); a failed write leaves no
debris (`hf.save_pretrained`) and a closed pipe ends generation quietly."""
from __future__ import annotations

import errno
import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from minipar.plan.config import ModelConfig
from minipar.runtime import export, hf, preflight
from minipar.runtime import generate as gen
from minipar.runtime.run import main as train_main
from minipar.trainer.model import Transformer

GiB = 2**30
SHORT = ["--steps", "2", "--no-progress"]


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def refused(call, capsys, *words, status=2) -> str:
    """`call()` returns `status` with one `error:` line on stderr holding each of `words`."""
    code = call()
    line = one_line(capsys.readouterr().err)
    assert code == status, line
    assert "error: " in line, line
    for w in words:
        assert w in line, (w, line)
    return line


@pytest.fixture
def four_gib(monkeypatch):
    """A machine with 4 GiB free (the issue's memory limit), whatever this one has."""
    for module in (preflight, hf):
        monkeypatch.setattr(module, "available_ram", lambda: 4 * GiB)


# ------------------------------------------------------------ a Hugging Face directory
def save_hf(path, **model):
    mcfg = ModelConfig(**{"n_layers": 2, "vocab_size": 256, "max_seq_len": 2048, **model})
    hf.save_pretrained(Transformer(mcfg, seed=0).state_dict(), mcfg, str(path))
    return path


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return save_hf(tmp_path_factory.mktemp("hf") / "llama")


@pytest.fixture
def outside(good, tmp_path):
    """`tmp_path/llama`, a copy of `good` whose weights lie in `tmp_path/outside`."""
    path = shutil.copytree(good, tmp_path / "llama")
    (tmp_path / "outside").mkdir()
    shutil.move(path / hf.WEIGHTS, tmp_path / "outside" / hf.WEIGHTS)
    return path


def index_to(path, file: str):
    """An index whose weight_map sends every weight of `path`'s model to `file`."""
    names = Transformer(hf.read_config(str(path)), seed=None).state_dict()
    (path / hf.INDEX).write_text(json.dumps({"weight_map": {hf.hf_name(n): file for n in names}}))


def train_and_generate_refuse(path, capsys, *words):
    """`train --init-hf path` (no rank started) and `generate --init-hf path` both exit 2 in
    one line holding `words`."""
    refused(lambda: train_main(["--init-hf", str(path), *SHORT]), capsys, *words)
    refused(lambda: gen.main(["--init-hf", str(path), "--max-new-tokens", "2"]), capsys, *words)


def test_an_index_naming_a_file_outside_is_refused(outside, capsys, no_rank_may_start):
    index_to(outside, "../outside/model.safetensors")
    train_and_generate_refuse(outside, capsys, f"--init-hf {outside}",
                              "'../outside/model.safetensors' is not a name inside the directory")


def test_an_index_naming_an_absolute_path_is_refused(outside, capsys, no_rank_may_start):
    far = str(outside.parent / "outside" / hf.WEIGHTS)
    index_to(outside, far)
    train_and_generate_refuse(outside, capsys, f"{far!r} is not a name inside the directory")


@pytest.mark.parametrize("indexed", [False, True], ids=["single file", "shard of an index"])
def test_a_shard_that_links_out_of_the_directory_is_refused(indexed, outside, capsys,
                                                            no_rank_may_start):
    shard = "model-00001-of-00001.safetensors" if indexed else hf.WEIGHTS
    os.symlink(outside.parent / "outside" / hf.WEIGHTS, outside / shard)
    if indexed:
        index_to(outside, shard)
    train_and_generate_refuse(outside, capsys, f"--init-hf {outside / shard} is a link to "
                              f"{outside.parent / 'outside' / hf.WEIGHTS}, outside the directory")


@pytest.mark.parametrize("name", [hf.CONFIG, "tokenizer.json"])
def test_a_config_or_tokenizer_that_links_out_is_refused(name, good, tmp_path, capsys,
                                                         no_rank_may_start):
    path = shutil.copytree(good, tmp_path / "llama")
    (tmp_path / "elsewhere").mkdir()
    source = path / name if name == hf.CONFIG else good / hf.CONFIG   # any file will do
    shutil.copy(source, tmp_path / "elsewhere" / name)
    (path / name).unlink(missing_ok=True)
    os.symlink(tmp_path / "elsewhere" / name, path / name)
    train_and_generate_refuse(path, capsys, f"{path / name} is a link to", "outside the directory")


def test_the_hugging_face_cache_layout_still_reads(good, tmp_path):
    """A snapshot of the Hugging Face cache is links into the model's `blobs`: allowed."""
    model = tmp_path / "models--x--y"
    blobs, snapshot = model / "blobs", model / "snapshots" / "abc"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for name in (hf.CONFIG, hf.WEIGHTS):
        digest = hashlib.sha256((good / name).read_bytes()).hexdigest()
        shutil.copy(good / name, blobs / digest)
        os.symlink(os.path.join("..", "..", "blobs", digest), snapshot / name)
    mcfg = hf.read_config(str(snapshot))
    hf.check_dir(str(snapshot), mcfg)
    assert gen.load_model(str(snapshot)).cfg == mcfg


# ------------------------------------------------------------ sizes bounded before building
def test_a_config_of_100_million_layers_is_refused_before_anything_is_built(
        good, tmp_path, capsys, four_gib, no_rank_may_start, monkeypatch):
    path = shutil.copytree(good, tmp_path / "llama")
    cfg = json.loads((path / hf.CONFIG).read_text())
    (path / hf.CONFIG).write_text(json.dumps({**cfg, "num_hidden_layers": 100_000_000}))

    def build(*a, **k):
        raise AssertionError("a model was built before its size was checked")
    monkeypatch.setattr(hf, "Transformer", build)
    monkeypatch.setattr(gen, "Transformer", build)
    train_and_generate_refuse(path, capsys, f"--init-hf {path}/config.json", "100,000,000 layers",
                              "but 4.0 GiB is available")


# ------------------------------------------------------------ a checkpoint
@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A 4-rank checkpoint (tp 2 x dp 2) of the tiny model, step 1."""
    root = tmp_path_factory.mktemp("ckpt") / "run"
    assert train_main(["--tp", "2", "--dp", "2", "--steps", "1", "--save", str(root),
                       "--no-progress"]) == 0
    return root / "step_000001"


@pytest.fixture
def ckpt(saved, tmp_path):
    """A private copy of the checkpoint, to damage."""
    return shutil.copytree(saved, tmp_path / "step_000001")


def edit_manifest(step_dir, change):
    path = step_dir / "manifest.json"
    m = json.loads(path.read_text())
    change(m)
    path.write_text(json.dumps(m))
    return m


def replace_file(step_dir, name, obj):
    """Put `obj` (torch.save'd) in the checkpoint as `name`, its size and SHA-256 in the
    manifest: a crafted checkpoint, not a corrupt one."""
    (step_dir / name).write_bytes(data := export.checkpoint._torch_bytes(obj))
    edit_manifest(step_dir, lambda m: m["files"][name].update(
        bytes=len(data), sha256=hashlib.sha256(data).hexdigest()))


def resume(step_dir, *more):
    return lambda: train_main(["--resume", str(step_dir), "--tp", "2", "--dp", "2", *more, *SHORT])


def export_to(step_dir, out):
    return lambda: export.main(["--resume", str(step_dir), "--out", str(out)])


def generate_from(step_dir):
    return lambda: gen.main(["--resume", str(step_dir), "--max-new-tokens", "2"])


def all_three_refuse(step_dir, tmp_path, capsys, *words):
    """train --resume (no rank), export and generate each exit 2 in one line holding
    `words`; the export wrote nothing."""
    refused(resume(step_dir), capsys, *words)
    refused(export_to(step_dir, tmp_path / "out"), capsys, *words)
    refused(generate_from(step_dir), capsys, *words)
    assert not os.path.exists(tmp_path / "out") and not glob.glob(f"{tmp_path}/out.tmp*")


def test_a_manifest_claiming_70b_is_refused_before_allocating(ckpt, tmp_path, capsys, four_gib):
    llama70b = dict(n_layers=80, dim=8192, n_heads=64, n_kv_heads=8, ffn_dim=28672,
                    vocab_size=128256, max_seq_len=8192)
    edit_manifest(ckpt, lambda m: m["model"].update(llama70b))
    for call in (generate_from(ckpt), export_to(ckpt, tmp_path / "out")):
        refused(call, capsys, f"--resume {ckpt}", "80 layers", "B parameters",
                "but 4.0 GiB is available")


class Payload:
    """What a crafted pickle runs when loaded without weights_only: makes a directory."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


@pytest.mark.parametrize("name", ["rank_00001.pt", "rng.pt"])
def test_a_crafted_pickle_is_one_line_before_the_ranks(name, ckpt, tmp_path, capsys,
                                                       no_rank_may_start):
    marker = str(tmp_path / "pwned")
    replace_file(ckpt, name, {"rank": 1, "entries": [Payload(marker)]} if name != "rng.pt"
                 else [Payload(marker)] * 4)
    all_three_refuse(ckpt, tmp_path, capsys, f"checkpoint file {ckpt / name} is refused: its "
                     "pickle is not plain data (", "GLOBAL posix.mkdir", "a crafted or foreign")
    assert not os.path.exists(marker)


def test_a_layout_edited_to_more_ranks_than_files_is_named(ckpt, tmp_path, capsys,
                                                           no_rank_may_start):
    edit_manifest(ckpt, lambda m: m["layout"].update(dp=4))
    all_three_refuse(ckpt, tmp_path, capsys, "`layout` tp=2 x cp=1 x pp=1 x dp=4 is 8 ranks, "
                     "but `world_size` is 4")
    refused(resume(ckpt, "--dp", "4"), capsys, "`layout`")    # the layout it claims: the same


def test_an_entry_without_names_is_named(ckpt, tmp_path, capsys, no_rank_may_start):
    edit_manifest(ckpt, lambda m: m["files"]["rank_00002.pt"].pop("names"))
    all_three_refuse(ckpt, tmp_path, capsys, "`files.rank_00002.pt.names` is missing")


def test_an_unknown_model_field_is_named(ckpt, tmp_path, capsys, no_rank_may_start):
    edit_manifest(ckpt, lambda m: m["model"].update(n_experts=8))
    all_three_refuse(ckpt, tmp_path, capsys, "`model.n_experts` is not a field of minipar's model")


def test_a_model_field_of_the_wrong_type_is_named(ckpt, tmp_path, capsys, no_rank_may_start):
    edit_manifest(ckpt, lambda m: m["model"].update(dim="64"))
    all_three_refuse(ckpt, tmp_path, capsys, "`model.dim` is '64', not an integer")


def test_a_manifest_whose_model_the_tensors_contradict_is_refused(ckpt, tmp_path, capsys):
    """dim=128 over 64-wide tensors: no config.json that disagrees with the weights."""
    edit_manifest(ckpt, lambda m: m["model"].update(dim=128))
    refused(export_to(ckpt, tmp_path / "out"), capsys, "rank_00000.pt: embed_tokens.weight is "
            "[256, 64] in the file (tp_size 2), the manifest's model makes it [256, 128] (tp 2)")
    assert not os.path.exists(tmp_path / "out") and not glob.glob(f"{tmp_path}/out.tmp*")
    refused(generate_from(ckpt), capsys, "the manifest's model makes it [256, 128]")


def test_slices_that_leave_elements_uncovered_are_named(ckpt, tmp_path, capsys):
    data = torch.load(ckpt / "rank_00000.pt", weights_only=True)
    e = data["entries"][0]
    e.update(stop=e["stop"] - 1, param=e["param"][:-1], exp_avg=e["exp_avg"][:-1],
             exp_avg_sq=e["exp_avg_sq"][:-1])
    replace_file(ckpt, "rank_00000.pt", data)
    refused(export_to(ckpt, tmp_path / "out"), capsys, "embed_tokens.weight: 1 of its elements "
            "(TP shard 0) are in no file")


def test_a_slice_whose_tensor_is_not_its_range_is_named(ckpt, tmp_path, capsys):
    data = torch.load(ckpt / "rank_00000.pt", weights_only=True)
    data["entries"][1]["exp_avg"] = data["entries"][1]["exp_avg"][:3]
    replace_file(ckpt, "rank_00000.pt", data)
    refused(export_to(ckpt, tmp_path / "out"), capsys, "rank_00000.pt: ",
            "its tensors are not its elements 0:", "or AdamW's state is incomplete")


def test_a_rank_file_that_links_out_of_the_checkpoint_is_refused(ckpt, tmp_path, capsys,
                                                                 no_rank_may_start):
    away = tmp_path / "away.pt"
    shutil.move(ckpt / "rank_00003.pt", away)
    os.symlink(away, ckpt / "rank_00003.pt")
    all_three_refuse(ckpt, tmp_path, capsys, f"checkpoint file {ckpt / 'rank_00003.pt'} is a "
                     f"link to {away}, outside the checkpoint")


def test_a_manifest_file_name_with_dots_is_refused(ckpt, tmp_path, capsys, no_rank_may_start):
    edit_manifest(ckpt, lambda m: m["files"].update({"..": m["files"]["rng.pt"]}))
    all_three_refuse(ckpt, tmp_path, capsys, "`files` names '..', not a file of the checkpoint")


# ------------------------------------------------------------ writes that fail
def full_disk(*a, **k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "model.safetensors")


def test_export_on_a_full_disk_is_one_line_and_leaves_nothing(saved, tmp_path, capsys,
                                                              monkeypatch):
    out = tmp_path / "hf"
    assert export.main(["--resume", str(saved), "--out", str(out)]) == 0      # an older export
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(hf, "save_file", full_disk)
    line = refused(export_to(saved, out), capsys, status=1)
    assert f"--out {out}: could not write " in line and "model.safetensors: No space left on " \
        f"device; {out} is as it was" in line
    assert sorted(os.listdir(tmp_path)) == ["hf"]          # no hf.tmp<pid>, no .old
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_export_hf_on_a_full_disk_is_refused_before_the_run(tmp_path, capsys, monkeypatch,
                                                            no_rank_may_start):
    real = shutil.disk_usage
    monkeypatch.setattr(preflight.shutil, "disk_usage",
                        lambda p: real(p)._replace(free=1000))
    refused(lambda: train_main(["--export-hf", str(tmp_path / "hf"), *SHORT]), capsys,
            f"--export-hf {tmp_path / 'hf'} needs ", "MiB on the disk of", "0.0 MiB free")


@pytest.mark.slow
def test_export_hf_that_fails_in_the_run_leaves_no_debris(tmp_path, capfd, monkeypatch):
    """The disk fills during the run: rank 0's write fails; its directory is removed and
    the run ends with one line naming the file (every rank raised it), exit 1."""
    monkeypatch.setattr(hf, "save_file", full_disk)      # the forked rank inherits it
    out = tmp_path / "hf"
    assert train_main(["--export-hf", str(out), "--steps", "1", "--no-progress"]) == 1
    err = capfd.readouterr().err.strip()
    assert "could not write" in err and "No space left on device" in err, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert os.listdir(tmp_path) == []


def test_generate_into_a_closed_pipe_ends_quietly(good, tmp_path):
    """`generate | head -c 20`: head reads 20 bytes and goes; generation ends at its next
    write, without a BrokenPipeError traceback."""
    gen_p = subprocess.Popen([sys.executable, "-m", "minipar.generate", "--init-hf", str(good),
                              "--prompt", "a prompt longer than twenty bytes ",
                              "--max-new-tokens", "1500", "--temperature", "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = subprocess.run(["head", "-c", "20"], stdin=gen_p.stdout, capture_output=True,
                          timeout=60)
    gen_p.stdout.close()        # head's end alone holds the pipe now: it has gone
    err = gen_p.stderr.read().decode()
    assert gen_p.wait(timeout=60) == 128 + signal.SIGPIPE, err
    assert head.stdout == b"a prompt longer than"
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception" not in err, err
