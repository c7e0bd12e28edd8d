"""The GPUs' data sheets: what each one computes, stores and sends, as its vendor says.

Chapter "One model, sixteen thousand GPUs" (the H100's peak is the first number the book
divides by). One table, read by everything that needs a GPU's numbers: the denominator of
the trainer's MFU (`minipar.runtime.peak`), the cost model's clusters (`costmodel.gpus`,
`costmodel.hardware`) and the book. Torch-free.

Peaks are dense (no 2:4 sparsity), tensor cores for bf16 and tf32, FLOP/s per GPU. Memory is
counted in GB of 1e9 bytes: an "80 GB" card holds 80 GiB = 85.9 GB (nvidia-smi: 81,559 MiB).
Bandwidths are per GPU and per direction (NVLink 4: 900 GB/s both ways = 450 each way). The
wiring fields (NVLink, the NIC, GPUs per server) are those of the GPU's usual 8-GPU server;
a card sold for PCIe slots leaves them (and its memory) unset: the cost model does not wire it.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class DataSheet:
    """One GPU as its data sheet gives it."""

    name: str                            # what torch.cuda.get_device_name() contains
    bf16_tflops: float                   # dense tensor-core peak, TFLOP/s
    tf32_tflops: float
    fp32_tflops: float                   # without tensor cores
    source: str
    hbm_gb: float | None = None          # GB (1e9 bytes)
    hbm_TBps: float | None = None
    nvlink_GBps: float | None = None     # per GPU, per direction
    nic_Gbps: float | None = None        # one NIC per GPU
    gpus_per_server: int | None = None
    sms: int | None = None               # streaming multiprocessors

    def peak_flops(self, dtype: str = "bf16") -> float:
        """FLOP/s of one GPU computing in `dtype` ("bf16", "tf32" or "fp32")."""
        return {"bf16": self.bf16_tflops, "tf32": self.tf32_tflops, "fp32": self.fp32_tflops}[dtype] * 1e12


# Matched against a device's name in this order, so the more specific names first ("H100 PCIe"
# before "H100", "L40S" before "L4"; a GH200's name contains "H200"). The H100 SXM's 989.4 TFLOP/s
# is 132 SMs x 4,096 dense bf16 FLOP per clock x 1,830 MHz (often rounded to 989, or to 989.5
# as half of the 1,979 with sparsity); the H200 is the same die and clocks with more memory.
SHEETS: dict[str, DataSheet] = {s.name: s for s in (
    DataSheet("H100 PCIe", 756.0, 378.0, 51.0, "NVIDIA H100 PCIe data sheet"),
    DataSheet("H100", 989.4, 494.7, 66.9, "NVIDIA H100 whitepaper, SXM5; NVLink 4; ConnectX-7 400 Gb/s", 85.9, 3.35, 450.0, 400.0, 8, 132),
    # The H800 SXM (DeepSeek-V3's GPU): the H100 SXM's die and clocks, NVLink cut to 400 GB/s
    # both ways ("reduced from 900 GB/s to 400 GB/s", DeepSeek, "Insights into DeepSeek-V3",
    # arXiv 2505.09343), one 400 Gb/s InfiniBand NIC per GPU. Measured, not data sheet:
    # DeepSeek-V3's report (arXiv 2412.19437, section 3.2.2) gives "NVLink offers a bandwidth
    # of 160 GB/s, roughly 3.2 times that of IB (50 GB/s)" (`frameworks.DEEPSEEK` uses it).
    # Its dense FP8 peak is twice the bf16 one (1,979 TFLOP/s): MFU here is against bf16's.
    DataSheet("H800", 989.4, 494.7, 66.9, "NVIDIA H800 SXM: the H100 SXM5's compute and HBM3; "
              "NVLink 400 GB/s both ways (DeepSeek, arXiv 2505.09343); 400 Gb/s InfiniBand",
              85.9, 3.35, 200.0, 400.0, 8, 132),
    DataSheet("H200", 989.4, 494.7, 66.9, "NVIDIA H200 data sheet: the H100's die, 141 GB of HBM3e", 141.0, 4.8, 450.0, 400.0, 8, 132),
    DataSheet("A100", 312.0, 156.0, 19.5, "NVIDIA A100 data sheet, SXM4 80GB; NVLink 3; HDR 200 Gb/s", 85.9, 2.039, 300.0, 200.0, 8, 108),
    DataSheet("B200", 2250.0, 1100.0, 80.0, "NVIDIA HGX B200 data sheet, per GPU; NVLink 5", 180.0, 8.0, 900.0, 400.0, 8, 148),
    DataSheet("L40S", 362.0, 183.0, 91.6, "NVIDIA L40S data sheet"),
    DataSheet("L4", 121.0, 60.0, 30.3, "NVIDIA L4 data sheet"),
    DataSheet("V100", 125.0, 15.7, 15.7, "NVIDIA V100 data sheet, SXM2: fp16 tensor cores (it has no bf16)"),
)}
H100 = SHEETS["H100"]


def find(device_name: str) -> DataSheet | None:
    """The data sheet of the GPU called `device_name` (as CUDA names it), None if unknown."""
    return next((s for key, s in SHEETS.items() if key.lower() in device_name.lower()), None)
