"""Host time of one eager PyTorch GPT layer pass with tiny tensors (the prior of ``layer_host_s``).

A GPT layer built from plain torch modules (LayerNorm, fused QKV Linear, scaled-dot-product
attention, output projection, GELU MLP, dropout, residual adds) runs forward + backward on tiny CPU
tensors, one thread: the time is the framework's Python, dispatch and autograd bookkeeping, not
arithmetic. Megatron-Core with Transformer Engine runs more Python per layer (module hierarchy,
TE's module logic), so this is a lower bound for ``EfficiencyFactors.layer_host_s``.

Usage: ``python benchmarks/bench_layer_host.py`` (prints ms per layer pass; report the load average).
"""

from __future__ import annotations

import os
import time

import torch

HIDDEN, HEADS, LAYERS, TOKENS, REPEATS = 64, 4, 12, 8, 200


class Layer(torch.nn.Module):
    """A pre-norm GPT layer of plain torch modules."""

    def __init__(self) -> None:
        super().__init__()
        h = HIDDEN
        self.ln1, self.ln2 = torch.nn.LayerNorm(h), torch.nn.LayerNorm(h)
        self.qkv, self.proj = torch.nn.Linear(h, 3 * h), torch.nn.Linear(h, h)
        self.fc1, self.fc2 = torch.nn.Linear(h, 4 * h), torch.nn.Linear(4 * h, h)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = (z.view(b, t, HEADS, -1).transpose(1, 2) for z in self.qkv(self.ln1(x)).chunk(3, -1))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, h)
        x = x + self.drop(self.proj(a))
        return x + self.drop(self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x)))))


def main() -> None:
    """Print host milliseconds per layer for forward + backward and for forward alone."""
    torch.set_num_threads(1)
    layers = [Layer() for _ in range(LAYERS)]
    x = torch.randn(1, TOKENS, HIDDEN, requires_grad=True)

    def step() -> None:
        y = x
        for layer in layers:
            y = layer(y)
        y.sum().backward()

    for _ in range(20):
        step()
    t0 = time.perf_counter()
    for _ in range(REPEATS):
        step()
    both = (time.perf_counter() - t0) / REPEATS / LAYERS
    t0 = time.perf_counter()
    for _ in range(REPEATS):
        y = x
        for layer in layers:
            y = layer(y)
    fwd = (time.perf_counter() - t0) / REPEATS / LAYERS
    print(f"eager torch GPT layer, host time: forward + backward {both * 1e3:.2f} ms, forward (with autograd "
          f"recording) {fwd * 1e3:.2f} ms per layer; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
