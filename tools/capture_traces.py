"""Capture the bundled PyTorch allocation traces in ``numba_bfc/traces/data/``.

Each trace is the CPU allocator's allocation stream of one seeded,
deterministic PyTorch workload (torch only), as ``capture_torch`` records it
with ``torch.profiler`` (``profile_memory=True``). Everything a workload uses,
model and optimizer included, is built inside the captured function and
dropped at its end, so the trace is self-contained. Each workload runs once
unprofiled first, so that any one-time lazy initialisation inside PyTorch
stays out (with torch 2.13.0 the traces are the same without it).

Three tiny workloads (a few MiB live; quick to replay, for tests):

* ``cnn_train``: 8 Adam training steps of a 3-block conv net (conv, batch
  norm, ReLU; 16/32/64 channels) on batches of 16 random 3x32x32 images with
  10 classes.
* ``transformer_train``: 8 AdamW training steps of a 2-layer
  ``nn.TransformerEncoder`` causal language model (vocabulary 256, width 64,
  4 heads, feed-forward 128, dropout 0.1) on 8 random sequences of 32 tokens.
* ``generate_kv``: greedy autoregressive generation of 64 tokens after an
  8-token prompt, batch 4, by a 2-layer decoder (width 64, 4 heads) whose
  key/value cache grows by ``torch.cat`` of each new step, under no_grad.

Five at GPU-like tensor sizes (hundreds of MiB live), for fragmentation:

* ``resnet_train``: 4 SGD training steps (momentum 0.9, weight decay 5e-4)
  of a ResNet-18-style net: a 3x3 stem (32 channels), then 4 stages of 2
  basic blocks (conv-BN-ReLU-conv-BN plus identity, or a strided 1x1
  conv-BN shortcut where the shape changes) with 32/64/128/256 channels,
  stride 2 from the second stage on, global average pool and a linear layer;
  batches of 32 random 3x64x64 images with 100 classes.
* ``gpt_train``: 4 AdamW training steps (weight decay 0.1) of a GPT-style
  causal language model: token embedding plus learned positions, 6 pre-norm
  ``nn.TransformerEncoderLayer`` (width 384, 6 heads, feed-forward 1536,
  GELU, dropout 0.1), final layer norm and an untied head; vocabulary 8192,
  8 random sequences of 128 tokens.
* ``lstm_train``: 4 Adam training steps of a language model: embedding 512,
  a 2-layer ``nn.LSTM`` (hidden 768, dropout 0.2) and a linear head;
  vocabulary 8192, 32 random sequences of 64 tokens.
* ``mobilenet_infer``: inference (eval, no_grad) of a MobileNetV2 (width
  1.0: 3x3 stride-2 stem, 17 inverted residual blocks of 1x1 expansion,
  3x3 depthwise conv and 1x1 projection with BN and ReLU6, a 1280-channel
  1x1 conv, pooling and a 1000-class linear layer) on 3 batches of 16 random
  3x224x224 images.
* ``generate_kv_large``: ``generate_kv`` at scale: 128 tokens after a
  64-token prompt, batch 16, vocabulary 8192, 4 layers of width 1024 with
  16 heads (feed-forward 4096).

Event counts, peak live bytes (the most bytes allocated and not yet freed at
once) and gzip sizes as captured with torch 2.13.0 (CPU build, one thread).
No workload had a free of an unknown block to drop, nor a block never freed:

=================== ====== ====== ============== =======
trace               events allocs peak live      file
=================== ====== ====== ============== =======
cnn_train            3,954  1,977     12,553,848 B  ~20 kB
transformer_train    8,866  4,433      5,370,296 B  ~43 kB
generate_kv          5,244  2,622        983,840 B  ~26 kB
resnet_train         5,888  2,944    333,086,040 B  ~33 kB
gpt_train           12,698  6,349    598,060,924 B  ~67 kB
lstm_train           1,584    792    660,889,908 B   ~9 kB
mobilenet_infer      2,908  1,454    210,046,912 B  ~17 kB
generate_kv_large   19,692  9,846    395,255,936 B ~116 kB
=================== ====== ====== ============== =======

File format (gzip text): the header ``op,id,size,stream,time``, then one row
per event in order: ``a`` (alloc) or ``f`` (free), the allocation id (dense,
numbered by first appearance), the size in bytes (the freed block's for a
free), the stream (0: the CPU has none) and seconds since the first event.
Times vary from run to run; the rest is deterministic.

Run from the repository root (needs torch)::

    PYTHONPATH=. python tools/capture_traces.py [--out DIR] [NAME ...]
"""

from __future__ import annotations

import argparse
import gzip
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from numba_bfc.traces.torch_io import ALLOC, FREE, capture_torch

HEADER = "op,id,size,stream,time"
DATA_DIR = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "numba_bfc", "traces",
                                         "data"))


def cnn_train(steps: int = 8) -> None:
    """A few Adam steps of a small conv net on random images."""
    torch.manual_seed(0)

    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]

    model = nn.Sequential(*block(3, 16), *block(16, 32), nn.MaxPool2d(2), *block(32, 64),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(steps):
        x = torch.randn(16, 3, 32, 32)
        y = torch.randint(0, 10, (16,))
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()


def transformer_train(steps: int = 8, vocab: int = 256, width: int = 64, seq: int = 32,
                      batch: int = 8) -> None:
    """A few AdamW steps of a small causal TransformerEncoder language model."""
    torch.manual_seed(0)
    embed = nn.Embedding(vocab, width)
    pos = nn.Parameter(torch.randn(seq, width) * 0.02)
    layer = nn.TransformerEncoderLayer(width, 4, dim_feedforward=128, dropout=0.1,
                                       batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    head = nn.Linear(width, vocab)
    params = [*embed.parameters(), pos, *encoder.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3)
    mask = nn.Transformer.generate_square_subsequent_mask(seq)
    for _ in range(steps):
        tokens = torch.randint(0, vocab, (batch, seq + 1))
        opt.zero_grad(set_to_none=True)
        h = encoder(embed(tokens[:, :-1]) + pos, mask=mask, is_causal=True)
        loss = F.cross_entropy(head(h).reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()


def generate_kv(new_tokens: int = 64, prompt: int = 8, batch: int = 4, vocab: int = 256,
                width: int = 64, heads: int = 4, layers: int = 2) -> None:
    """Greedy generation by a small decoder with a KV cache grown by concatenation."""
    torch.manual_seed(0)
    hd = width // heads
    embed = nn.Embedding(vocab, width)
    qkv = [nn.Linear(width, 3 * width) for _ in range(layers)]
    out = [nn.Linear(width, width) for _ in range(layers)]
    mlp = [nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
           for _ in range(layers)]
    norm1 = [nn.LayerNorm(width) for _ in range(layers)]
    norm2 = [nn.LayerNorm(width) for _ in range(layers)]
    head = nn.Linear(width, vocab)
    cache_k: list[torch.Tensor | None] = [None] * layers
    cache_v: list[torch.Tensor | None] = [None] * layers

    def step(x: torch.Tensor) -> torch.Tensor:
        # x: (batch, t, width) for the t new positions; attends to cache + itself.
        b, t, _ = x.shape
        for i in range(layers):
            q, k, v = qkv[i](norm1[i](x)).split(width, dim=-1)
            q, k, v = (z.reshape(b, t, heads, hd).transpose(1, 2) for z in (q, k, v))
            if cache_k[i] is not None:
                k = torch.cat([cache_k[i], k], dim=2)
                v = torch.cat([cache_v[i], v], dim=2)
            cache_k[i], cache_v[i] = k, v
            att = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
            x = x + out[i](att.transpose(1, 2).reshape(b, t, width))
            x = x + mlp[i](norm2[i](x))
        return head(x[:, -1])

    with torch.no_grad():
        tokens = torch.randint(0, vocab, (batch, prompt))
        logits = step(embed(tokens))
        for _ in range(new_tokens):
            nxt = logits.argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, nxt], dim=1)
            logits = step(embed(nxt))


def resnet_train(steps: int = 4, batch: int = 32, size: int = 64, classes: int = 100,
                 widths: tuple[int, ...] = (32, 64, 128, 256)) -> None:
    """A few SGD-momentum steps of a small ResNet (basic blocks) on random images."""
    torch.manual_seed(0)

    def conv_bn(cin: int, cout: int, k: int, stride: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False),
                             nn.BatchNorm2d(cout))

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.a = conv_bn(cin, cout, 3, stride)
            self.b = conv_bn(cout, cout, 3, 1)
            self.skip = (conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout
                         else nn.Identity())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.relu(self.b(F.relu(self.a(x), inplace=True)) + self.skip(x), inplace=True)

    layers: list[nn.Module] = [conv_bn(3, widths[0], 3, 1), nn.ReLU(inplace=True)]
    cin = widths[0]
    for i, w in enumerate(widths):
        layers += [Block(cin, w, 1 if i == 0 else 2), Block(w, w, 1)]
        cin = w
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(cin, classes))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    for _ in range(steps):
        x = torch.randn(batch, 3, size, size)
        y = torch.randint(0, classes, (batch,))
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()


def gpt_train(steps: int = 4, vocab: int = 8192, width: int = 384, heads: int = 6,
              layers: int = 6, seq: int = 128, batch: int = 8) -> None:
    """A few AdamW steps of a GPT-style causal language model (pre-norm encoder layers)."""
    torch.manual_seed(0)
    embed = nn.Embedding(vocab, width)
    pos = nn.Parameter(torch.randn(seq, width) * 0.02)
    layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=4 * width, dropout=0.1,
                                       activation="gelu", batch_first=True, norm_first=True)
    encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
    norm = nn.LayerNorm(width)
    head = nn.Linear(width, vocab, bias=False)
    params = [*embed.parameters(), pos, *encoder.parameters(), *norm.parameters(),
              *head.parameters()]
    opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.1)
    mask = nn.Transformer.generate_square_subsequent_mask(seq)
    for _ in range(steps):
        tokens = torch.randint(0, vocab, (batch, seq + 1))
        opt.zero_grad(set_to_none=True)
        h = norm(encoder(embed(tokens[:, :-1]) + pos, mask=mask, is_causal=True))
        loss = F.cross_entropy(head(h).reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()


def lstm_train(steps: int = 4, vocab: int = 8192, embed_dim: int = 512, hidden: int = 768,
               seq: int = 64, batch: int = 32) -> None:
    """A few Adam steps of a 2-layer LSTM language model."""
    torch.manual_seed(0)
    embed = nn.Embedding(vocab, embed_dim)
    lstm = nn.LSTM(embed_dim, hidden, num_layers=2, dropout=0.2, batch_first=True)
    head = nn.Linear(hidden, vocab)
    params = [*embed.parameters(), *lstm.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=1e-3)
    for _ in range(steps):
        tokens = torch.randint(0, vocab, (batch, seq + 1))
        opt.zero_grad(set_to_none=True)
        h, _ = lstm(embed(tokens[:, :-1]))
        loss = F.cross_entropy(head(h).reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()


def mobilenet_infer(batches: int = 3, batch: int = 16, size: int = 224,
                    classes: int = 1000) -> None:
    """Inference of a MobileNetV2 (inverted residuals, depthwise convs) on random images."""
    torch.manual_seed(0)

    def cbr(cin: int, cout: int, k: int = 1, stride: int = 1, groups: int = 1,
            act: bool = True) -> list[nn.Module]:
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                  nn.BatchNorm2d(cout)]
        return layers + [nn.ReLU6(inplace=True)] if act else layers

    class InvertedResidual(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
            super().__init__()
            mid = cin * expand
            layers = cbr(cin, mid) if expand != 1 else []
            layers += cbr(mid, mid, 3, stride, groups=mid) + cbr(mid, cout, act=False)
            self.body = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.body(x) if self.residual else self.body(x)

    # (expansion, channels, repeats, first stride), as in MobileNetV2.
    config = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
              (6, 160, 3, 2), (6, 320, 1, 1)]
    layers: list[nn.Module] = cbr(3, 32, 3, 2)
    cin = 32
    for t, c, n, s in config:
        for i in range(n):
            layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
            cin = c
    layers += cbr(cin, 1280) + [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2),
                                nn.Linear(1280, classes)]
    model = nn.Sequential(*layers).eval()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(batch, 3, size, size)).softmax(-1).argmax(-1)


def generate_kv_large(new_tokens: int = 128, prompt: int = 64, batch: int = 16,
                      vocab: int = 8192, width: int = 1024, heads: int = 16,
                      layers: int = 4) -> None:
    """``generate_kv`` at scale: greedy generation by a wide decoder with a growing KV cache."""
    generate_kv(new_tokens, prompt, batch, vocab, width, heads, layers)


WORKLOADS = {"cnn_train": cnn_train, "transformer_train": transformer_train,
             "generate_kv": generate_kv, "resnet_train": resnet_train, "gpt_train": gpt_train,
             "lstm_train": lstm_train, "mobilenet_infer": mobilenet_infer,
             "generate_kv_large": generate_kv_large}


def clean(events: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Drop frees of unknown allocations; renumber ids densely; count what is odd."""
    op, ids, size = events["op"], events["id"], events["size"]
    alloc_ids = ids[op == ALLOC]
    unknown = (op == FREE) & ~np.isin(ids, alloc_ids)
    keep = ~unknown
    ev = {k: v[keep] for k, v in events.items()}
    # Dense ids in order of first appearance: small numbers, small files.
    _, first, inverse = np.unique(ev["id"], return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    ev["id"] = rank[inverse.ravel()]
    freed = np.isin(ev["id"][ev["op"] == ALLOC], ev["id"][ev["op"] == FREE])
    alloc_size = np.zeros(first.size, dtype=np.int64)
    alloc_size[ev["id"][ev["op"] == ALLOC]] = ev["size"][ev["op"] == ALLOC]
    mismatched = (ev["op"] == FREE) & (alloc_size[ev["id"]] != ev["size"])
    live = np.cumsum(np.where(ev["op"] == ALLOC, ev["size"], -ev["size"]))
    stats = {"events": int(keep.sum()), "allocs": int((ev["op"] == ALLOC).sum()),
             "unknown_frees_dropped": int(unknown.sum()),
             "never_freed": int((~freed).sum()), "size_mismatches": int(mismatched.sum()),
             "peak_live_bytes": int(live.max()) if live.size else 0,
             "bytes": int(size[op == ALLOC].sum())}
    return ev, stats


def write_csv_gz(path: str, events: dict[str, np.ndarray]) -> None:
    """Write ``events`` as the gzip CSV described in this module's docstring."""
    letters = np.where(events["op"] == ALLOC, "a", "f")
    lines = [HEADER]
    for o, i, s, st, t in zip(letters.tolist(), events["id"].tolist(), events["size"].tolist(),
                              events["stream"].tolist(), events["time"].tolist()):
        lines.append(f"{o},{i},{s},{st},{'nan' if math.isnan(t) else f'{t:.6f}'}")
    # mtime=0 and no file name: the same events give the same bytes.
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw,
                                                 compresslevel=9, mtime=0) as f:
        f.write(("\n".join(lines) + "\n").encode("ascii"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"workloads to capture: {', '.join(WORKLOADS)} (default: all)")
    parser.add_argument("--out", default=DATA_DIR, help="output folder")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {list(WORKLOADS)}")
    # One thread: which kernels (and so which scratch buffers) run is then
    # the same on every machine.
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    for name in args.names or WORKLOADS:
        fn = WORKLOADS[name]
        fn()  # warm-up: PyTorch's one-time lazy allocations stay out of the trace
        events, stats = clean(capture_torch(fn))
        path = os.path.join(args.out, f"{name}.csv.gz")
        write_csv_gz(path, events)
        stats["file_bytes"] = os.path.getsize(path)
        print(name, " ".join(f"{k}={v}" for k, v in stats.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
