#!/usr/bin/python3
"""One lockstep on two LibTorch versions, side by side on this machine: the
step times of compare_ddp.py (its models, 2 ranks, Gloo) for a lockstep
built against each, with the DDP of the matching PyTorch, repetitions
interleaved (old, new, old, new, ...). Figures from different sessions or
machines are never compared; this puts both in one run.
Usage: tests/bench/compare_libtorch.py OLD_BUILD OLD_PYTHON NEW_BUILD NEW_PYTHON [repetitions]
(e.g. a build of the last commit on Debian's LibTorch 1.13 with /usr/bin/python3,
against build/ with .venv/bin/python3). Prints a table to stderr and JSON to stdout.
"""
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def one_repetition(build, python):
    out = subprocess.run([python, os.path.join(HERE, "compare_ddp.py"), build, "1"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out[out.index("{"):])


def main():
    old_build, old_python, new_build, new_python = sys.argv[1:5]
    repetitions = int(sys.argv[5]) if len(sys.argv) > 5 else 3
    sides = {"old": (old_build, old_python), "new": (new_build, new_python)}
    samples = {side: [] for side in sides}
    for rep in range(repetitions):
        for side, (build, python) in sides.items():
            samples[side].append(one_repetition(build, python))
        print(f"repetition {rep + 1}/{repetitions} done", file=sys.stderr)

    def figure(values):
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    models = list(samples["new"][0]["step_ms"])
    result = {"benchmark": "lockstep and PyTorch DDP on two LibTorch versions, side by side",
              "setup": {side: samples[side][0]["setup"] for side in sides}, "repetitions": repetitions,
              "step_ms": {}}
    for model in models:
        entry = {}
        for who in ("lockstep", "ddp"):
            per = {side: [r["step_ms"][model][who]["median"] for r in samples[side]] for side in sides}
            entry[who] = {"old": figure(per["old"]), "new": figure(per["new"]),
                          "new_over_old": figure([n / o for n, o in zip(per["new"], per["old"])])}
        entry["lockstep_over_ddp"] = {side: figure([r["step_ms"][model]["ratio"]["median"] for r in samples[side]])
                                      for side in sides}
        result["step_ms"][model] = entry
        print(f"{model:9s} lockstep {entry['lockstep']['old']['median']:7.2f} -> {entry['lockstep']['new']['median']:7.2f} ms"
              f" (new/old {entry['lockstep']['new_over_old']['median']:.3f} [{entry['lockstep']['new_over_old']['min']:.3f},"
              f" {entry['lockstep']['new_over_old']['max']:.3f}])   DDP {entry['ddp']['old']['median']:7.2f} ->"
              f" {entry['ddp']['new']['median']:7.2f} ms (new/old {entry['ddp']['new_over_old']['median']:.3f})",
              file=sys.stderr)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
