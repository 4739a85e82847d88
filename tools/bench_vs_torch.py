#!/usr/bin/env python3
"""kiln against PyTorch on the CPU (`make bench-torch`): training steps and convolutions.

--bench train times each config's training step in four modes: PyTorch eager,
torch.compile, kiln eager and kiln compiled. The modes run interleaved: per config, --rounds
rounds, each running every mode once in a fresh process with its own warm-up
(tools/bench_torch.py for PyTorch, `kiln-bench train|mlp-block --only MODE` for kiln), the
starting mode rotating from round to round, so that a shared machine's drift hits every
mode alike. A mode's figure is the median of its rounds' median step times; its range, the
lowest and highest of them. Ratios are time ratios, kiln's over PyTorch's (below 1: kiln is
faster); the compile times are each compiled mode's first step (tracing, code generation
and one step; both sides keep a kernel cache between runs, so later rounds may find it warm).

--bench convs times every distinct convolution of the ResNet configs (`kiln-bench convs`
against tools/bench_torch_convs.py, interleaved per model the same way): forward,
backward-input and backward-weight, with each shape's share of the model's convolution time
in one training step (uses x the passes the step runs; the stem takes no input gradient).

Both threads counts are --threads: OMP_NUM_THREADS and OPENBLAS_NUM_THREADS for every
process, torch.set_num_threads for PyTorch's. A table goes to stdout, the JSON report to
--out. This file needs only the standard library; PyTorch runs in --python's processes.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

TOOLS = os.path.dirname(os.path.abspath(__file__))

# The table: CPU, synthetic batches held in memory, 1000 classes on both sides.
CONFIGS = {
    "resnet50-b8-64": {"arch": "resnet50", "batch": 8, "image_size": 64},
    "resnet18-b64-32": {"arch": "resnet18", "batch": 64, "image_size": 32},
    "mlp-block-x4": {"arch": "mlp-block", "batch": 256, "width": 1024, "blocks": 4, "optimizer": "adamw"},
    "resnet50-b32-32": {"arch": "resnet50", "batch": 32, "image_size": 32},
    # Issue 20's transformers (kiln-bench train --arch bert-*|gpt2-*; PyTorch: transformers'
    # BertForMaskedLM and GPT2LMHeadModel at the same config): masked-LM and causal-LM steps
    # with AdamW on synthetic token ids.
    "bert-mini-b32-128": {"arch": "bert-mini", "batch": 32, "seq": 128},
    "gpt2-small-b8-128": {"arch": "gpt2-small", "batch": 8, "seq": 128},
    "gpt2-mini-b16-128": {"arch": "gpt2-mini", "batch": 16, "seq": 128},
}
CLASSES = 1000
MODES = ("pytorch_eager", "torch_compile", "kiln_eager", "kiln_compiled")
MODE_TITLES = {"pytorch_eager": "pytorch eager", "torch_compile": "torch.compile", "kiln_eager": "kiln eager",
               "kiln_compiled": "kiln compiled"}
# (name, numerator mode, denominator mode): kiln's time over PyTorch's.
RATIOS = (("kiln_compiled_vs_torch_compile", "kiln_compiled", "torch_compile"),
          ("kiln_compiled_vs_pytorch_eager", "kiln_compiled", "pytorch_eager"),
          ("kiln_eager_vs_pytorch_eager", "kiln_eager", "pytorch_eager"))
CONV_IMPLS = ("kiln", "pytorch")
CONV_PASSES = ("forward", "backward_input", "backward_weight")


def interleave(configs, modes, rounds):
    """The run order: per config, `rounds` rounds of every mode once, round r starting at
    mode r (mod the count), so that no mode always runs first or right after another."""
    order = []
    for config in configs:
        for r in range(rounds):
            for i in range(len(modes)):
                order.append((config, r, modes[(r + i) % len(modes)]))
    return order


def train_command(config, mode, o):
    """The argv that times `config` in `mode` and prints its JSON line."""
    c = CONFIGS[config]
    mlp = c["arch"] == "mlp-block"
    text = "seq" in c
    if mode.startswith("kiln"):
        only = "compiled" if mode == "kiln_compiled" else "eager"
        if text:
            argv = [o.kiln_bench, "train", "--arch", c["arch"], "--batch", c["batch"], "--seq", c["seq"]]
            argv += ["--compile"] if only == "compiled" else []
        elif mlp:
            argv = [o.kiln_bench, "mlp-block", "--batch", c["batch"], "--width", c["width"], "--blocks", c["blocks"],
                    "--optimizer", c["optimizer"]]
        else:
            argv = [o.kiln_bench, "train", "--arch", c["arch"], "--batch", c["batch"], "--image-size",
                    c["image_size"], "--classes", CLASSES, "--device", "cpu"]
            argv += ["--compile"] if only == "compiled" else []
        argv += ["--steps", o.steps, "--warmup", o.warmup, "--only", only]
    else:
        argv = [o.python, os.path.join(TOOLS, "bench_torch.py"), "--device", "cpu", "--arch", c["arch"],
                "--batch", c["batch"], "--steps", o.steps, "--warmup", o.warmup, "--threads", o.threads,
                "--modes", "compiled" if mode == "torch_compile" else "eager",
                "--compile-budget-s", o.compile_budget_s]
        if text:
            argv += ["--seq", c["seq"]]
        elif mlp:
            argv += ["--width", c["width"], "--blocks", c["blocks"], "--optimizer", c["optimizer"]]
        else:
            argv += ["--image-size", c["image_size"], "--classes", CLASSES]
    return [str(a) for a in argv]


def environment(threads):
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = str(threads)
    return env


def json_lines(text):
    lines = []
    for s in text.splitlines():
        s = s.strip()
        if s.startswith("{"):
            try:
                lines.append(json.loads(s))
            except json.JSONDecodeError:
                pass
    return lines


def step_result(stdout):
    """The timed step of one run's output: its last line with a median step time, or None."""
    timed = [line for line in json_lines(stdout) if "median_step_ms" in line and "error" not in line]
    return timed[-1] if timed else None


def spread(values):
    """Median, lowest and highest of a list of numbers (None when it is empty)."""
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def ratio(a, b):
    return round(a / b, 3) if a and b else None


def summarize_train(config, runs):
    """One config's report from its runs: {mode: [result line or None per round]}."""
    c = CONFIGS[config]
    report = {"config": config, **c, "modes": {}, "ratios": {}}
    for mode, lines in runs.items():
        ok = [line for line in lines if line]
        step = spread([line["median_step_ms"] for line in ok])
        if not step:
            report["modes"][mode] = {"error": "no run finished", "rounds": len(lines)}
            continue
        entry = {"median_step_ms": round(step["median"], 2), "min_step_ms": round(step["min"], 2),
                 "max_step_ms": round(step["max"], 2), "rounds_ms": [line["median_step_ms"] for line in ok],
                 "samples_per_s": round(1000.0 * c["batch"] / step["median"], 1), "rounds": len(ok)}
        if "seq" in c:
            entry["tokens_per_s"] = round(1000.0 * c["batch"] * c["seq"] / step["median"], 1)
        # kiln's compiled first call and torch.compile's first step both include tracing and
        # code generation; eager modes have no compile time.
        first = [line.get("compile_s") if mode == "torch_compile" else line.get("first_call_s") for line in ok]
        first = [s for s in first if s is not None]
        if mode in ("torch_compile", "kiln_compiled") and first:
            entry["compile_s"] = {k: round(v, 2) for k, v in spread(first).items()}
        report["modes"][mode] = entry
    step_of = {m: e.get("median_step_ms") for m, e in report["modes"].items()}
    for name, kiln, torch in RATIOS:
        report["ratios"][name] = ratio(step_of.get(kiln), step_of.get(torch))
    compile_of = {m: e["compile_s"]["median"] for m, e in report["modes"].items() if "compile_s" in e}
    report["ratios"]["kiln_compile_s_vs_torch_compile_s"] = ratio(compile_of.get("kiln_compiled"),
                                                                  compile_of.get("torch_compile"))
    return report


def train_table(reports):
    out = [f"{'config':<18}{'mode':<16}{'median ms':>11}{'range ms':>20}{'samples/s':>11}{'compile s':>11}"]
    for r in reports:
        for mode in MODES:
            e = r["modes"].get(mode)
            if e is None:
                continue
            if "error" in e:
                out.append(f"{r['config']:<18}{MODE_TITLES[mode]:<16}  {e['error']}")
                continue
            span = f"{e['min_step_ms']:.1f}-{e['max_step_ms']:.1f}"
            compiled = f"{e['compile_s']['median']:.1f}" if "compile_s" in e else ""
            out.append(f"{r['config']:<18}{MODE_TITLES[mode]:<16}{e['median_step_ms']:>11.1f}{span:>20}"
                       f"{e['samples_per_s']:>11.1f}{compiled:>11}")
    out.append("")
    out.append("time ratios, kiln / PyTorch (below 1: kiln is faster)")
    out.append(f"{'config':<18}{'compiled/compile':>18}{'compiled/eager':>16}{'eager/eager':>13}{'compile s':>11}")
    for r in reports:
        cells = [r["ratios"].get(name) for name, _, _ in RATIOS] + [r["ratios"].get("kiln_compile_s_vs_torch_compile_s")]
        text = [f"{v:.2f}" if v is not None else "-" for v in cells]
        out.append(f"{r['config']:<18}{text[0]:>18}{text[1]:>16}{text[2]:>13}{text[3]:>11}")
    return "\n".join(out)


def conv_key(line):
    return (line["model"], line["batch"], line["image_size"], tuple(line["input"]), tuple(line["weight"]),
            tuple(line["stride"]), tuple(line["padding"]), tuple(line["dilation"]), line["groups"])


def step_ms(entry, impl):
    """The time one training step spends in this convolution: its uses times the passes
    the step runs (backward-input only where the input takes a gradient)."""
    passes = [p for p in CONV_PASSES if p != "backward_input" or entry["input_grad"]]
    return entry["uses"] * sum(entry[impl][p + "_ms"] for p in passes)


def summarize_convs(shapes, runs):
    """Per shape (kiln-bench convs --list's lines, in order): each impl's median over its
    rounds per pass, kiln/PyTorch ratios, and shares of the model's convolution time."""
    rows = []
    for shape in shapes:
        key = conv_key(shape)
        row = {k: shape[k] for k in ("model", "batch", "image_size", "input", "weight", "output", "stride", "padding",
                                     "dilation", "groups", "uses", "input_grad", "layout", "gflop")}
        for impl in CONV_IMPLS:
            lines = [line for line in runs.get(impl, []) if conv_key(line) == key]
            row[impl] = {p + "_ms": round(statistics.median([line[p + "_ms"] for line in lines]), 3)
                         for p in CONV_PASSES} if lines else None
        row["ratios"] = {p: ratio(row["kiln"][p + "_ms"], row["pytorch"][p + "_ms"]) if row["kiln"] and row["pytorch"]
                         else None for p in CONV_PASSES}
        rows.append(row)
    totals = {}
    for impl in CONV_IMPLS:
        total = sum(step_ms(r, impl) for r in rows if r[impl])
        totals[impl] = round(total, 2)
        for r in rows:
            if r[impl]:
                r[impl]["step_ms"] = round(step_ms(r, impl), 3)
                r[impl]["share"] = round(step_ms(r, impl) / total, 4) if total else None
    return {"shapes": rows, "step_conv_ms": totals, "ratio": ratio(totals.get("kiln"), totals.get("pytorch"))}


def conv_table(model, report):
    dims = lambda v: "x".join(str(d) for d in v)
    out = [f"{model}: per convolution, ms kiln / pytorch (time ratio); share of the step's convolution time"]
    out.append(f"{'input':<16}{'weight':<16}{'s':>2}{'p':>2}{'uses':>5}  {'forward':<22}{'backward input':<22}"
               f"{'backward weight':<22}{'share k/p':>10}")
    for r in report["shapes"]:
        cells = []
        for p in CONV_PASSES:
            k, t = (r[i][p + "_ms"] if r[i] else None for i in CONV_IMPLS)
            q = r["ratios"][p]
            text = f"{k:.2f}/{t:.2f} ({q:.2f})" if q is not None else f"{k}/{t}"
            if p == "backward_input" and not r["input_grad"]:
                text = "(" + text + ")"
            cells.append(f"{text:<22}")
        shares = "/".join(f"{100 * r[i]['share']:.0f}%" if r[i] and r[i]["share"] is not None else "-"
                          for i in CONV_IMPLS)
        out.append(f"{dims(r['input']):<16}{dims(r['weight']):<16}{r['stride'][0]:>2}{r['padding'][0]:>2}"
                   f"{r['uses']:>5}  {''.join(cells)}{shares:>10}")
    t = report["step_conv_ms"]
    out.append(f"one step's convolutions: kiln {t.get('kiln', 0):.1f} ms, pytorch {t.get('pytorch', 0):.1f} ms"
               + (f" (ratio {report['ratio']:.2f})" if report["ratio"] else "")
               + "; a bracketed backward input is not run by a step")
    return "\n".join(out)


def run(argv, threads, timeout_s, log):
    """Runs one benchmark process; its stdout, or None (the failure goes to the log)."""
    log(f"$ {' '.join(argv)}")
    started = time.perf_counter()
    try:
        p = subprocess.run(argv, env=environment(threads), capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        log(f"  failed: {type(e).__name__}: {e}")
        return None
    log(f"  {time.perf_counter() - started:.1f} s, exit status {p.returncode}")
    if p.returncode != 0:
        log("  " + "\n  ".join((p.stderr or p.stdout).strip().splitlines()[-5:]))
    return p.stdout


def bench_train(o, log):
    runs = {c: {m: [] for m in o.modes} for c in o.configs}
    for config, r, mode in interleave(o.configs, o.modes, o.rounds):
        log(f"[{config} round {r + 1}/{o.rounds}] {MODE_TITLES[mode]}")
        stdout = run(train_command(config, mode, o), o.threads, o.timeout_s, log)
        runs[config][mode].append(step_result(stdout) if stdout is not None else None)
    reports = [summarize_train(c, runs[c]) for c in o.configs]
    return {"bench": "train", "reports": reports}, train_table(reports)


def conv_models(configs):
    """kiln-bench convs' --model values of the ResNet configs."""
    return [f"{c['arch']}:{c['batch']}:{c['image_size']}" for c in (CONFIGS[n] for n in configs)
            if "image_size" in c]


def bench_convs(o, log):
    layout = ["--channels-last"] if o.channels_last else []
    reports, tables = {}, []
    for model in conv_models(o.configs):
        listed = run([o.kiln_bench, "convs", "--model", model, "--list"] + layout, o.threads, o.timeout_s, log)
        shapes = [line for line in json_lines(listed or "") if line.get("bench") == "conv"]
        if not shapes:
            log(f"{model}: kiln-bench convs --list gave no shapes")
            continue
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write("\n".join(json.dumps(s) for s in shapes) + "\n")
        commands = {
            "kiln": [o.kiln_bench, "convs", "--model", model, "--reps", str(o.reps)] + layout,
            "pytorch": [o.python, os.path.join(TOOLS, "bench_torch_convs.py"), f.name, "--reps", str(o.reps),
                        "--threads", str(o.threads)],
        }
        runs = {impl: [] for impl in CONV_IMPLS}
        for _, r, impl in interleave([model], CONV_IMPLS, o.rounds):
            log(f"[convs {model} round {r + 1}/{o.rounds}] {impl}")
            stdout = run(commands[impl], o.threads, o.timeout_s, log)
            runs[impl] += [line for line in json_lines(stdout or "") if line.get("bench") == "conv"]
        os.unlink(f.name)
        reports[model] = summarize_convs(shapes, runs)
        tables.append(conv_table(model, reports[model]))
    return {"bench": "convs", "models": reports}, "\n\n".join(tables)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bench", choices=["train", "convs"], default="train")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=5, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per run (compiled kiln: at least 2)")
    p.add_argument("--reps", type=int, default=3, help="--bench convs: timed runs per pass and shape")
    p.add_argument("--channels-last", action="store_true", help="--bench convs: NHWC activations")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--kiln-bench", default="build/bin/kiln-bench")
    p.add_argument("--python", default=sys.executable, help="a Python with torch and torchvision")
    p.add_argument("--compile-budget-s", type=float, default=600.0, help="torch.compile's first step at most")
    p.add_argument("--timeout-s", type=float, default=1200.0, help="one process at most")
    p.add_argument("--out", help="write the JSON report here")
    p.add_argument("--dry-run", action="store_true", help="print the run order and commands, run nothing")
    a = p.parse_args(argv)
    a.configs = [c for c in a.configs.split(",") if c]
    a.modes = [m for m in a.modes.split(",") if m]
    for c in a.configs:
        if c not in CONFIGS:
            p.error(f"--configs: unknown config {c!r} ({', '.join(CONFIGS)})")
    for m in a.modes:
        if m not in MODES:
            p.error(f"--modes: unknown mode {m!r} ({', '.join(MODES)})")
    if not a.configs or not a.modes:
        p.error("no config or no mode given")
    for name in ("rounds", "steps", "warmup", "reps", "threads"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be positive")
    return a


def main(argv):
    o = parse_args(argv)
    if o.dry_run:
        if o.bench == "train":
            for config, r, mode in interleave(o.configs, o.modes, o.rounds):
                print(json.dumps({"config": config, "round": r, "mode": mode,
                                  "command": train_command(config, mode, o)}))
        else:
            for model in conv_models(o.configs):
                print(json.dumps({"model": model, "rounds": o.rounds, "impls": list(CONV_IMPLS)}))
        return 0
    log = lambda s: print(s, file=sys.stderr, flush=True)
    load = os.getloadavg()[0]
    if load > 0.5:
        # Seen on a shared 2-core machine: torch.compile's steps 20x slower (its generated
        # kernels are OpenMP loops, whose barriers spin) while another process held a core.
        log(f"bench_vs_torch: the load average is {load:.1f} before starting; another busy process skews the "
            "figures, torch.compile's most")
    report, table = (bench_train if o.bench == "train" else bench_convs)(o, log)
    report.update(threads=o.threads, rounds=o.rounds, steps=o.steps, warmup=o.warmup,
                  time=time.strftime("%Y-%m-%dT%H:%M:%S"), load_average_before=round(load, 2))
    print(table)
    if o.out:
        os.makedirs(os.path.dirname(os.path.abspath(o.out)), exist_ok=True)
        with open(o.out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"report: {o.out}")
    failed = report["bench"] == "train" and any(
        "error" in e for r in report["reports"] for e in r["modes"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
