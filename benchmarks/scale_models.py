"""The two models of the scale benchmarks, at the size people train (issue 30).

- :func:`resnet18`: a ResNet-18 in torchvision's layout (``BasicBlock``, layers of 2, widths
  64-128-256-512, a 1x1 convolution with batch norm on each downsampling shortcut), written here
  so that torchvision is not needed, with the CIFAR stem (one 3x3 convolution of stride 1, no max
  pooling) for 32x32 inputs: 11,173,962 parameters for 10 classes. Batch norm is put in eval mode
  (a curvature measurement at a fixed point; in train mode the loss of one example depends on the
  batch).
- :func:`gpt2_decoder`: a GPT-2-shaped causal decoder built by HuggingFace ``transformers``
  (``GPT2LMHeadModel`` from a ``GPT2Config``; tied input and output embeddings): 6 layers,
  width 384, 6 heads, a vocabulary of 8192 and 128 positions, 13.8M parameters.
  ``attn_implementation="eager"``, so that every peer can differentiate it twice.

:func:`resnet_batch` and :func:`decoder_batch` draw seeded batches (random images and labels;
random tokens with the next-token targets as ``labels``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm, and the shortcut (1x1 convolution where the shape changes)."""

    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.downsample = None
        if stride != 1 or inputs != outputs:
            self.downsample = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))) + shortcut)


class ResNet18(nn.Module):
    """ResNet-18 (torchvision's layout) with the CIFAR stem, for 32x32 images."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, width = [], 64
        for outputs, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers.append(nn.Sequential(BasicBlock(width, outputs, stride), BasicBlock(outputs, outputs, 1)))
            width = outputs
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def resnet18(seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    """A seeded ResNet-18 in eval mode (batch norm with its running statistics, here the initial ones)."""
    torch.manual_seed(seed)
    return ResNet18().to(dtype).eval()


def resnet_batch(size: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """``size`` seeded random 3x32x32 images and labels in 0..9."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 3, 32, 32, generator=generator, dtype=dtype)
    return x, torch.randint(0, 10, (size,), generator=generator)


def gpt2_decoder(seed: int = 0, layers: int = 6, width: int = 384, heads: int = 6, vocab: int = 8192) -> nn.Module:
    """A seeded GPT-2-shaped ``GPT2LMHeadModel`` (float32, eval mode: dropout off)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=vocab,
        n_positions=128,
        n_embd=width,
        n_layer=layers,
        n_head=heads,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    return GPT2LMHeadModel(config).eval()


def decoder_batch(size: int, length: int = 128, seed: int = 0, vocab: int = 8192) -> dict[str, torch.Tensor]:
    """``size`` seeded random token sequences of ``length``: ``input_ids`` and next-token ``labels`` (the ids)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (size, length), generator=generator)
    return {"input_ids": ids, "labels": ids.clone()}


def n_params(model: nn.Module) -> int:
    """The number of trainable parameters (a tied weight once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
