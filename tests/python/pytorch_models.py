#!/usr/bin/env python3
"""The models a lab writes in PyTorch, scripted by the torch of this
Python (the project's .venv: the same torch lockstep links) for
Fashion-MNIST's [B, 1, 28, 28] input:

  pytorch_models.py OUT_DIR   OUT_DIR/resnet18.pt      torchvision's resnet18 (examples/resnet18)
                              OUT_DIR/transformer.pt   rows as 28 tokens -> a 2-layer nn.TransformerEncoder
Prints {"torch": version, "models": [...]}.
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "resnet18"))
import lockstep_model  # noqa: E402
from prepare import GreyResNet18  # noqa: E402


class RowTransformer(torch.nn.Module):
    """Each image's 28 rows as 28 tokens of 28 pixels, a 2-layer
    nn.TransformerEncoder (d_model 64, 4 heads), the mean token to 10 classes."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(28, 64)
        layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.1,
                                                 batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, num_layers=2)
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x.reshape(x.shape[0], 28, 28))
        return self.head(self.encoder(tokens).mean(dim=1))


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    sample = torch.randn(8, 1, 28, 28)
    lockstep_model.export(GreyResNet18(), sample, os.path.join(out, "resnet18.pt"))
    # Checked against the eager module in eval mode (dropout off); saved as it is.
    lockstep_model.export(RowTransformer().eval(), sample, os.path.join(out, "transformer.pt"))
    print(json.dumps({"torch": torch.__version__, "models": ["resnet18.pt", "transformer.pt"]}))


if __name__ == "__main__":
    main(sys.argv[1])
