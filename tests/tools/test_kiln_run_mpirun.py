#!/usr/bin/env python3
"""kiln programs launched by Open MPI's mpirun, as they are (ctest runs it).

kiln reads mpirun's OMPI_COMM_WORLD_* variables (dist/launch_env.h); every rank runs on
this machine, so MASTER_ADDR may be left out (127.0.0.1); MASTER_PORT is set to a free port
(-x) so that parallel test runs do not meet on the default 29500.

1. Three ranks run the collectives test case (tests/dist/test_collectives.cpp, "rank:
   collectives"): each rank checks every collective against the reference it computes from
   all ranks' data, so the ranks agree or the case fails.
2. Two ranks of kiln-train train the small CNN on the shapes data (--sync-bn, one backward
   per step) and log the step losses and accuracies of one process with the whole batch:
   relative 1e-4 on the loss (f32 sums in another order over a 20-step chain, as
   test_kiln_run_train.py's batch-norm case), accuracies equal; only rank 0 prints
   (--tag-output marks each line with its rank).

usage: test_kiln_run_mpirun.py MPIRUN KILN_TRAIN KILN_TESTS_DIST
Exits 77 (a skip for ctest) when mpirun is missing.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

RTOL = 1e-4
TRAIN = ["--data", "shapes", "--arch", "cnn", "--image-size", "16", "--train-samples", "256", "--batch", "16",
         "--micro-batch", "16", "--sync-bn", "--steps", "20", "--lr", "0.05", "--workers", "0", "--seed", "3",
         "--print-every", "1"]


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mpirun_command(mpirun, n):
    cmd = [mpirun, "-np", str(n), "--oversubscribe", "--bind-to", "none", "--tag-output",
           "-x", f"MASTER_PORT={free_port()}", "-x", "OMP_NUM_THREADS=1"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")  # containers and CI run as root; mpirun refuses it otherwise
    return cmd


def step_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if '"loss"' in line]


def main():
    mpirun, train, tests = sys.argv[1:4]
    if not mpirun or mpirun.endswith("NOTFOUND") or not shutil.which(mpirun):
        print("skipped: no mpirun (install openmpi-bin: third_party/install-deps.sh)")
        return 77
    # mpirun passes its own environment on; none of kiln-run's or torchrun's variables, so
    # that kiln reads Open MPI's.
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"

    # 1. The collectives on three ranks.
    done = subprocess.run(mpirun_command(mpirun, 3) + [tests, "rank: collectives"], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"mpirun -np 3 collectives: exit {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-2000:]}"
    passed = [line for line in done.stdout.splitlines() if "All tests passed" in line]
    assert len(passed) == 3, done.stdout[-3000:]

    # 2. kiln-train on two ranks against one process.
    with tempfile.TemporaryDirectory() as tmp:
        cache = ["--cache-dir", os.path.join(tmp, "cache")]
        one = os.path.join(tmp, "one.jsonl")
        subprocess.run([train, *TRAIN, *cache, "--log", one], env=env, check=True, stdout=subprocess.DEVNULL,
                       timeout=300)
        two = os.path.join(tmp, "two.jsonl")
        done = subprocess.run(mpirun_command(mpirun, 2) + [train, *TRAIN, *cache, "--log", two], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"mpirun -np 2 kiln-train: exit {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-2000:]}"
        out = done.stdout
        assert "data parallel: 2 ranks" in out, out[:800]
        tags = {line.split("]")[0] for line in out.splitlines() if line.startswith("[1,")}
        assert tags == {"[1,0"}, f"lines from {tags}:\n{out[:800]}"
        reference, ranks = step_lines(one), step_lines(two)
        assert len(reference) == len(ranks) == 20, (len(reference), len(ranks))
        for x, y in zip(reference, ranks):
            assert x["step"] == y["step"], (x, y)
            assert abs(x["loss"] - y["loss"]) <= RTOL * abs(x["loss"]), f"step {x['step']}: loss {y['loss']} against {x['loss']}"
            assert x["accuracy"] == y["accuracy"], f"step {x['step']}: accuracy {y['accuracy']} against {x['accuracy']}"
    print("ok: mpirun -np 3 ran the collectives on every rank; mpirun -np 2 kiln-train equals one process over 20 steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
