#!/usr/bin/python3
"""bf16 against fp32 on this machine: the cnn on Fashion-MNIST (synthetic data
when the dataset is not installed), 2 ranks, `steps` steps each, fp32 and
bf16 runs interleaved. Prints JSON: the per-repetition ratio of the median
step time bf16/fp32 (median and spread), both test accuracies, and the probe
table precision = auto decides from.
Usage: tests/bench/precision.py BUILD_DIR [repetitions] [steps]
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from compare_ddp import summary  # noqa: E402  (median and spread, the same for every benchmark)

FASHION = "/usr/share/datasets/fashion-mnist"


def run(build, precision, steps):
    job = "fashion_mnist_cnn.toml" if os.path.isdir(FASHION) else "synthetic.toml"
    with tempfile.TemporaryDirectory() as runs:
        command = [os.path.join(build, "lockstep"), "run", os.path.join(SOURCE, "examples", job),
                   "--nproc", "2"]
        sets = [f"job.run_dir={runs}", "job.epochs=0", f"job.steps={steps}", "eval.every=0",
                "model.name=cnn", f"precision={precision}", "precision.allow_emulated=true"]
        for setting in sets:
            command += ["--set", setting]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        metrics = json.load(open(glob.glob(runs + "/*/manifest.json")[0]))["metrics"]
        return metrics["step_s_median"], metrics["test_accuracy"], job


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(SOURCE, "build")
    repetitions = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 150
    probe = json.loads(subprocess.run([os.path.join(build, "lockstep"), "probe", "--json"], check=True,
                                      capture_output=True, text=True).stdout)
    ratios, accuracy = [], {"fp32": [], "bf16": []}
    job = ""
    for rep in range(repetitions):
        order = ("fp32", "bf16") if rep % 2 == 0 else ("bf16", "fp32")  # neither always goes first
        step = {}
        for precision in order:
            step[precision], acc, job = run(build, precision, steps)
            accuracy[precision].append(acc)
        ratios.append(step["bf16"] / step["fp32"])
    result = {"benchmark": "precision",
              "setup": {"model": "cnn", "job": job, "ranks": 2, "steps": steps,
                        "cpu": probe["fingerprint"].get("cpu_model"),
                        "bf16_flags": [f for f in probe["fingerprint"].get("cpu_flags", [])
                                       if f in ("avx512_bf16", "amx_bf16")],
                        "cores": os.cpu_count(), "repetitions": repetitions,
                        "libtorch": probe["fingerprint"].get("libtorch")},
              "step_time_bf16_over_fp32": summary(ratios),
              "test_accuracy_fp32": summary(accuracy["fp32"]),
              "test_accuracy_bf16": summary(accuracy["bf16"]),
              "probe": probe["rows"]}
    r = result["step_time_bf16_over_fp32"]
    print(f"cnn step time bf16/fp32: {r['median']:.2f} [{r['min']:.2f}, {r['max']:.2f}]; test accuracy "
          f"fp32 {result['test_accuracy_fp32']['median']:.4f}, bf16 {result['test_accuracy_bf16']['median']:.4f}",
          file=sys.stderr)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
