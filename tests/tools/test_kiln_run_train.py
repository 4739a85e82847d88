#!/usr/bin/env python3
"""kiln-train under kiln-run, end to end (ctest runs it; no PyTorch needed).

1. Two ranks train an MLP on synthetic data and log the same step losses and accuracies
   as one process with the whole batch: --batch is the global batch, each rank trains its
   shard, the gradients are averaged, the statistics summed over the ranks. An MLP has no
   batch norm, so the only difference is the order of the sums: 1e-5 of the first step's
   loss (f32 sums of at most a few hundred terms, far below it, drifting over the steps).
2. Only rank 0 prints: every line kiln-run prefixes comes from rank 0.
3. Ctrl-C to kiln-run stops both ranks after the same step, rank 0 writes the checkpoint,
   and a run with --resume ends with the losses of the uninterrupted run.
4. A CNN with batch norm, one backward per step: with --sync-bn two ranks log the step
   losses of one process (the statistics are the whole batch's; f32 sums again, 30 steps,
   relative 1e-4 for the drift of a longer chain of ops); without it the first step's loss
   already differs (each rank normalizes its half alone).
5. --device cuda on 2 ranks (each rank on its GPU, gradients through NCCL): on a machine
   without a GPU the ranks stop with an error saying why, and the job fails; with GPUs
   it trains (2 GPUs are needed: NCCL refuses two ranks on one device).

usage: test_kiln_run_train.py KILN_TRAIN KILN_RUN
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ARGS = ["--data", "synthetic", "--train-samples", "64", "--image-size", "8", "--arch", "mlp", "--batch", "16",
        "--micro-batch", "4", "--steps", "400", "--lr", "0.05", "--workers", "0", "--seed", "3", "--print-every", "1"]
RTOL = 1e-5


def step_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if '"loss"' in line]


def check_same(a, b, what):
    # The two runs' weights drift apart by rounding, step after step; what that does to a
    # loss is absolute (the loss's gradient times the weights' difference), not a share of
    # a loss that falls towards 0 over 400 steps. So the scale is the larger of the step's
    # loss and the first step's.
    assert len(a) == len(b), f"{what}: {len(a)} steps against {len(b)}"
    scale = abs(a[0]["loss"]) if a else 0
    for x, y in zip(a, b):
        assert x["step"] == y["step"], f"{what}: step {x['step']} against {y['step']}"
        assert abs(x["loss"] - y["loss"]) <= RTOL * max(abs(x["loss"]), scale), \
            f"{what}: step {x['step']}: loss {x['loss']} against {y['loss']}"
        assert x["accuracy"] == y["accuracy"], f"{what}: step {x['step']}: accuracy {x['accuracy']} against {y['accuracy']}"


def main():
    train, run = sys.argv[1], sys.argv[2]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        one = os.path.join(tmp, "one.jsonl")
        subprocess.run([train, *ARGS, "--log", one], env=env, check=True, stdout=subprocess.DEVNULL, timeout=300)
        reference = step_lines(one)
        assert len(reference) == 400, len(reference)

        # 1 and 2: two ranks, uninterrupted.
        two = os.path.join(tmp, "two.jsonl")
        out = subprocess.run([run, "--nproc-per-node", "2", "--master-port", "0", train, *ARGS, "--log", two], env=env,
                             check=True, capture_output=True, text=True, timeout=300).stdout
        check_same(reference, step_lines(two), "two ranks")
        ranks = {line.split("]")[0] for line in out.splitlines() if line.startswith("[rank")}
        assert ranks == {"[rank 0"}, f"lines from {ranks}"
        assert "data parallel: 2 ranks" in out, out[:400]

        # 3: interrupted, then resumed.
        log = os.path.join(tmp, "interrupted.jsonl")
        ckpt = os.path.join(tmp, "ckpt")
        cmd = [run, "--nproc-per-node", "2", "--master-port", "0", train, *ARGS, "--log", log, "--checkpoint", ckpt]
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 120
        while time.time() < deadline and (not os.path.exists(log) or len(step_lines(log)) < 3):
            time.sleep(0.005)
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=120)
        stopped = len(step_lines(log))
        if stopped >= 400:
            print("the run ended before Ctrl-C reached it; the resume was not tested")
        else:
            assert "stopped at step" in out, out[-800:]
            subprocess.run(cmd + ["--resume"], env=env, check=True, stdout=subprocess.DEVNULL, timeout=300)
            check_same(reference, step_lines(log), f"interrupted after {stopped} steps and resumed")
        # 4: batch norm over both ranks.
        cnn = ["--data", "synthetic", "--train-samples", "64", "--image-size", "8", "--arch", "cnn", "--batch", "16",
               "--micro-batch", "16", "--steps", "30", "--lr", "0.05", "--workers", "0", "--seed", "3",
               "--print-every", "1"]
        one_cnn = os.path.join(tmp, "one_cnn.jsonl")
        subprocess.run([train, *cnn, "--log", one_cnn], env=env, check=True, stdout=subprocess.DEVNULL, timeout=300)
        logs = {}
        for flag in ["--sync-bn", None]:
            path = os.path.join(tmp, f"two_cnn_{bool(flag)}.jsonl")
            out = subprocess.run([run, "--nproc-per-node", "2", "--master-port", "0", train, *cnn, "--log", path]
                                 + ([flag] if flag else []), env=env, check=True, capture_output=True, text=True,
                                 timeout=300).stdout
            logs[flag] = step_lines(path)
            if flag:
                assert "batch norm over all ranks (--sync-bn)" in out, out[:600]
        ref_cnn = step_lines(one_cnn)
        for x, y in zip(ref_cnn, logs["--sync-bn"]):
            assert abs(x["loss"] - y["loss"]) <= 1e-4 * abs(x["loss"]), f"--sync-bn step {x['step']}: {x['loss']} against {y['loss']}"
        assert len(ref_cnn) == len(logs["--sync-bn"]) == 30
        first, apart = ref_cnn[0]["loss"], logs[None][0]["loss"]
        assert abs(first - apart) > 1e-3 * abs(first), f"without --sync-bn: {apart} against {first}"
        # 5: CUDA on 2 ranks.
        cuda = [run, "--nproc-per-node", "2", "--master-port", "0", train, *cnn, "--steps", "3", "--device", "cuda"]
        p = subprocess.run(cuda, env=env, capture_output=True, text=True, timeout=300)
        said = p.stdout + p.stderr
        if "CUDA is not available" in said:
            # The first rank to fail stops the other, which may not have said it yet.
            assert p.returncode != 0, said[-800:]
            assert "] kiln-train: --device cuda: CUDA is not available: " in said, said[-800:]
            cuda_note = "--device cuda on 2 ranks says why it cannot run here"
        else:
            assert p.returncode == 0 or "NCCL" in said, said[-800:]
            cuda_note = f"--device cuda on 2 ranks ran (exit {p.returncode})"
        print(f"ok: two ranks equal one process over 400 steps; interrupted after {stopped} steps and resumed; "
              f"--sync-bn equals one process with batch norm; {cuda_note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
