"""The one prepared check for a machine with an NVIDIA GPU (``bench/gpu_check.sh`` runs it): figures printed side
by side, each part on its own so that one failing part does not hide the others.

1. **Logits**: tiny random Llama and Qwen3-MoE models through the runtime vs ``transformers`` on the device
   (fp32): the largest difference.
2. **Throughput**: a ~1B-parameter Llama-shaped model (Llama 3.2 1B's layers, a 32k vocabulary), bf16 autocast
   over fp32 weights, fused AdamW, the same micro-batch and global batch: the runtime's ``Trainer`` (one rank)
   vs ``transformers``' own loop; tokens/s and MFU against the device's bf16 peak
   (``workers/planner/data/hardware.json``).
3. **Energy**: NVML's energy counter over the runtime's measured steps vs our estimate for the same seconds
   (``DeviceEstimate``: TDP x utilisation, utilisation from NVML).
4. **Compression** (``bench/compress_kernels.py --device cuda``): the hooks' kernels on CUDA buckets.

``--device cpu --small`` runs parts 1-3 on this machine's CPU at a toy size (a check of the script itself).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from harness import ROOT, bench_parser

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

H200_BF16_TFLOPS = (
    989.4  # NVIDIA H200 SXM dense bf16 (workers/planner/data/hardware.json, its source cited there)
)


def part(title: str):
    def wrap(fn):
        def run(*a, **kw):
            print(f"\n== {title}", flush=True)
            t0 = time.monotonic()
            try:
                out = fn(*a, **kw)
            except Exception:  # noqa: BLE001 - the other parts still run; the trace says what broke
                traceback.print_exc()
                out = {"error": traceback.format_exc().splitlines()[-1]}
            print(f"   ({time.monotonic() - t0:.1f} s)", flush=True)
            return out

        return run

    return wrap


def peak_tflops(device_name: str) -> float | None:
    table = json.loads((ROOT / "workers/planner/data/hardware.json").read_text())
    for entry in table.get("devices", table if isinstance(table, list) else []):
        key = entry.get("name", "").split("-")[0]
        if key and key in device_name.replace(" ", ""):
            return entry.get("peak_tflops", {}).get("bf16")
    return H200_BF16_TFLOPS if "H200" in device_name else None


@part("1. logits: the runtime vs transformers (fp32)")
def logits_check(device: str) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from workers.training.hf import load_hf_weights, spec_from_hf_config
    from workers.training.model import Transformer

    out = {}
    base = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=512, max_position_embeddings=128)  # fmt: skip
    cases = {
        "llama": {},
        "qwen3_moe": dict(
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True
        ),
    }
    for family, extra in cases.items():
        torch.manual_seed(0)
        ref = AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **base, **extra)).eval()
        with torch.no_grad():
            for p in ref.parameters():
                p.normal_(0.0, 0.1)
        with tempfile.TemporaryDirectory() as d:
            ref.save_pretrained(d)
            spec = spec_from_hf_config(d, seq_length=64)
            ours = Transformer(spec)
            load_hf_weights(ours, spec, d)
        ref, ours = ref.to(device), ours.to(device).eval()
        tokens = torch.randint(0, 512, (2, 64), device=device)
        with torch.no_grad():
            diff = (ref(tokens).logits.float() - ours(tokens).float()).abs().max().item()
        out[family] = diff
        print(f"   {family:10s} max |logits diff| {diff:.2e}  ({'ok' if diff <= 1e-4 else 'ABOVE 1e-4'})")
    return out


def llama_1b(small: bool):
    from transformers import LlamaConfig

    if small:
        return LlamaConfig(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=2048, max_position_embeddings=256)  # fmt: skip
    # Llama 3.2 1B's layers (hidden 2048, 16 layers, 32 heads, 8 kv, ffn 8192), a 32k vocabulary
    return LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=32000, max_position_embeddings=2048, rope_theta=500000.0)  # fmt: skip


@part("2-3. throughput, MFU and energy: the runtime vs transformers (bf16 autocast)")
def throughput_check(device: str, small: bool, steps: int) -> dict:
    import numpy as np
    import torch
    from transformers import LlamaForCausalLM

    from workers.planner.specs.hf import spec_from_hf_config
    from workers.training.config import JobConfig
    from workers.training.model import flops_per_token
    from workers.training.trainer import Trainer

    seq, micro, batch = (64, 2, 4) if small else (2048, 4, 8)
    cfg_hf = llama_1b(small)
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    peak = peak_tflops(name) if device == "cuda" else None
    results: dict = {"device": name, "peak_bf16_tflops": peak}
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        torch.manual_seed(0)
        LlamaForCausalLM(cfg_hf).save_pretrained(d / "model")
        (d / "data").mkdir()
        np.save(
            d / "data" / "tokens.npy",
            np.random.default_rng(0).integers(0, cfg_hf.vocab_size, 2_000_000 if not small else 50_000),
        )
        spec = spec_from_hf_config(d / "model", seq_length=seq)
        fpt = flops_per_token(spec)
        results["parameters"] = int(spec.parameter_count()["total"])
        print(
            f"   model: {results['parameters'] / 1e9:.2f} B parameters, batch {batch} x {seq} tokens (micro {micro})"
        )

        # transformers' loop: fp32 weights, bf16 autocast, fused AdamW, gradient accumulation
        model = LlamaForCausalLM.from_pretrained(d / "model", attn_implementation="sdpa").to(device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
        tokens = torch.from_numpy(np.load(d / "data" / "tokens.npy")).to(device)
        times = []
        for step in range(steps):
            _sync(device)
            t0 = time.perf_counter()
            for m in range(batch // micro):
                start = (step * batch + m * micro) * (seq + 1)
                b = tokens[start : start + micro * (seq + 1)].view(micro, seq + 1)
                with torch.autocast(device, dtype=torch.bfloat16):
                    logits = model(input_ids=b[:, :-1]).logits
                loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), b[:, 1:].flatten())
                (loss / (batch // micro)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            _sync(device)
            times.append(time.perf_counter() - t0)
        hf_tps = batch * seq / _median(times[3:])
        del model, opt
        if device == "cuda":
            torch.cuda.empty_cache()

        # the runtime: its Trainer on one rank, same model, batch and tokens
        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
        )
        cfg = JobConfig.from_dict({
            "model": spec.to_dict(), "strategy": {"micro_batch_size": micro},
            "training": {"global_batch_size": batch, "dtype": "bf16" if device == "cuda" else "fp32"},
            "steps": steps, "hf_model": str(d / "model"), "data": str(d / "data"), "lr": 1e-4, "device": device,
            "energy": {"enabled": False}, **({"peak_tflops": peak} if peak else {}),
        })  # fmt: skip
        energy = _EnergyWindow(device)
        trainer = Trainer(cfg)
        energy.start()
        summary = trainer.train()
        joules = energy.stop()
        trainer.close()
        our_times = summary["step_times_s"][3:]
        our_tps = batch * seq / _median(our_times)
    results.update(
        transformers_tokens_per_s=round(hf_tps, 1),
        cann_train_tokens_per_s=round(our_tps, 1),
        ratio=round(our_tps / hf_tps, 3),
    )
    if peak:
        results["transformers_mfu"] = round(fpt * hf_tps / (peak * 1e12), 4)
        results["cann_train_mfu"] = round(fpt * our_tps / (peak * 1e12), 4)
    print(f"   {'':12s} {'tokens/s':>10} {'MFU':>7}")
    print(f"   {'transformers':12s} {hf_tps:>10,.0f} {results.get('transformers_mfu', float('nan')):>7.1%}")
    print(
        f"   {'cann-train':12s} {our_tps:>10,.0f} {results.get('cann_train_mfu', float('nan')):>7.1%}   ratio {our_tps / hf_tps:.2f}"
    )
    results["energy"] = joules
    if joules:
        print(f"   energy over the runtime's {steps} steps: NVML {joules['nvml_J']:.0f} J, our estimate {joules['estimate_J']:.0f} J "
              f"(TDP {joules['tdp_W']:.0f} W x utilisation {joules['mean_utilisation']:.0%}), ratio {joules['estimate_J'] / max(joules['nvml_J'], 1e-9):.2f}")  # fmt: skip
    return results


class _EnergyWindow:
    """NVML's counter (measured) and our estimate (TDP x NVML utilisation) over the same seconds."""

    def __init__(self, device: str):
        self.device = device
        self.meter = self.estimate = None

    def start(self) -> None:
        if self.device != "cuda":
            return
        import threading

        from workers.devices.nvml import NvmlSession
        from workers.green.power.estimates import DeviceEstimate
        from workers.green.power.measured import NvmlEnergy

        self.meter = NvmlEnergy([0])
        session = NvmlSession()
        handle, _ = session.cuda_handle(0, None)
        self.tdp = float(session.nv.nvmlDeviceGetEnforcedPowerLimit(handle)) / 1000.0
        self.util: list[float] = []

        def utilisation() -> float:
            u = session.nv.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
            self.util.append(u)
            return u

        self.estimate = DeviceEstimate("cuda", 1, self.tdp, utilisation=utilisation)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            self.estimate.joules(time.monotonic())

    def stop(self) -> dict | None:
        if self.meter is None:
            return None
        self._stop.set()
        self._thread.join()
        now = time.monotonic()
        measured = self.meter.joules(now)["device"]
        estimated = self.estimate.joules(now)["device"]
        self.meter.close()
        return {"nvml_J": measured, "estimate_J": estimated, "tdp_W": self.tdp,
                "mean_utilisation": sum(self.util) / max(1, len(self.util))}  # fmt: skip


@part("4. compression hooks and kernels on CUDA buckets (bench/compress_kernels.py --device cuda)")
def compression_check(device: str) -> dict:
    if device != "cuda":
        print("   skipped: no CUDA device")
        return {"skipped": True}
    run = subprocess.run([sys.executable, str(ROOT / "bench/compress_kernels.py"), "--device", "cuda", "--numel", "10000000", "--repeats", "3"],
                         capture_output=True, text=True, timeout=240, cwd=ROOT)  # fmt: skip
    print("   " + "\n   ".join((run.stdout + run.stderr[-2000:]).strip().splitlines()))
    return {"exit_code": run.returncode}


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = bench_parser(__doc__, json_flag=True)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--small", action="store_true", help="a toy model (a check of this script)")
    parser.add_argument(
        "--steps", type=int, default=13, help="training steps per side (the first 3 not timed)"
    )
    args = parser.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing to check (try --device cpu --small)")
        return
    print(
        f"torch {torch.__version__}, "
        + (f"{torch.cuda.get_device_name(0)}" if args.device == "cuda" else "CPU")
    )
    out = {
        "logits": logits_check(args.device),
        "throughput": throughput_check(args.device, args.small, args.steps),
        "compression": compression_check(args.device),
    }
    if args.json:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
