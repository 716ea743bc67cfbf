"""``cann-train calibrate``: measure this machine (or one accelerator) and write the profile the planner
reads (``workers.planner.hardware``: ``var/calibration``). The measuring is the training runtime's
(:mod:`workers.training.calibrate`); the planner only reads what it wrote."""

from __future__ import annotations

import argparse
import json
import sys

EXIT_OK, EXIT_NOTHING_FITS = 0, 3


def register(subparsers) -> None:
    """Add the ``calibrate`` subcommand."""
    c = subparsers.add_parser(
        "calibrate",
        help="measure this machine (GEMM by shape, memory bandwidth, gloo all-reduce) for `cpu` plans",
        description="Measure GEMM throughput by shape and memory bandwidth with torch, and gloo all-reduce "
        "bandwidth/latency between 2 local processes; write the cpu profile the planner uses "
        "(var/calibration/cpu.json) and a matching cluster.json.",
    )
    c.add_argument("--out", help="directory to write cpu.json and cluster-cpu.json (default var/calibration)")
    c.add_argument("--quick", action="store_true", help="fewer shapes and repetitions (a few seconds)")
    c.add_argument("--no-allreduce", action="store_true", help="skip the 2-process gloo measurement")
    c.add_argument("--json", action="store_true", help="print the profile as JSON")
    c.add_argument(
        "--device",
        choices=("cuda", "npu"),
        help="instead, measure this accelerator's achievable bf16 matmul fraction (a MAMF sweep) and write "
        "var/calibration/device-<profile>.json, which the planner then uses for its compute ceiling",
    )
    c.set_defaults(func=run_calibrate)


def run_calibrate(args: argparse.Namespace) -> int:
    from workers.training.calibrate import calibrate, calibrate_device

    if args.device:
        from workers.devices.backend import DeviceUnavailable

        try:
            doc, path = calibrate_device(args.device, out_dir=args.out, quick=args.quick)
        except (DeviceUnavailable, ValueError) as exc:
            print(f"cann-train calibrate --device {args.device}: {exc}", file=sys.stderr)
            return EXIT_NOTHING_FITS
        if args.json:
            print(json.dumps(doc, indent=1))
        else:
            print(doc["achievable_matmul"]["source"])
            print(
                f"wrote {path} (profile {doc['profile']}: matmul {doc['achievable_matmul']['value']:.1%} of peak)"
            )
        return EXIT_OK

    try:
        profile, paths = calibrate(out_dir=args.out, quick=args.quick, allreduce=not args.no_allreduce)
    except ImportError as exc:
        print(f"cann-train calibrate: needs torch: {exc}", file=sys.stderr)
        return EXIT_NOTHING_FITS
    if args.json:
        print(json.dumps(profile, indent=1))
    else:
        eff = profile["efficiency"]
        print(
            f"peak GEMM {profile['peak_tflops']['fp32'] * 1e3:.1f} GFLOP/s fp32, "
            f"half-efficiency intensity {eff['gemm_half_intensity']['value']:.1f} FLOP/B; "
            f"memory {profile['memory_bandwidth_GBps']:.1f} GB/s"
        )
        link = profile.get("measured", {}).get("allreduce")
        if link:
            print(
                f"gloo all-reduce (2 processes): bus bandwidth {link['bus_bandwidth_GBps']:.2f} GB/s, "
                f"latency {link['latency_us']:.0f} us"
            )
        for p in paths:
            print(f"wrote {p}")
    return EXIT_OK
