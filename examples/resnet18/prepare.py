#!/usr/bin/env python3
"""torchvision's resnet18 (random init, 10 classes) for Fashion-MNIST, as a
TorchScript file lockstep trains.

Fashion-MNIST is grey: the module repeats the one channel three times in
front of the unchanged torchvision network. Usage:
    .venv/bin/python3 examples/resnet18/prepare.py [OUT.pt]   (default runs/resnet18.pt)
"""
import os
import sys

import torch
import torchvision

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import lockstep_model  # noqa: E402


class GreyResNet18(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torchvision.models.resnet18(weights=None, num_classes=10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.expand(-1, 3, -1, -1))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "runs/resnet18.pt"
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    torch.manual_seed(0)
    model = GreyResNet18()
    shape = lockstep_model.export(model, torch.randn(8, 1, 28, 28), out)
    trainable = sum(p.numel() for p in model.parameters())
    print(f"saved {out}: torchvision resnet18, output {shape} for input (8, 1, 28, 28), "
          f"{trainable} parameters, {sum(1 for _ in model.buffers())} buffers (BatchNorm)")


if __name__ == "__main__":
    main()
