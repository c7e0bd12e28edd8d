"""The published runs the cost model is evaluated on, read into the model's own objects.

Chapter "Four dimensions at once". `data/published_runs.csv` is a copy of the project's
`calibration/published_runs.csv` (sources in its header: Llama 3's Table 4 and the
Ultra-Scale Playbook's best configuration per model size and node count). Each row becomes
the four things `estimate` takes: a model, a layout, a cluster and a batch. Other published
tables are held back to test the model, and nothing is fitted on any of them. Each row names
the framework that ran it (`frameworks`): its behaviours are an input. The Playbook's
heatmap has more cells than the evaluation file holds (`data/playbook_heatmap.csv`, every
cell with the memory it printed): `evaluate` reports on those too.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

from .. import flops
from ..config import ModelConfig, ParallelConfig
from .constants import LLAMA3_EFFICIENCY, Efficiency
from .untrusted import reads_data
from .frameworks import Framework, apply, framework
from .gpus import gpu_cluster
from .hardware import LLAMA3_CLUSTER, Cluster
from .scenario import Scenario
from .workload import Workload, layout_problems
from ..memory import BF16_MIXED, Precision

RUNS_FILE = Path(__file__).parent / "data" / "published_runs.csv"
# Every cell of the Playbook's heatmap, with the memory it printed: the cells that are not
# evaluation rows are predicted too (`evaluate`).
HEATMAP_FILE = Path(__file__).parent / "data" / "playbook_heatmap.csv"
# Every run of the Playbook's interactive figure: the MFU and tokens/s each printed. It
# shows which FLOPs the Playbook's MFU counts (`playbook_mfu_ratios`).
PLAYBOOK_RUNS_FILE = Path(__file__).parent / "data" / "playbook_runs.csv"
# NVIDIA's published NeMo recipes on H100 with their measured tokens/s: the second source
# the model is evaluated on (`nemo_runs`).
NEMO_FILE = Path(__file__).parent / "data" / "nemo_recipes.csv"
# The Playbook's cluster: bench_cluster's Slurm templates run from /fsx (Amazon FSx for
# Lustre) on partition "hopper-prod", AWS p5.48xlarge servers (8 H100 SXM each), whose
# fabric is EFA: collectives across servers are timed by nccl-tests on p5 (`constants`).
PLAYBOOK_CLUSTER = replace(gpu_cluster("h100"), name="ultrascale playbook (AWS p5, EFA)", fabric="efa")
# What the Playbook divides by (bench_cluster's report.py: 1979 / 2), not the data sheet's
# 989.4: minipar's MFU of its runs uses the same peak, so that a ratio shows the FLOP count.
PLAYBOOK_PEAK_TFLOPS = 989.5

# The Playbook's models (nanotron's Llama with full multi-head attention and a 131,072-token
# vocabulary; the two small ones tie their embeddings). Their shapes are those of Llama 3.2
# 1B / 3B and Llama 3.1 8B / 70B with n_kv_heads = n_heads; each reproduces the parameter
# count the Playbook prints to three digits (`test_playbook_shapes_match_their_names`).
# Checked, not guessed: the benchmark tool behind the Playbook's sweep (bench_cluster) sets
# "num_attention_heads = num_key_value_heads for all models <=> using MHA", and nanotron
# asserts that TP divides the KV heads, which the TP16 row could not pass with 8 of them.
# How the rows ran, as nanotron does it: its default `pp_engine: 1f1b` (the schedule column),
# layers cut into stages by its cost rule (`workload.nanotron_split`), gradients all-reduced
# in 25 MB DDP buckets (ZeRO-0) or reduce-scattered and gathered (ZeRO-1), TP with sequence
# parallelism and no overlap modelled (its async all-gather is a known uncertainty).
# The FLOP convention, measured: the Playbook's MFU is not minipar's (PaLM's 6 N + 12 L h s,
# the embedding lookup not a matmul). Over the 1,751 runs of its interactive figure
# (`data/playbook_runs.csv`) the printed MFU is tokens/s x minipar's FLOPs per token / peak
# times 1 + 6 h V / F whenever the input embedding is a table of its own (untied, or tied
# but on another pipeline stage than the head): it counts the lookup as a matmul.
# `playbook_flops_ratio` undoes that, so every row is compared in one count. Llama 3's
# paper does not spell out its count; its rows are taken as printed.
PLAYBOOK_MODELS = {
    "1.34B": ModelConfig(n_layers=16, dim=2048, n_heads=32, n_kv_heads=32, ffn_dim=8192,
                         vocab_size=131072, max_seq_len=4096, tie_embeddings=True, name="1.34B"),
    "3.57B": ModelConfig(n_layers=28, dim=3072, n_heads=24, n_kv_heads=24, ffn_dim=8192,
                         vocab_size=131072, max_seq_len=4096, tie_embeddings=True, name="3.57B"),
    "8.86B": ModelConfig(n_layers=32, dim=4096, n_heads=32, n_kv_heads=32, ffn_dim=14336,
                         vocab_size=131072, max_seq_len=4096, name="8.86B"),
    "80B": ModelConfig(n_layers=80, dim=8192, n_heads=64, n_kv_heads=64, ffn_dim=28672,
                       vocab_size=131072, max_seq_len=4096, name="80B"),
}


@dataclass(frozen=True)
class PublishedRun:
    """One row of the evaluation file: what ran, under which framework, and the MFU its
    authors measured."""

    source: str
    model: ModelConfig
    parallel: ParallelConfig
    cluster: Cluster
    work: Workload
    mfu: float              # in minipar's FLOP count (`minipar.plan.flops`): what is compared
    printed_mfu: float      # as the source prints it
    framework: str = "nanotron"
    note: str = ""
    precision: Precision = BF16_MIXED
    efficiency: Efficiency = LLAMA3_EFFICIENCY

    @property
    def scenario(self) -> Scenario:
        """The step this run took, as `estimate` predicts one."""
        return Scenario(self.model, self.parallel, self.cluster, self.work, self.precision,
                        self.efficiency)

    @property
    def label(self) -> str:
        p = self.parallel
        return (f"{self.model.name} {p.world_size} GPUs TP{p.tp} CP{p.cp} PP{p.pp} DP{p.dp}"
                f" seq {self.work.seq_len}")


def playbook_flops_ratio(model: ModelConfig, pp: int, seq_len: int) -> float:
    """The Playbook's MFU over minipar's for the same run: 1 + 6 h V / F (F: minipar's FLOPs
    per token) when the input embedding is a table of its own, which the Playbook counts as
    a matmul; 1 when it is the head's own weight on the same stage (tied, one stage)."""
    if model.tie_embeddings and pp == 1:
        return 1.0
    return 1.0 + 6.0 * model.dim * model.vocab_size / flops.flops_per_token(model, seq_len)


# Below 5% MFU the figure's 0.1-point rounding blurs a ratio of two MFUs.
MFU_FLOOR = 0.05


@reads_data
def playbook_mfu_ratios(path: Path = PLAYBOOK_RUNS_FILE, floor: float = MFU_FLOOR):
    """(model, pp, printed MFU / minipar's MFU from the printed tokens/s) of every run of the
    Playbook's figure at `floor` MFU or more (below, 0.1-point rounding blurs the ratio)."""
    out = []
    for row in _rows(path):
        model, pp = PLAYBOOK_MODELS[row["model"]], int(row["pp"])
        ours = flops.mfu(float(row["tokens_per_s_per_gpu"]), model, 4096, PLAYBOOK_PEAK_TFLOPS * 1e12)
        if ours >= floor:
            out.append((model, pp, float(row["mfu_percent"]) / 100 / ours))
    return out


def flop_count_agreement(tol: float, corrected: bool = True) -> float:
    """Share of the Playbook figure's runs whose printed MFU matches minipar's count within
    `tol` (relative), after `playbook_flops_ratio` (`corrected`) or as printed."""
    ratios = playbook_mfu_ratios()
    return sum(abs(ratio / (playbook_flops_ratio(m, pp, 4096) if corrected else 1.0) - 1) < tol
               for m, pp, ratio in ratios) / len(ratios)


@reads_data
def playbook_runs(path: Path = PLAYBOOK_RUNS_FILE, floor: float = MFU_FLOOR) -> list[PublishedRun]:
    """The Playbook figure's runs at `floor` MFU or more (in minipar's count) that minipar's
    shapes can run (a few use a TP degree that does not divide the heads), each as a
    `PublishedRun`: all the layouts tried for one model on one cluster size, to rank."""
    out = []
    for row in _rows(path):
        run = _run({"source": "ultrascale-playbook-figure", "model": row["model"], "tp": row["tp"],
                    "cp": "1", "pp": row["pp"], "dp": row["dp"], "zero": row["zero"],
                    "gas": row["gas"], "mbs": row["mbs"], "seq_len": "4096",
                    "global_batch_seqs": row["gbs"], "schedule": "1f1b",
                    "mfu": str(float(row["mfu_percent"]) / 100)})
        if run.mfu >= floor and not layout_problems(run.model, run.parallel, run.work):
            out.append(run)
    return out


def _model(name: str) -> ModelConfig:
    return PLAYBOOK_MODELS[name] if name in PLAYBOOK_MODELS else ModelConfig.preset(name)


def _layout(row: dict, **rest) -> tuple[ParallelConfig, int, int, int]:
    """(layout, sequence length, sequences per step, micro-batch size) of a row of any of the
    evaluation files: its degrees, sequence parallelism where tp > 1, the batch cut into
    micro-batches of `mbs` sequences (1 where the row leaves it empty) per DP rank; `rest`
    the layout's other fields, as each file's runs set them."""
    tp, cp, pp, dp = (int(row[k]) for k in ("tp", "cp", "pp", "dp"))
    seq, batch, mbs = int(row["seq_len"]), int(row["global_batch_seqs"]), int(row["mbs"] or 1)
    pc = ParallelConfig(tp=tp, cp=cp, pp=pp, dp=dp, sp=tp > 1, microbatches=batch // (dp * mbs),
                        **rest)
    return pc, seq, batch, mbs


def _run(row: dict) -> PublishedRun:
    """A CSV row as a `PublishedRun`. Llama 3's rows leave ZeRO, micro-batches and
    micro-batch size empty: its paper's FSDP is ZeRO-1-like, one sequence per micro-batch,
    8 model chunks per rank (126 layers + embedding + head on 16 x 8 stages)."""
    llama3 = row["source"].startswith("llama3")
    pc, seq, batch, mbs = _layout(row, zero=int(row["zero"] or 1), tp_overlap=False,
                                  schedule=row["schedule"], cp_impl="allgather",
                                  virtual_stages=8 if row["schedule"] == "interleaved" else 1)
    name = row.get("framework") or ("llama3" if llama3 else "nanotron")
    pc, precision, eff = apply(framework(name), _model(row["model"]), pc)
    cluster = LLAMA3_CLUSTER if llama3 else PLAYBOOK_CLUSTER
    split = "trainer" if llama3 else "nanotron"  # Llama 3's split (`table4.PAPER_SPLIT`); nanotron's own rule
    model, printed = _model(row["model"]), float(row["mfu"])
    ratio = 1.0 if llama3 else playbook_flops_ratio(model, pc.pp, seq)
    return PublishedRun(row["source"], model, pc, cluster,
                        Workload(seq, batch, mbs, stage_split=split), printed / ratio, printed,
                        name, row.get("note") or "", precision, eff)


# Published peak memory per GPU with the runs that printed it (torchtitan's tables, the
# Playbook's allocated figures): `memory_rows`, compared by `evaluate.memory_comparison`.
MEMORY_FILE = Path(__file__).parent / "data" / "published_memory.csv"
GIB = 2 ** 30 / 1e9       # GB (1e9 bytes, the model's unit) in one GiB (what torch's counters print)
# torchtitan's published runs: Grand Teton hosts of 8 H100 with 96 GB of HBM2e at 2.4 TB/s,
# 400 Gb/s RDMA per GPU (its benchmarks/llama3_h100_202412_torchtitan.md). No data sheet in
# `datasheets` has this part: the H100's row with its memory replaced.
TORCHTITAN_CLUSTER = replace(gpu_cluster("h100", hbm_gb=96.0, hbm_TBps=2.4),
                             name="torchtitan Grand Teton (H100 96 GB HBM2e)")


# NVIDIA's recipes ran on DGX H100 SuperPODs: eight H100 SXM and eight 400 Gb/s InfiniBand
# NDR rails per server, a full fat tree (NVIDIA's DGX SuperPOD reference architecture: no
# oversubscription between the scalable units).
NEMO_CLUSTER = replace(gpu_cluster("h100"), name="DGX H100 SuperPOD (InfiniBand NDR)",
                       pod_oversubscription=1.0)
NEMO_MLP = {"swiglu": "swiglu", "gelu": "gelu", "squared-relu": "relu2"}
# Shapes the CSV does not carry, from each recipe's model config: GPT-3 ties its output
# layer to the embedding (NeMo's megatron_gpt_config.yaml, share_embeddings_and_output_weights:
# True); Llama 3.1 and Nemotron-4 keep two tables.
NEMO_TIED = {"gpt3-175b"}
# What each recipe's yaml sets beyond the CSV's columns (dgxc-benchmarking at 35a9aec):
# optim.bucket_cap_mb, ub_tp_comm_overlap, overlap_p2p_comm (with interleaving; Nemotron-4
# batches its sends instead, batch_p2p_comm: true).
# And ub_tp_comm_overlap_cfg: the SMs its pipelined reduce-scatters hold (set_sm_margin: 1)
# beside the attention projection's (proj_fprop, "o") and the MLP's down projection's
# (fc2_fprop, "down") forward GEMMs; Nemotron-4 15B's yaml sets none (Transformer Engine's
# defaults, no margin assumed).
NEMO_RECIPES = {
    "llama3.1/README_8b.md":        dict(bucket=75.0, tp_overlap=False, p2p_overlap=True, sms=()),
    "llama3.1/README_70b.md":       dict(bucket=75.0, tp_overlap=True, p2p_overlap=True,
                                         sms=(("o", 24), ("down", 16))),
    "llama3.1/README_405b.md":      dict(bucket=125.0, tp_overlap=True, p2p_overlap=True,
                                         sms=(("o", 24), ("down", 8))),
    "nemo_megatron/README_175b.md": dict(bucket=220.0, tp_overlap=True, p2p_overlap=True,
                                         sms=(("o", 24), ("down", 20))),
    "nemotron/README_15b.md":       dict(bucket=100.0, tp_overlap=True, p2p_overlap=False, sms=()),
    "nemotron/README_340b.md":      dict(bucket=50.0, tp_overlap=False, p2p_overlap=False, sms=()),
}


def nemo_framework(file: str) -> Framework:
    """The nemo profile with one recipe's own bucket, TP overlap, p2p overlap and SMs held
    by the overlapped reduce-scatters."""
    knobs = dict(NEMO_RECIPES[file])
    fw = framework("nemo")
    return replace(fw, bucket=knobs["bucket"], tp_overlap=knobs["tp_overlap"],
                   kernels=replace(fw.kernels, p2p_overlap=knobs["p2p_overlap"],
                                   tp_comm_sms=knobs["sms"]))


def nemo_model(row: dict) -> ModelConfig:
    """The model of one recipe, from its row's shape columns."""
    return ModelConfig(n_layers=int(row["layers"]), dim=int(row["hidden"]), n_heads=int(row["heads"]),
                       n_kv_heads=int(row["kv_heads"]), ffn_dim=int(row["ffn"]),
                       vocab_size=int(row["vocab"]), max_seq_len=int(row["seq_len"]),
                       mlp=NEMO_MLP[row["mlp"]], tie_embeddings=row["model"] in NEMO_TIED,
                       name=row["model"])


def nemo_run(row: dict) -> PublishedRun:
    """One NeMo recipe as a `PublishedRun` under the nemo profile with the recipe's own knobs
    (`nemo_framework`): its layout as the recipe's yaml gives it, sequence parallelism where tp > 1, Megatron's ring (p2p) context
    parallelism, layers dealt evenly to pp x v model chunks with the head on the last rank
    ("trainer" split). The MFU is counted from the measured tokens/s in minipar's count
    (the README's own MFU uses the recipe's FLOP count)."""
    model = nemo_model(row)
    pc, seq, batch, mbs = _layout(row, zero=1, schedule=row["schedule"], cp_impl="ring",
                                  virtual_stages=int(row["virtual_stages"]))
    pc, precision, eff = apply(nemo_framework(row["file"]), model, pc)
    mfu = flops.mfu(float(row["tokens_per_s_total"]), model, seq, NEMO_CLUSTER.peak_flops,
                    int(row["gpus"]))
    return PublishedRun(row["source"], model, pc, NEMO_CLUSTER,
                        Workload(seq, batch, mbs, row["recompute"], stage_split="trainer"),
                        mfu, float(row["printed_mfu_pct"]) / 100, "nemo", "",
                        precision, eff)


@reads_data
def nemo_runs(path: Path = NEMO_FILE) -> list[PublishedRun]:
    """Every recipe of the NeMo evaluation file, in its order."""
    return [nemo_run(row) for row in _rows(path)]


def _rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


@reads_data
def published_runs(path: Path = RUNS_FILE) -> list[PublishedRun]:
    """Every row of the evaluation file, in its order."""
    return [_run(row) for row in _rows(path)]


@reads_data
def heatmap_cells(path: Path = HEATMAP_FILE) -> list[tuple[PublishedRun, float]]:
    """Every cell of the Playbook's heatmap: the run, and the GB per GPU it printed."""
    return [(_run(row), float(row["memory_gb"])) for row in _rows(path)]


def held_out_runs() -> list[PublishedRun]:
    """The heatmap's cells that are not rows of the evaluation file."""
    rows = {run.label for run in published_runs()}
    return [run for run, _ in heatmap_cells() if run.label not in rows]


@dataclass(frozen=True)
class MemoryRow:
    """One published peak-memory figure: the run, and what its source printed."""

    run: PublishedRun
    ref: str                # the source's table and row (or job)
    measured: str           # the allocator statistic: "reserved" or "allocated"
    published_gib: float    # as printed (GiB, whatever the label says)
    float8: bool = False    # Float8 linears: the model counts bf16

    @property
    def published_gb(self) -> float:
        return self.published_gib * GIB


def torchtitan_run(row: dict) -> PublishedRun:
    """One row of torchtitan's tables as a `PublishedRun` under the torchtitan profile: its
    layout (FSDP = ZeRO-3 without PP, `frameworks.TORCHTITAN`), its batch cut into
    `global_batch_seqs / (dp x mbs)` micro-batches of `mbs` sequences, its recompute mode,
    layers dealt evenly to pp x v stages, CP by all-gather. It printed no MFU (0 here)."""
    model = _model(row["model"])
    pc, seq, batch, mbs = _layout(row, zero=int(row["zero"] or 1), schedule=row["schedule"],
                                  cp_impl="allgather", virtual_stages=int(row["virtual_stages"]))
    pc, precision, eff = apply(framework(row["framework"]), model, pc)
    return PublishedRun(row["source"], model, pc, TORCHTITAN_CLUSTER,
                        Workload(seq, batch, mbs, row["recompute"]), 0.0, 0.0,
                        row["framework"], "", precision, eff)


def memory_run(row: dict) -> PublishedRun:
    """A row of the memory file as the run that printed it: nanotron's as the heatmap's own
    cells are built (`_run`, the same layouts), torchtitan's by `torchtitan_run`."""
    if row["framework"] == "nanotron":
        return _run({**row, "gas": "", "mfu": "0", "note": ""})
    return torchtitan_run(row)


@reads_data
def memory_rows(path: Path = MEMORY_FILE) -> list[MemoryRow]:
    """Every published peak-memory figure: the Playbook heatmap's cells (max_memory_reserved,
    `heatmap_cells`), then each row of the memory file (torchtitan's tables, the Playbook's
    allocated figures), in order."""
    out = [MemoryRow(run, "heatmap cell", "reserved", gib) for run, gib in heatmap_cells()]
    out += [MemoryRow(memory_run(row), row["ref"], row["measured"], float(row["memory_gib"]),
                      row["float8"] == "1") for row in _rows(path)]
    return out
