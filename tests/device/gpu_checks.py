"""The GPU checks behind tests/device/run.sh (which sets up the libraries).

Each check runs the real lockstep on the GPU and reads what it printed and
wrote (the decisions, the manifest's figures); the benchmark interleaves
lockstep and PyTorch DDP on the same GPU, same model, batch and precision.
Prints one JSON object: the checks (passed, and why not), the figures, the
exact setup. Budget: about 6 minutes on an H100.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

CHECKS = []


def check(name, passed, detail):
    CHECKS.append({"check": name, "passed": bool(passed), "detail": detail})
    print(("PASS " if passed else "FAIL ") + name + ": " + str(detail)[:300], file=sys.stderr)


def lockstep_run(args, job, sets, nproc, timeout=240, extra_args=()):
    """Runs `lockstep run JOB --nproc N --set ...` in a fresh run folder."""
    runs = tempfile.mkdtemp(dir=args.out, prefix="runs-")
    command = [args.lockstep, "run", job, "--nproc", str(nproc), *extra_args]
    for setting in [f"job.world_size={nproc}", f"job.run_dir={runs}", *sets]:
        command += ["--set", setting]
    started = time.time()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        output, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as e:
        output, code = (e.stdout or b"").decode() + (e.stderr or b"").decode(), 124
    wall = time.time() - started
    folders = sorted(glob.glob(os.path.join(runs, "*")))
    manifest = {}
    if folders and os.path.exists(os.path.join(folders[-1], "manifest.json")):
        with open(os.path.join(folders[-1], "manifest.json")) as f:
            manifest = json.load(f)
    with open(os.path.join(runs, "output.txt"), "w") as f:
        f.write(output)
    return {"code": code, "output": output, "wall_s": wall, "manifest": manifest,
            "folder": folders[-1] if folders else None, "metrics": manifest.get("metrics", {})}


def has(result, text):
    return text in result["output"]


def decision(result, what):
    for line in result["output"].splitlines():
        at = line.find("Decision: " + what + " = ")
        if at >= 0:
            return line[at + len("Decision: "):]
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lockstep", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()
    fashion = os.path.join(args.source, "examples/fashion_mnist_cnn.toml")
    synthetic = os.path.join(args.source, "examples/synthetic.toml")
    gpu = torch.cuda.get_device_name(0)
    figures = {}

    version = subprocess.run([args.lockstep, "--version"], capture_output=True, text=True).stdout.strip()
    check("version-names-cuda-and-nccl", "CUDA" in version and "NCCL data group compiled in" in version, version)

    # The probe measures the GPU's dtypes next to the CPU's.
    cache = tempfile.mkdtemp(dir=args.out, prefix="probe-")
    probe = subprocess.run([args.lockstep, "probe", "--json"], capture_output=True, text=True, timeout=240,
                           env=dict(os.environ, LOCKSTEP_CACHE_DIR=cache))
    try:
        rows = [r for r in json.loads(probe.stdout)["rows"] if r["device"].startswith("cuda")]
    except (ValueError, KeyError):
        rows = []
    figures["probe_cuda_tflops"] = {f'{r["dtype"]} {r["op"]}': r.get("tflops") for r in rows}
    check("probe-measures-the-gpu", any(r["dtype"] == "bf16" and (r.get("tflops") or 0) > 0 for r in rows),
          figures["probe_cuda_tflops"] or probe.stderr[-500:])

    # 1. The cnn on Fashion-MNIST on the GPU in bf16, audits on: one rank.
    common = [f"data.path={args.data}", "job.epochs=1", "eval.every=0", "audit.every=50", "job.log_every=100"]
    one = lockstep_run(args, fashion, common + ["device=gpu", "precision=bf16"], 1)
    m = one["metrics"]
    figures["cnn_fashion_bf16_1rank"] = {"exit": one["code"], "test_accuracy": m.get("test_accuracy"),
                                        "steps": m.get("steps"), "step_s_median": m.get("step_s_median"),
                                        "audits": m.get("audits"), "wall_s": round(one["wall_s"], 1)}
    check("cnn-bf16-on-the-gpu", one["code"] == 0 and (m.get("test_accuracy") or 0) > 0.8
          and decision(one, "device") and decision(one, "device").startswith("device = cuda:0")
          and (decision(one, "precision") or "").startswith("precision = bf16")
          and (decision(one, "comm.backend") or "").startswith("comm.backend = nccl")
          and decision(one, "batch_copies") is not None and m.get("audits_disagreeing") == 0,
          {"figures": figures["cnn_fashion_bf16_1rank"],
           "decisions": [decision(one, w) for w in ("device", "comm.backend", "precision", "batch_copies", "nccl_wait")],
           "tail": one["output"][-400:] if one["code"] else ""})

    # 2. Two ranks on the one GPU: NCCL cannot, Gloo reduces the CUDA tensors.
    two = lockstep_run(args, fashion, common + ["device=gpu", "precision=bf16"], 2)
    m = two["metrics"]
    figures["cnn_fashion_bf16_2ranks_one_gpu"] = {"exit": two["code"], "test_accuracy": m.get("test_accuracy"),
                                                 "step_s_median": m.get("step_s_median"),
                                                 "audits": m.get("audits"),
                                                 "audits_disagreeing": m.get("audits_disagreeing"),
                                                 "wall_s": round(two["wall_s"], 1)}
    check("two-ranks-share-the-gpu-on-gloo", two["code"] == 0 and (m.get("test_accuracy") or 0) > 0.8
          and "NCCL refuses two ranks" in (decision(two, "comm.backend") or "")
          and m.get("audits", 0) > 0 and m.get("audits_disagreeing") == 0,
          {"figures": figures["cnn_fashion_bf16_2ranks_one_gpu"], "backend": decision(two, "comm.backend"),
           "tail": two["output"][-400:] if two["code"] else ""})
    refused = lockstep_run(args, synthetic, ["device=gpu", "comm.backend=nccl", "job.steps=5"], 2, timeout=120)
    check("nccl-with-two-ranks-on-one-gpu-is-refused", refused["code"] == 2 and has(refused, "NCCL refuses two ranks"),
          refused["output"][-300:])

    # 2b. Checking the arithmetic on the GPU (digests taken where the
    # gradients live): a flipped bit is caught by the cross-check, and a clean
    # 2-rank run (dropout in the cnn) replays on one GPU rank to the same digests.
    arithmetic = ["device=gpu", "model.name=cnn", "job.steps=20", "precision=fp32"]
    flipped = lockstep_run(args, synthetic, arithmetic + ["audit.verify_every=5",
                                                          "fault.inject=bitflip_grad:conv1.weight:1:10"], 2, timeout=180)
    check("cross-check-catches-a-flipped-bit-on-the-gpu",
          flipped["code"] == 1 and has(flipped, "MISCOMPUTE at step 10, microbatch 1: rank 1"), flipped["output"][-400:])
    clean = lockstep_run(args, synthetic, arithmetic + ["audit.verify_every=1"], 2, timeout=180)
    replay = subprocess.run([args.lockstep, "verify", clean["folder"] or "."], capture_output=True, text=True,
                            timeout=240)
    figures["gpu_cross_checks"] = {"cross_checks": clean["metrics"].get("cross_checks"),
                                   "verify_exit": replay.returncode, "verify": replay.stderr[-300:]}
    check("a-gpu-run-verifies-on-one-gpu-rank", clean["code"] == 0 and clean["metrics"].get("cross_checks") == 20
          and replay.returncode == 0 and "VERIFIED steps 1 to 20" in replay.stdout + replay.stderr,
          figures["gpu_cross_checks"])

    # 3. fp16 with the gradient scaler.
    half = lockstep_run(args, fashion, common + ["device=gpu", "precision=fp16"], 1)
    m = half["metrics"]
    figures["cnn_fashion_fp16_1rank"] = {"exit": half["code"], "test_accuracy": m.get("test_accuracy"),
                                        "scaler": m.get("scaler"), "step_s_median": m.get("step_s_median")}
    check("fp16-with-the-scaler", half["code"] == 0 and (m.get("test_accuracy") or 0) > 0.8
          and (decision(half, "grad_scaler") or "").startswith("grad_scaler = on"),
          figures["cnn_fashion_fp16_1rank"])

    # 4. A checkpoint written on the GPU resumes on the CPU, and the other way round.
    for first, then in (("gpu", "cpu"), ("cpu", "gpu")):
        sets = ["model.name=cnn", "checkpoint.every=10", "job.steps=20", f"device={first}"]
        written = lockstep_run(args, synthetic, sets, 1, timeout=120)
        resumed = {"code": -1, "output": ""}
        if written["folder"]:
            resumed = lockstep_run(args, synthetic, ["model.name=cnn", "checkpoint.every=10", "job.steps=30",
                                                     f"device={then}"], 1, timeout=120,
                                   extra_args=("--resume", written["folder"]))
        moved = decision(resumed, "checkpoint_device") or ""
        check(f"checkpoint-{first}-resumes-on-{then}", written["code"] == 0 and resumed["code"] == 0
              and ("cuda:0 -> cpu" if first == "gpu" else "cpu -> cuda:0") in moved,
              moved or (written["output"] + resumed["output"])[-400:])
        if first == "gpu" and written["folder"]:
            # model-final.pt of a GPU run loads where there is no GPU: its tensors are on the CPU.
            model = torch.jit.load(os.path.join(written["folder"], "model-final.pt"))
            devices = sorted({str(p.device) for p in model.parameters()})
            check("model-final-of-a-gpu-run-is-on-the-cpu", devices == ["cpu"], devices)

    # 5. Step time against PyTorch DDP on the same GPU: the cnn, batch 64 per
    # rank, bf16, synthetic data (no disk in the figure), interleaved.
    ddp_script = os.path.join(args.source, "tests/bench/ddp_reference.py")
    steps = 200
    pairs = {"1 rank, nccl": (1, "nccl"), "2 ranks on one GPU, gloo": (2, "gloo")}
    for label, (ranks, backend) in pairs.items():
        ours, theirs = [], []
        for _ in range(args.repetitions):
            run = lockstep_run(args, synthetic, ["model.name=cnn", "data.batch_size=64", f"job.steps={steps}",
                                                 "device=gpu", "precision=bf16", "audit.every=0",
                                                 "eval.every=0", f"job.log_every={steps // 2}",
                                                 "data.synthetic_samples=8192"], ranks)
            if run["code"] == 0 and run["metrics"].get("step_s_median"):
                ours.append(run["metrics"]["step_s_median"])
            ddp = subprocess.run([sys.executable, ddp_script, "--model", "cnn", "--ranks", str(ranks),
                                  "--steps", str(steps), "--device", "cuda", "--backend", backend,
                                  "--precision", "bf16"], capture_output=True, text=True, timeout=240)
            try:
                theirs.append(json.loads(ddp.stdout.strip().splitlines()[-1])["step_s_median"])
            except (ValueError, IndexError, KeyError):
                print("DDP failed: " + ddp.stderr[-500:], file=sys.stderr)

        def summary(times):
            return {"median_ms": round(1000 * statistics.median(times), 3),
                    "spread_ms": [round(1000 * min(times), 3), round(1000 * max(times), 3)],
                    "runs": len(times)} if times else None

        figures[f"step_time {label}"] = {
            "lockstep": summary(ours), "pytorch_ddp": summary(theirs),
            "ratio_lockstep_over_ddp": round(statistics.median(ours) / statistics.median(theirs), 3)
            if ours and theirs else None}
        check(f"benchmark-ran ({label})", bool(ours) and bool(theirs), figures[f"step_time {label}"])

    result = {"gpu": gpu, "capability": list(torch.cuda.get_device_capability(0)), "torch": torch.__version__,
              "cuda": torch.version.cuda, "lockstep": version, "checks": CHECKS, "figures": figures,
              "passed": all(c["passed"] for c in CHECKS),
              "setup": {"fashion_job": "examples/fashion_mnist_cnn.toml, 1 epoch, batch 64 per rank, audit every 50",
                        "benchmark": f"cnn, synthetic data, batch 64 per rank, bf16, {steps} steps, median "
                                     f"step after warm-up, {args.repetitions} interleaved repetitions"}}
    print(json.dumps(result, indent=1))
    with open(os.path.join(args.out, "device.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
