"""int8 post-training-quantized (PT2E) models for tests, the demo and benchmarks, built from a seed.

    from llmc.models import quantized
    model, args = quantized.build("convnet")               # float nn.Module and example inputs
    q = quantized.pt2e(model, args, scheme="x86")          # PT2E-converted (Q/DQ) GraphModule
    quantized.save(q, args, "convnet_int8.pt2")            # what `llmc compile convnet_int8.pt2` reads

A converted model is float aten ops (conv2d, linear, ...) between
`quantized_decomposed.quantize_per_tensor` / `dequantize_per_tensor` / `dequantize_per_channel`, with
int8 weights as constants: the stable form llmc compiles (docs/int8.md). Two quantizers, the two
activation signednesses people ship:
  - "xnnpack": signed int8 activations (asymmetric, zero point in [-128, 127]), symmetric per-channel
    int8 weights; the XNNPACK-style quantizer (in torchao only under torchao.testing);
  - "x86": X86InductorQuantizer's default, unsigned uint8 activations (zero point in [0, 255]),
    symmetric per-channel int8 weights.

Quantizing needs torchao (`pip install torchao==0.18.0`; torch 2.13 moved PT2E there); compiling or
running a saved .pt2 does not.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn as nn

SCHEMES = ("xnnpack", "x86")


class ConvNet(nn.Module):
    """conv-bn-relu blocks, max and average pooling, a linear head: a small image classifier whose
    weights (about 1.2 MB in f32) outweigh the compiled code."""

    def __init__(self, widths=(32, 64, 128), classes=10):
        super().__init__()
        layers, c = [], 3
        for i, w in enumerate(widths):
            layers += [nn.Conv2d(c, w, 3, stride=1 if i == 0 else 2, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU()]
            layers += [nn.Conv2d(w, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU()]
            if i == 0:
                layers.append(nn.MaxPool2d(2))
            c = w
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1))
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


class MLP(nn.Module):
    def __init__(self, dim=256, hidden=512, layers=3, classes=10):
        super().__init__()
        dims = [dim] + [hidden] * layers
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


class LinearStack(nn.Module):
    """n x Linear(dim, dim): the benchmark's int8 matmul workload."""

    def __init__(self, dim=1024, n=4):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(dim, dim) for _ in range(n)])

    def forward(self, x):
        return self.layers(x)


def build(name: str, seed: int = 0, batch: int | None = None):
    """(float module in eval mode, example args) for "convnet", "mlp" or "linear-stack". BatchNorm
    statistics are drawn from the seed too, so folding them into the convolutions is not a no-op."""
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        if name == "convnet":
            model, args = ConvNet(), (torch.randn(batch or 4, 3, 32, 32, generator=g),)
        elif name == "mlp":
            model, args = MLP(), (torch.randn(batch or 8, 256, generator=g),)
        elif name == "linear-stack":
            model, args = LinearStack(), (torch.randn(batch or 64, 1024, generator=g),)
        else:
            raise ValueError(f"unknown model {name!r}; choose convnet, mlp or linear-stack")
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.rand(m.num_features, generator=g) * 0.4 - 0.2)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.rand(m.num_features, generator=g) * 0.2 - 0.1)
    return model.eval(), args


def _torchao():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torchao.quantization.pt2e import quantize_pt2e  # noqa: F401
    except ImportError as e:
        raise ImportError("quantizing a model needs torchao: pip install torchao==0.18.0 (PT2E moved there in torch 2.13)") from e


def quantizer(scheme: str):
    """The torchao quantizer for a scheme (see the module docstring), per-channel weights."""
    _torchao()
    if scheme == "xnnpack":
        from torchao.testing.pt2e._xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config

        return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    if scheme == "x86":
        from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
            X86InductorQuantizer,
            get_default_x86_inductor_quantization_config,
        )

        return X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
    raise ValueError(f"unknown quantization scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")


def pt2e(model: nn.Module, args: tuple, scheme: str = "xnnpack", calibration: int = 8, seed: int = 0):
    """The PT2E flow: export, prepare with the scheme's quantizer, calibrate on `calibration` seeded
    batches shaped like `args`, convert. Returns the converted GraphModule (Q/DQ form)."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    q = quantizer(scheme)
    graph = torch.export.export(model, args).module()
    prepared = prepare_pt2e(graph, q)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for _ in range(calibration):
            prepared(*[torch.randn(a.shape, generator=g, dtype=a.dtype) for a in args])
    return convert_pt2e(prepared)


def save(converted, args: tuple, path) -> None:
    """Export the converted model again and save it as a .pt2 (`llmc compile PATH`)."""
    torch.export.save(torch.export.export(converted, args), str(path))
