#!/usr/bin/env python3
"""PyTorch baseline for kiln-bench train: the median time of a ResNet-50 training step.

One step: forward, cross-entropy, backward and an SGD update (momentum 0.9) on one
synthetic batch held on the device, in channels_last, f32 with TF32 allowed for matmuls and
convolutions (what PyTorch users on Hopper get by setting two flags). Modes: eager, and
torch.compile (default mode) of the model, forward and backward compiled and the optimizer
eager, as kiln-bench train --compile does. Prints one JSON line per mode, then one line
with the compiled/eager ratios when both ran:

  {"bench":"train","impl":"pytorch","mode":"eager","arch":"resnet50","batch":128,
   "image_size":224,"img_per_s":...,"median_step_ms":...,"peak_mib":...,"compile_s":...}

Step times come from CUDA events around each step (wall clock on the CPU); peak_mib is
torch.cuda.max_memory_allocated over the timed steps (null on the CPU); compile_s is the
wall time of the first compiled step, tracing and code generation included (null in eager).
--amp bf16|fp16 runs forward and loss under torch.autocast (fp16 with torch.amp.GradScaler),
as kiln-bench train --amp does.
--arch mlp-block is kiln-bench mlp-block's model instead: --blocks residual blocks
y = x + fc2(gelu(fc1(layer_norm(x)))) on a [batch, width] input, loss mean(y^2), and
--optimizer adamw (PyTorch's defaults) or none.
--arch bert-tiny|bert-mini|bert-base|bert-large|gpt2-tiny|gpt2-mini|gpt2-small is kiln-bench
train's text models: Hugging Face transformers' BertForMaskedLM or GPT2LMHeadModel at kiln's
config of that name (HF's initialization, dropout 0.1, attention through PyTorch's sdpa, as
transformers picks by default) on a synthetic batch of --batch sequences of --seq token ids
(BERT: 15% of the positions labelled, the rest -100; GPT-2: labels = ids, which HF shifts),
HF's own loss from labels=, and AdamW (PyTorch's defaults). torch.compile compiles the model
and its loss together; the update stays eager, as kiln-bench's compiled mode has it.
--threads sets torch.set_num_threads (tools/bench_vs_torch.py gives kiln and PyTorch the same).
--device cpu without sizes is a smoke test: batch 2, 32x32 images, 2 steps.
--dry-run prints the plan as JSON and imports nothing.
"""

import argparse
import json
import math
import signal
import statistics
import sys
import time


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--arch", default="resnet50",
                   help="a torchvision.models constructor name, mlp-block, or a text model (bert-mini, gpt2-small, ...)")
    p.add_argument("--seq", type=int, default=128, help="text models: tokens per sequence")
    p.add_argument("--vocab", type=int, default=0, help="text models: vocabulary (0: BERT's 30522, GPT-2's 50257)")
    p.add_argument("--width", type=int, default=1024, help="mlp-block: features per sample")
    p.add_argument("--hidden", type=int, default=0, help="mlp-block: hidden features (0: 4 * width)")
    p.add_argument("--blocks", type=int, default=1, help="mlp-block: blocks in a row")
    p.add_argument("--optimizer", choices=["sgd", "adamw", "none"],
                   help="the update ending each step (resnets: sgd, mlp-block: none)")
    p.add_argument("--memory-format", default="channels_last", choices=["channels_last", "contiguous"],
                   help="of the resnets' weights and batch")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: PyTorch's default)")
    p.add_argument("--batch", type=int, help="images per step (cuda 128, cpu 2)")
    p.add_argument("--image-size", type=int, help="height and width (cuda 224, cpu 32)")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--steps", type=int, help="timed steps (cuda 20, cpu 2)")
    p.add_argument("--warmup", type=int, help="untimed steps before them (cuda 5, cpu 1)")
    p.add_argument("--modes", default="eager,compiled", help="comma-separated: eager, compiled")
    p.add_argument("--compile-budget-s", type=float, default=150.0,
                   help="give up on torch.compile when its first step takes longer (0: no limit)")
    p.add_argument("--amp", default="none", choices=["none", "bf16", "fp16"],
                   help="torch.autocast to this dtype around forward and loss; fp16 with torch.amp.GradScaler")
    p.add_argument("--no-tf32", action="store_true", help="plain f32 matmuls and convolutions")
    p.add_argument("--no-cudnn-benchmark", action="store_true", help="leave cudnn.benchmark off")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    a = p.parse_args(argv)
    small = a.device == "cpu"
    a.batch = a.batch if a.batch is not None else (2 if small else 128)
    a.image_size = a.image_size if a.image_size is not None else (32 if small else 224)
    a.steps = a.steps if a.steps is not None else (2 if small else 20)
    a.warmup = a.warmup if a.warmup is not None else (1 if small else 5)
    a.modes = [m for m in a.modes.split(",") if m]
    for m in a.modes:
        if m not in ("eager", "compiled"):
            p.error(f"--modes: unknown mode {m!r} (eager, compiled)")
    if not a.modes:
        p.error("--modes: no mode given")
    mlp = a.arch == "mlp-block"
    text = is_text(a.arch)
    if text and a.arch not in TEXT_SIZES:
        p.error(f"--arch {a.arch}: the text models are {', '.join(TEXT_SIZES)}")
    a.optimizer = a.optimizer or ("none" if mlp else "adamw" if text else "sgd")
    if text and a.optimizer != "adamw":
        p.error(f"--optimizer {a.optimizer}: the text models take adamw")
    if mlp and a.optimizer == "sgd" or not mlp and not text and a.optimizer != "sgd":
        p.error(f"--optimizer {a.optimizer}: the resnets take sgd, mlp-block adamw or none")
    a.hidden = a.hidden or 4 * a.width
    for name in ("batch", "image_size", "steps", "warmup", "classes", "width", "blocks", "seq"):
        if getattr(a, name) < (0 if name == "warmup" else 1):
            p.error(f"--{name.replace('_', '-')} must be positive")
    return a


# kiln's configs of these names (models::BertConfig, models::GPT2Config): layers, width,
# heads, positions. BERT's MLP is 4x its width, as GPT-2's.
TEXT_SIZES = {
    "bert-tiny": (2, 128, 2, 512), "bert-mini": (4, 256, 4, 512), "bert-base": (12, 768, 12, 512),
    "bert-large": (24, 1024, 16, 512),
    "gpt2-tiny": (2, 128, 2, 512), "gpt2-mini": (4, 256, 4, 512), "gpt2-small": (12, 768, 12, 1024),
}


def is_text(arch):
    return arch.startswith("bert-") or arch.startswith("gpt2-")


def emit(line):
    print(json.dumps(line, separators=(",", ":")), flush=True)


class CompileTimeout(Exception):
    pass


def mlp_blocks(torch, a):
    """kiln-bench mlp-block's model: residual blocks x + fc2(gelu(fc1(layer_norm(x))))."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(a.width, eps=1e-5)
            self.fc1 = nn.Linear(a.width, a.hidden)
            self.fc2 = nn.Linear(a.hidden, a.width)

        def forward(self, x):
            return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))

    return nn.Sequential(*[Block() for _ in range(a.blocks)])


def text_workload(torch, a, device):
    """An HF masked-LM or causal-LM model whose forward(ids) returns HF's loss for the batch."""
    import transformers
    transformers.logging.set_verbosity_error()
    layers, width, heads, positions = TEXT_SIZES[a.arch]
    bert = a.arch.startswith("bert-")
    vocab = a.vocab or (30522 if bert else 50257)
    if bert:
        config = transformers.BertConfig(vocab_size=vocab, hidden_size=width, num_hidden_layers=layers,
                                         num_attention_heads=heads, intermediate_size=4 * width,
                                         max_position_embeddings=positions)
        lm = transformers.BertForMaskedLM(config)
    else:
        config = transformers.GPT2Config(vocab_size=vocab, n_positions=positions, n_embd=width, n_layer=layers,
                                         n_head=heads, bos_token_id=vocab - 1, eos_token_id=vocab - 1)
        lm = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(1, vocab, (a.batch, a.seq), device=device)
    if bert:
        chosen = torch.rand(a.batch, a.seq, device=device) < 0.15
        labels = torch.where(chosen, torch.randint(1, vocab, (a.batch, a.seq), device=device),
                             torch.full_like(ids, -100))
    else:
        labels = ids

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids):
            return self.lm(input_ids=input_ids, labels=labels).loss

    model = WithLoss().to(device).train()
    return model, torch.optim.AdamW(model.parameters()), ids, lambda loss: loss


def workload(torch, models, a, device):
    """The model, its optimizer (or None), the batch and the loss of the model's output."""
    torch.manual_seed(0)
    if is_text(a.arch):
        return text_workload(torch, a, device)
    if a.arch == "mlp-block":
        model = mlp_blocks(torch, a).to(device).train()
        optimizer = torch.optim.AdamW(model.parameters()) if a.optimizer == "adamw" else None
        x = torch.randn(a.batch, a.width, device=device)
        return model, optimizer, x, lambda out: (out * out).mean()
    fmt = torch.channels_last if a.memory_format == "channels_last" else torch.contiguous_format
    model = getattr(models, a.arch)(weights=None, num_classes=a.classes)
    model = model.to(device=device, memory_format=fmt).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-5)
    x = torch.randn(a.batch, 3, a.image_size, a.image_size, device=device).to(memory_format=fmt)
    y = torch.randint(0, a.classes, (a.batch,), device=device)
    return model, optimizer, x, lambda out: torch.nn.functional.cross_entropy(out, y)


def run_mode(torch, models, a, mode):
    """Builds a fresh model and optimizer, runs warmup and timed steps, returns the line."""
    device = torch.device(a.device)
    model, optimizer, x, loss_of = workload(torch, models, a, device)
    cuda = device.type == "cuda"

    forward = model
    if mode == "compiled":
        if not hasattr(torch, "compile"):
            raise RuntimeError(f"torch {torch.__version__} has no torch.compile")
        forward = torch.compile(model)

    # Mixed precision as PyTorch's AMP recipe has it: autocast around forward and loss only;
    # fp16 scales the loss (GradScaler), bf16 needs no scaling.
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.amp)
    scaler = torch.amp.GradScaler(device.type) if a.amp == "fp16" else None

    def step():
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
        else:
            model.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = loss_of(forward(x))
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            if optimizer is not None:
                optimizer.step()
        return loss

    def sync():
        if cuda:
            torch.cuda.synchronize()

    # The first step on its own: compiling happens there (bounded by SIGALRM, which
    # interrupts dynamo and inductor, both Python, between bytecodes).
    compile_s = None
    t0 = time.perf_counter()
    if mode == "compiled" and a.compile_budget_s > 0:
        def on_alarm(signum, frame):
            raise CompileTimeout(f"torch.compile's first step took over {a.compile_budget_s:g} s")
        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, a.compile_budget_s)
        try:
            step()
            sync()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    else:
        step()
        sync()
    first_step_s = time.perf_counter() - t0
    if mode == "compiled":
        compile_s = first_step_s

    for _ in range(max(a.warmup - 1, 0)):
        step()
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)

    ms = []
    if cuda:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(a.steps)]
        for start, end in events:
            start.record()
            loss = step()
            end.record()
        torch.cuda.synchronize()
        ms = [start.elapsed_time(end) for start, end in events]
    else:
        for _ in range(a.steps):
            t = time.perf_counter()
            loss = step()
            ms.append((time.perf_counter() - t) * 1000.0)
    median_ms = statistics.median(ms)
    peak_mib = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None
    loss_value = float(loss.detach())
    line = {
        "bench": "train", "impl": "pytorch", "mode": mode, "arch": a.arch, "batch": a.batch,
        "image_size": a.image_size,
        "img_per_s": round(1000.0 * a.batch / median_ms, 1),
        "median_step_ms": round(median_ms, 2),
        "peak_mib": round(peak_mib, 1) if peak_mib is not None else None,
        "compile_s": round(compile_s, 2) if compile_s is not None else None,
        "first_step_s": round(first_step_s, 2),
        "min_step_ms": round(min(ms), 2), "max_step_ms": round(max(ms), 2),
        "steps": a.steps, "warmup": a.warmup, "device": a.device, "optimizer": a.optimizer,
        "threads": torch.get_num_threads(),
        "tf32": not a.no_tf32, "cudnn_benchmark": cuda and not a.no_cudnn_benchmark,
        "amp": a.amp, "loss_scaling": scaler is not None,
        "loss_finite": math.isfinite(loss_value),
        "torch": torch.__version__,
    }
    if a.arch == "mlp-block":
        line.update(width=a.width, hidden=a.hidden, blocks=a.blocks)
        del line["image_size"]
    elif is_text(a.arch):
        line.update(seq=a.seq, tokens_per_s=round(1000.0 * a.batch * a.seq / median_ms, 1),
                    transformers=sys.modules["transformers"].__version__)
        del line["image_size"]
    else:
        line["memory_format"] = a.memory_format
    if cuda:
        line["gpu"] = torch.cuda.get_device_name(device)
    del forward, model, optimizer, x, loss, scaler
    if cuda:
        torch.cuda.empty_cache()
    return line


def main(argv):
    a = parse_args(argv)
    plan = {"plan": "bench_torch", "device": a.device, "arch": a.arch, "batch": a.batch,
            "image_size": a.image_size, "classes": a.classes, "steps": a.steps, "warmup": a.warmup,
            "modes": a.modes, "compile_budget_s": a.compile_budget_s, "tf32": not a.no_tf32, "amp": a.amp,
            "optimizer": a.optimizer, "threads": a.threads, "seq": a.seq if is_text(a.arch) else None,
            "cudnn_benchmark": a.device == "cuda" and not a.no_cudnn_benchmark}
    if a.dry_run:
        print(json.dumps(plan))
        return 0

    import torch
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    if a.arch == "mlp-block" or is_text(a.arch):
        models = None
    else:
        import torchvision.models as models

    if a.device == "cuda" and not torch.cuda.is_available():
        print("bench_torch: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = not a.no_tf32
    torch.backends.cudnn.allow_tf32 = not a.no_tf32
    torch.backends.cudnn.benchmark = a.device == "cuda" and not a.no_cudnn_benchmark
    print(f"bench_torch: torch {torch.__version__}, plan {json.dumps(plan)}", file=sys.stderr, flush=True)

    lines, failed = {}, False
    for mode in a.modes:
        try:
            lines[mode] = run_mode(torch, models, a, mode)
            emit(lines[mode])
        except Exception as e:  # one mode's failure (a compile error, out of memory) must not hide the other's line
            failed = True
            print(f"bench_torch: mode {mode} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            emit({"bench": "train", "impl": "pytorch", "mode": mode, "arch": a.arch, "batch": a.batch,
                  "image_size": a.image_size, "device": a.device, "error": f"{type(e).__name__}: {e}"[:300]})
            if a.device == "cuda":
                torch.cuda.empty_cache()
    if "eager" in lines and "compiled" in lines:
        eager, compiled = lines["eager"], lines["compiled"]
        ratio = {"bench": "train", "impl": "pytorch", "mode": "compiled_vs_eager", "amp": a.amp, "arch": a.arch,
                 "batch": a.batch, "image_size": a.image_size,
                 "speedup": round(eager["median_step_ms"] / compiled["median_step_ms"], 3)}
        if eager["peak_mib"] and compiled["peak_mib"]:
            ratio["peak_ratio"] = round(compiled["peak_mib"] / eager["peak_mib"], 3)
        emit(ratio)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
