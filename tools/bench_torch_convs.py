#!/usr/bin/env python3
"""PyTorch's side of `kiln-bench convs`: the same convolutions, timed the same way.

Reads kiln-bench convs' JSON lines (a file, or - for stdin; --list's untimed lines do), and
for each times torch.nn.functional.conv2d and the two gradients a training step takes
(torch.ops.aten.convolution_backward for the input's, then for the weight's), each the
median of --reps runs after one warm-up, in f32 without autograd. Prints each line back
with "impl":"pytorch" and its times:

  {"bench":"conv","impl":"pytorch","model":"resnet18",...,"forward_ms":...,
   "backward_input_ms":...,"backward_weight_ms":...,"forward_gflop_per_s":...}

A "channels_last" line runs input, weight and output gradient channels_last (as a model
moved to channels_last has them; kiln's weight stays OIHW). --threads sets
torch.set_num_threads.
"""

import argparse
import json
import statistics
import sys
import time


def median_ms(f, reps):
    f()
    ms = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        ms.append((time.perf_counter() - t) * 1000.0)
    return statistics.median(ms)


def time_conv(torch, line, reps):
    fmt = torch.channels_last if line["layout"] == "channels_last" else torch.contiguous_format
    x = torch.randn(line["input"]).to(memory_format=fmt)
    w = torch.randn(line["weight"]).to(memory_format=fmt)
    grad_out = torch.randn(line["output"]).to(memory_format=fmt)
    stride, padding, dilation, groups = line["stride"], line["padding"], line["dilation"], line["groups"]

    def backward(mask):
        return torch.ops.aten.convolution_backward(grad_out, x, w, None, stride, padding, dilation, False, [0, 0],
                                                   groups, mask)

    with torch.no_grad():
        forward = median_ms(lambda: torch.nn.functional.conv2d(x, w, None, stride, padding, dilation, groups), reps)
        input_ms = median_ms(lambda: backward([True, False, False]), reps)
        weight_ms = median_ms(lambda: backward([False, True, False]), reps)
    out = {k: v for k, v in line.items() if not k.endswith(("_ms", "_per_s")) and k not in ("gemm", "blas_kernels")}
    out.update(impl="pytorch", reps=reps, forward_ms=round(forward, 3), backward_input_ms=round(input_ms, 3),
               backward_weight_ms=round(weight_ms, 3), threads=torch.get_num_threads(), torch=torch.__version__)
    for name, ms in (("forward", forward), ("backward_input", input_ms), ("backward_weight", weight_ms)):
        out[f"{name}_gflop_per_s"] = round(line["gflop"] * 1e3 / ms, 1)
    return out


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("shapes", help="kiln-bench convs' JSON lines (- for stdin)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: PyTorch's default)")
    p.add_argument("--layout", choices=["contiguous", "channels_last"], help="instead of each line's own")
    a = p.parse_args(argv)
    source = sys.stdin if a.shapes == "-" else open(a.shapes)
    lines = [json.loads(s) for s in source if s.strip().startswith("{")]
    lines = [line for line in lines if line.get("bench") == "conv"]
    if not lines:
        print(f"bench_torch_convs: no conv lines in {a.shapes}", file=sys.stderr)
        return 1

    import torch
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    for line in lines:
        if a.layout:
            line["layout"] = a.layout
        print(json.dumps(time_conv(torch, line, a.reps), separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
