"""Write shapes.json: every GEMM and transformer-block shape of the published runs (and the
Playbook heatmap's cells), for measure.py to time on a GPU. Run from the repository root."""
import json
import sys
from minipar.plan.costmodel.calibration import published_runs, heatmap_cells
from minipar.plan.costmodel import kernels
runs = published_runs() + [r for r, _ in heatmap_cells()]
layers, gemms = {}, set()
for r in runs:
    m, pc = r.model, r.parallel
    T = r.work.tokens_per_microbatch(pc)
    key = f"{m.name}|tp{pc.tp}|T{T}"
    layers[key] = dict(model=m.name, dim=m.dim, ffn=m.ffn_dim, heads=m.n_heads, kv=m.n_kv_heads,
                       head_dim=m.head_dim, vocab=m.vocab_size, tp=pc.tp, tokens=T,
                       seq=r.work.seq_len // pc.cp, mbs=r.work.microbatch_size)
    lin = dict(kernels.layer_linears(m, pc.tp)); lin["head"] = (m.dim, m.vocab_size / pc.tp)
    for din, dout in lin.values():
        din, dout = int(din), int(dout)
        gemms |= {(T, dout, din), (T, din, dout), (din, dout, T)}
print(f"{len(layers)} block shapes, {len(gemms)} GEMM shapes")
out = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/kernels/shapes.json"
with open(out, "w") as f:
    json.dump({"layers": list(layers.values()), "gemms": sorted(gemms)}, f, indent=0)
