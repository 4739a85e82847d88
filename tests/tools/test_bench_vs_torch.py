#!/usr/bin/env python3
"""tools/bench_vs_torch.py without PyTorch: the run order, the statistics and ratios, the
convolution shares, the JSON report and tables, and one whole run against stand-in
benchmark programs (a script that answers as kiln-bench and bench_torch.py would)."""

import importlib.util
import json
import os
import stat
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
spec = importlib.util.spec_from_file_location("bench_vs_torch", os.path.join(ROOT, "tools", "bench_vs_torch.py"))
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

# Answers as the benchmarks do: kiln-bench train|mlp-block|convs and bench_torch.py /
# bench_torch_convs.py (given as the script's first argument), with fixed times.
STAND_IN = r'''#!/usr/bin/env python3
import json, sys
args = sys.argv[1:]
script = args[0] if args and args[0].endswith(".py") else ""
if script:
    args = args[1:]
def value(option):
    return args[args.index(option) + 1]
if script.endswith("bench_torch_convs.py"):
    for s in open(args[0]):
        line = json.loads(s)
        line.update(impl="pytorch", forward_ms=1.0, backward_input_ms=2.0, backward_weight_ms=4.0)
        print(json.dumps(line))
elif script.endswith("bench_torch.py"):
    compiled = value("--modes") == "compiled"
    print(json.dumps({"mode": value("--modes"), "median_step_ms": 50.0 if compiled else 100.0,
                      "compile_s": 30.0 if compiled else None}))
elif args[0] == "convs":
    geometry = {"model": "resnet18", "batch": 2, "image_size": 16, "output": [2, 64, 8, 8], "stride": [2, 2],
                "padding": [3, 3], "dilation": [1, 1], "groups": 1, "layout": "contiguous", "gflop": 0.01}
    stem = dict(geometry, input=[2, 3, 16, 16], weight=[64, 3, 7, 7], uses=1, input_grad=False)
    body = dict(geometry, input=[2, 64, 8, 8], weight=[64, 64, 3, 3], uses=4, input_grad=True)
    for line in (stem, body):
        line["bench"] = "conv"
        if "--list" not in args:
            line.update(forward_ms=2.0, backward_input_ms=2.0, backward_weight_ms=2.0)
        print(json.dumps(line))
else:
    compiled = value("--only") == "compiled"
    print("a line that is not JSON")
    print(json.dumps({"mode": value("--only"), "median_step_ms": 40.0 if compiled else 200.0,
                      "first_call_s": 10.0 if compiled else 0.1}))
'''


class Interleave(unittest.TestCase):
    def test_every_round_runs_every_mode_once_starting_one_later(self):
        order = bench.interleave(["a", "b"], ["m0", "m1", "m2"], 3)
        self.assertEqual(len(order), 2 * 3 * 3)
        self.assertEqual([c for c, _, _ in order[:9]], ["a"] * 9)  # config by config
        rounds = [[m for c, r, m in order if c == "a" and r == k] for k in range(3)]
        self.assertEqual(rounds, [["m0", "m1", "m2"], ["m1", "m2", "m0"], ["m2", "m0", "m1"]])

    def test_commands_pin_the_mode_and_the_threads(self):
        o = bench.parse_args(["--threads", "3", "--kiln-bench", "kb", "--python", "py", "--steps", "4"])
        kiln = bench.train_command("resnet18-b64-32", "kiln_compiled", o)
        self.assertEqual(kiln[:2], ["kb", "train"])
        self.assertIn("--compile", kiln)
        self.assertEqual(kiln[kiln.index("--only") + 1], "compiled")
        self.assertEqual(kiln[kiln.index("--classes") + 1], str(bench.CLASSES))
        self.assertNotIn("--compile", bench.train_command("resnet18-b64-32", "kiln_eager", o))
        torch = bench.train_command("mlp-block-x4", "torch_compile", o)
        self.assertEqual(torch[0], "py")
        self.assertTrue(torch[1].endswith("bench_torch.py"))
        for option, v in (("--modes", "compiled"), ("--threads", "3"), ("--blocks", "4"), ("--optimizer", "adamw"),
                          ("--steps", "4")):
            self.assertEqual(torch[torch.index(option) + 1], v)
        self.assertEqual(bench.environment(3)["OMP_NUM_THREADS"], "3")

    def test_text_configs_pass_the_sequence_length_on_both_sides(self):
        o = bench.parse_args(["--kiln-bench", "kb", "--python", "py"])
        kiln = bench.train_command("bert-mini-b32-128", "kiln_compiled", o)
        self.assertEqual(kiln[:4], ["kb", "train", "--arch", "bert-mini"])
        self.assertIn("--compile", kiln)
        self.assertNotIn("--image-size", kiln)
        torch = bench.train_command("gpt2-small-b8-128", "pytorch_eager", o)
        for option, v in (("--arch", "gpt2-small"), ("--batch", "8"), ("--seq", "128"), ("--modes", "eager")):
            self.assertEqual(torch[torch.index(option) + 1], v)
        self.assertNotIn("--image-size", torch)
        self.assertEqual(bench.conv_models(["bert-mini-b32-128", "resnet18-b64-32"]), ["resnet18:64:32"])

    def test_unknown_configs_and_modes_are_refused(self):
        with self.assertRaises(SystemExit):
            bench.parse_args(["--configs", "resnet9"])
        with self.assertRaises(SystemExit):
            bench.parse_args(["--modes", "jit"])


class Statistics(unittest.TestCase):
    def test_spread(self):
        self.assertEqual(bench.spread([3.0, 1.0, 2.0, 10.0]), {"median": 2.5, "min": 1.0, "max": 10.0})
        self.assertEqual(bench.spread([4.0])["median"], 4.0)
        self.assertIsNone(bench.spread([]))

    def test_step_result_takes_the_last_timed_line(self):
        out = 'noise\n{"mode":"eager","median_step_ms":5}\n{"mode":"eager","error":"x","median_step_ms":1}\n'
        self.assertEqual(bench.step_result(out)["median_step_ms"], 5)
        self.assertIsNone(bench.step_result("nothing timed"))

    def test_summary_medians_ranges_and_ratios(self):
        runs = {
            "pytorch_eager": [{"median_step_ms": 100.0}, {"median_step_ms": 120.0}, {"median_step_ms": 110.0}],
            "torch_compile": [{"median_step_ms": 80.0, "compile_s": 40.0}, None, {"median_step_ms": 90.0,
                                                                                 "compile_s": 20.0}],
            "kiln_eager": [{"median_step_ms": 220.0, "first_call_s": 1.0}] * 3,
            "kiln_compiled": [{"median_step_ms": 85.0, "first_call_s": 15.0}] * 3,
        }
        r = bench.summarize_train("resnet18-b64-32", runs)
        eager = r["modes"]["pytorch_eager"]
        self.assertEqual((eager["median_step_ms"], eager["min_step_ms"], eager["max_step_ms"]), (110.0, 100.0, 120.0))
        self.assertEqual(eager["samples_per_s"], round(64 * 1000 / 110.0, 1))
        self.assertNotIn("compile_s", eager)
        self.assertNotIn("compile_s", r["modes"]["kiln_eager"])
        self.assertEqual(r["modes"]["torch_compile"]["rounds"], 2)  # the failed round is left out
        self.assertEqual(r["modes"]["torch_compile"]["compile_s"]["median"], 30.0)
        self.assertEqual(r["ratios"]["kiln_compiled_vs_torch_compile"], round(85 / 85, 3))
        self.assertEqual(r["ratios"]["kiln_compiled_vs_pytorch_eager"], round(85 / 110, 3))
        self.assertEqual(r["ratios"]["kiln_eager_vs_pytorch_eager"], 2.0)
        self.assertEqual(r["ratios"]["kiln_compile_s_vs_torch_compile_s"], 0.5)
        json.dumps(r)
        table = bench.train_table([r])
        self.assertIn("torch.compile", table)
        self.assertIn("0.77", table)

    def test_a_mode_without_results_is_an_error_not_a_ratio(self):
        r = bench.summarize_train("resnet18-b64-32", {"pytorch_eager": [None], "kiln_eager": [{"median_step_ms": 1}]})
        self.assertIn("error", r["modes"]["pytorch_eager"])
        self.assertIsNone(r["ratios"]["kiln_eager_vs_pytorch_eager"])
        self.assertIn("no run finished", bench.train_table([r]))


class Convs(unittest.TestCase):
    def shape(self, weight, uses, input_grad, **times):
        line = {"model": "resnet18", "batch": 2, "image_size": 16, "input": [2, 3, 16, 16], "weight": weight,
                "output": [2, 64, 8, 8], "stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1,
                "uses": uses, "input_grad": input_grad, "layout": "contiguous", "gflop": 0.1, "bench": "conv"}
        return dict(line, **times)

    def test_shares_count_uses_and_skip_the_stems_input_gradient(self):
        stem, body = self.shape([64, 3, 7, 7], 1, False), self.shape([64, 64, 3, 3], 3, True)
        kiln = [dict(s, forward_ms=f, backward_input_ms=1.0, backward_weight_ms=1.0)
                for s, f in ((stem, 2.0), (body, 1.0), (stem, 4.0), (body, 1.0))]  # two rounds
        torch = [dict(s, forward_ms=1.0, backward_input_ms=1.0, backward_weight_ms=2.0) for s in (stem, body)]
        r = bench.summarize_convs([stem, body], {"kiln": kiln, "pytorch": torch})
        first, second = r["shapes"]
        self.assertEqual(first["kiln"]["forward_ms"], 3.0)  # the median of 2 and 4
        self.assertEqual(first["kiln"]["step_ms"], 4.0)  # forward 3 + weight 1, no input gradient
        self.assertEqual(second["kiln"]["step_ms"], 9.0)  # 3 uses x 3 passes of 1
        self.assertEqual(r["step_conv_ms"], {"kiln": 13.0, "pytorch": 3.0 + 12.0})
        self.assertAlmostEqual(first["kiln"]["share"] + second["kiln"]["share"], 1.0, places=3)
        self.assertEqual(first["ratios"], {"forward": 3.0, "backward_input": 1.0, "backward_weight": 0.5})
        table = bench.conv_table("resnet18:2:16", r)
        self.assertIn("3.00/1.00 (3.00)", table)
        self.assertIn("(1.00/1.00 (1.00))", table)  # the stem's input gradient, bracketed
        json.dumps(r)


class WholeRun(unittest.TestCase):
    def test_a_run_against_stand_in_programs(self):
        with tempfile.TemporaryDirectory() as d:
            program = os.path.join(d, "stand_in")
            with open(program, "w") as f:
                f.write(STAND_IN.replace("/usr/bin/env python3", sys.executable))
            os.chmod(program, os.stat(program).st_mode | stat.S_IEXEC)
            common = ["--kiln-bench", program, "--python", program, "--rounds", "2", "--threads", "1"]
            out = os.path.join(d, "train.json")
            self.assertEqual(bench.main(["--configs", "resnet18-b64-32,mlp-block-x4", "--out", out] + common), 0)
            with open(out) as f:
                report = json.load(f)
            self.assertEqual([r["config"] for r in report["reports"]], ["resnet18-b64-32", "mlp-block-x4"])
            r = report["reports"][0]
            self.assertEqual(r["modes"]["kiln_compiled"]["rounds_ms"], [40.0, 40.0])
            self.assertEqual(r["ratios"]["kiln_compiled_vs_torch_compile"], 0.8)
            self.assertEqual(r["ratios"]["kiln_eager_vs_pytorch_eager"], 2.0)
            self.assertEqual(r["ratios"]["kiln_compile_s_vs_torch_compile_s"], round(10 / 30, 3))
            out = os.path.join(d, "convs.json")
            self.assertEqual(bench.main(["--bench", "convs", "--configs", "resnet18-b64-32", "--out", out] + common), 0)
            with open(out) as f:
                convs = json.load(f)["models"]["resnet18:64:32"]
            self.assertEqual(len(convs["shapes"]), 2)
            self.assertEqual(convs["shapes"][1]["ratios"]["backward_weight"], 0.5)
            self.assertEqual(convs["step_conv_ms"], {"kiln": 4.0 + 4 * 6.0, "pytorch": 5.0 + 4 * 7.0})


if __name__ == "__main__":
    unittest.main()
