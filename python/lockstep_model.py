#!/usr/bin/env python3
"""Bring a PyTorch model (and numpy data) to lockstep and take the trained model back.

lockstep trains TorchScript modules (model.name = "torchscript",
model.path = "net.pt"). This helper scripts an nn.Module, checks that the
scripted module runs on a sample input and gives what the eager one gives,
and saves it. Standard library, numpy and torch only.

From Python:
    import lockstep_model
    lockstep_model.export(MyNet(), torch.zeros(8, 1, 28, 28), "net.pt")
    ...  lockstep run job.toml --set model.name=torchscript --set model.path=net.pt
    trained = lockstep_model.load_trained("runs/<run-id>/model-final.pt")
    lockstep_model.export_arrays(x, y, "train.npz")   # data.name = "arrays"

From the shell:
    python3 python/lockstep_model.py my_models.py:MyNet --input-shape 8,1,28,28 --out net.pt
"""
import argparse
import importlib.util
import os
import sys

import torch


class ExportError(Exception):
    """The module does not script, or the scripted one fails on the sample."""


def script(module):
    """torch.jit.script(module), with the reason when it cannot be scripted."""
    try:
        return torch.jit.script(module)
    except Exception as error:  # TorchScript raises several kinds
        raise ExportError(
            f"{type(module).__name__} does not script: {error}\n"
            "TorchScript needs type-annotated forward() arguments and no Python-only "
            "constructs in forward(); see https://pytorch.org/docs/stable/jit.html") from None


def _output_tensor(output, output_key):
    if isinstance(output, torch.Tensor):
        return output
    if output_key is None:
        raise ExportError(f"forward returns {type(output).__name__}, not a tensor: pass "
                          "output_key (and set model.output in the job) to pick the element")
    key = int(output_key) if isinstance(output, (tuple, list)) else output_key
    return output[key]


def check(scripted, eager, sample_input, output_key=None, sample_target=None, tolerance=1e-5):
    """Runs both on sample_input in eval mode; returns the output's shape.

    Raises ExportError when the scripted module fails, or its output differs
    from the eager module's by more than `tolerance`. With sample_target and
    a loss(output, target) method, checks that it returns one value per sample.
    """
    scripted.eval()
    eager.eval()
    with torch.no_grad():
        try:
            ours = _output_tensor(scripted(sample_input), output_key)
        except Exception as error:
            raise ExportError(f"the scripted module fails on an input of shape "
                              f"{tuple(sample_input.shape)}: {error}") from None
        theirs = _output_tensor(eager(sample_input), output_key)
        if ours.shape != theirs.shape or not torch.allclose(ours, theirs, atol=tolerance, rtol=tolerance):
            difference = (ours - theirs).abs().max().item() if ours.shape == theirs.shape else "shape"
            raise ExportError(f"scripted and eager outputs differ ({difference}); "
                              "a traced-in constant or a Python-only branch?")
        if sample_target is not None and hasattr(scripted, "loss"):
            per_sample = scripted.loss(ours, sample_target)
            if per_sample.shape != (sample_input.shape[0],):
                raise ExportError(f"loss(output, target) returned shape {tuple(per_sample.shape)}; "
                                  f"one loss per sample, ({sample_input.shape[0]},), is needed")
    scripted.train()
    eager.train()
    return tuple(ours.shape)


def export(module, sample_input, path, output_key=None, sample_target=None):
    """Scripts `module`, checks it on `sample_input`, saves it to `path`.

    Returns the output shape. The module's parameters are saved as they are
    (its initialisation is the run's); requires_grad=False ones stay frozen.
    """
    scripted = script(module)
    shape = check(scripted, module, sample_input, output_key, sample_target)
    if not any(p.requires_grad for p in scripted.parameters()):
        raise ExportError("the module has no trainable parameter (frozen, or torch.jit.freeze-d)")
    scripted.save(path)
    return shape


def export_arrays(x, y, path, compressed=False):
    """Writes inputs `x` and targets `y` (numpy arrays or tensors, one row per
    sample) as the .npz lockstep reads with data.name = "arrays" (arrays x
    and y). Class targets: integers, -1 for missing; values: floats, NaN for
    missing. Uncompressed (the default) lets lockstep memory-map the file.
    """
    import numpy as np
    x = x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    y = y.numpy() if isinstance(y, torch.Tensor) else np.asarray(y)
    if len(x) != len(y):
        raise ExportError(f"x has {len(x)} rows but y has {len(y)}; one target row per input row")
    for name, array in (("x", x), ("y", y)):
        if array.dtype.kind not in "fiub":
            raise ExportError(f"{name} has dtype {array.dtype}; numbers or bool are needed")
    x = np.ascontiguousarray(x.astype(x.dtype.newbyteorder("<")))
    y = np.ascontiguousarray(y.astype(y.dtype.newbyteorder("<")))
    (np.savez_compressed if compressed else np.savez)(path, x=x, y=y)
    return path


def load_trained(path):
    """The trained module from a run folder's model-final.pt, in eval mode."""
    module = torch.jit.load(path, map_location="cpu")
    module.eval()
    return module


def _load_class(spec):
    file_name, _, class_name = spec.partition(":")
    if not class_name:
        raise ExportError(f"'{spec}': expected FILE.py:ClassName")
    loader = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(file_name))[0],
                                                    file_name)
    if loader is None:
        raise ExportError(f"{file_name}: not a Python file")
    module = importlib.util.module_from_spec(loader)
    sys.modules[loader.name] = module  # TorchScript reads the class's source through it
    loader.loader.exec_module(module)
    if not hasattr(module, class_name):
        raise ExportError(f"{file_name} has no {class_name}")
    return getattr(module, class_name)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="FILE.py:ClassName (constructed without arguments)")
    parser.add_argument("--input-shape", required=True,
                        help="sample input shape, batch first, e.g. 8,1,28,28")
    parser.add_argument("--out", required=True, help="where to save the TorchScript module")
    parser.add_argument("--output-key", help="tuple index or dict key of the output to train on")
    parser.add_argument("--seed", type=int, default=0, help="torch.manual_seed before construction")
    args = parser.parse_args(argv)
    try:
        torch.manual_seed(args.seed)
        module = _load_class(args.model)()
        shape = [int(d) for d in args.input_shape.split(",")]
        out_shape = export(module, torch.randn(*shape), args.out, args.output_key)
    except (ExportError, ValueError, OSError) as error:
        print(f"lockstep_model: {error}", file=sys.stderr)
        return 2
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    print(f"saved {args.out}: output {out_shape} for input {tuple(shape)}, "
          f"{trainable} trainable parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
