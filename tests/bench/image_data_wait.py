#!/usr/bin/python3
"""Data wait for the image-folder example (examples/fashion_images): the
share of the training step a rank spends waiting for its next batch (the
`data` phase timer) against the step's compute and communication, with the
default decoding threads (data.workers chosen from the cores) and batches
assembled ahead, beside the same job decoding on the training thread
(data.prefetch = 0), interleaved. Prints JSON: median and spread per setting.
Usage: tests/bench/image_data_wait.py BUILD_DIR [repetitions] [steps]
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

EXAMPLE = os.path.join(SOURCE, "examples", "fashion_images")


def run(build, folder, steps, extra):
    with tempfile.TemporaryDirectory() as runs:
        command = [os.path.join(build, "lockstep"), "run", os.path.join(EXAMPLE, "job.toml")]
        sets = [f"job.run_dir={runs}", "job.epochs=0", f"job.steps={steps}", "eval.every=0",
                f"data.train={folder}/train", f"data.test={folder}/test"] + extra
        for setting in sets:
            command += ["--set", setting]
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            sys.exit(done.stdout[-4000:])
        workers = [line.split("Decision: data.workers = ")[1].split(" ")[0]
                   for line in done.stdout.splitlines() if "Decision: data.workers = " in line]
        manifest = json.load(open(glob.glob(runs + "/*/manifest.json")[0]))
        phases = manifest["phases"]
        step = phases["data"] + phases["forward_backward"] + phases["comm_wait"] + phases["optimizer"]
        return {"data_share": phases["data"] / step, "step_ms": 1000 * step / steps,
                "accuracy": manifest["metrics"]["test_accuracy"], "workers": workers[0] if workers else "?"}


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(SOURCE, "build")
    repetitions = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    settings = {"default": [], "on_the_training_thread": ["data.prefetch=0"]}
    samples = {name: {"data_share": [], "step_ms": [], "accuracy": []} for name in settings}
    workers = "?"
    with tempfile.TemporaryDirectory() as data:
        folder = os.path.join(data, "fashion-images")
        subprocess.run([sys.executable, os.path.join(EXAMPLE, "prepare.py"), folder], check=True,
                       stdout=subprocess.DEVNULL)
        files = sum(len(names) for _, _, names in os.walk(folder))
        for rep in range(repetitions):
            order = list(settings) if rep % 2 == 0 else list(reversed(list(settings)))
            for name in order:
                figures = run(build, folder, steps, settings[name])
                if name == "default":
                    workers = figures["workers"]
                for key in samples[name]:
                    samples[name][key].append(figures[key])
    result = {"benchmark": "image_data_wait",
              "setup": {"job": "examples/fashion_images/job.toml (cnn, batch 64 per rank, random_crop:2 + hflip)",
                        "files": files, "ranks": 2, "steps": steps, "cores": os.cpu_count(),
                        "data_workers_default": workers, "repetitions": repetitions,
                        "data_share": "data phase / (data + forward_backward + comm_wait + optimizer), rank 0"},
              "settings": {name: {key: summary(values) for key, values in figures.items()}
                           for name, figures in samples.items()}}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
