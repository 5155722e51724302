#!/usr/bin/env python3
"""Builds the AOTInductor package that bm_offload streams (PERF.md T4, T6, T11 for packages).

    python3 scripts/make_offload_fixture.py OUTDIR

Writes OUTDIR/large_aoti, the package twin of bm_offload's "large" TorchScript model: 16
bias-free Linear(8192, 8192) layers in bfloat16 (128 MiB each, 2 GiB in all), y = x W_i^T in
sequence, exported by torchloom_export.export_model with offload on (config.pbtxt,
1/model.pt2 without constants, 1/weights.pt) and the batch dynamic up to 16384. Needs
PyTorch >= 2.6 and a GPU; exits 1 without them, and bm_offload then reports its package rows
as not run.

Cached: OUTDIR/.stamp holds a hash of this file and torchloom_export.py and the torch
version; when it matches, nothing is rebuilt.
"""

import os
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixture_stamp  # noqa: E402
from torchloom_export import export_model  # noqa: E402

NAME = "large_aoti"
LAYERS = 16
WIDTH = 8192
MAX_BATCH = 16384


class Large(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS))
        with torch.no_grad():
            for layer in self.layers:
                # Scaled so that activations stay in range through the stack.
                layer.weight.copy_(torch.randn(WIDTH, WIDTH) / WIDTH ** 0.5)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def stamp():
    return fixture_stamp.digest(("make_offload_fixture.py", "torchloom_export.py"),
                                f"torch {torch.__version__} cuda {torch.version.cuda}")


def main(argv):
    if len(argv) != 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    outdir = os.path.abspath(argv[0])
    want = stamp()
    if fixture_stamp.up_to_date(outdir, want):
        print(f"make_offload_fixture: {outdir} is up to date")
        return 0
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    if version < (2, 6) or not torch.cuda.is_available():
        print(f"make_offload_fixture: needs torch >= 2.6 with CUDA (torch {torch.__version__}, "
              f"CUDA available: {torch.cuda.is_available()})", file=sys.stderr)
        return 1
    fixture_stamp.clear(outdir, (NAME,))
    started = time.time()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Large().to(torch.bfloat16)
    sample = (torch.randn(16, WIDTH, device="cuda", dtype=torch.bfloat16),)
    export_model(model, sample, os.path.join(outdir, NAME), name=NAME, device="cuda",
                 max_batch=MAX_BATCH, offload=True)
    fixture_stamp.mark(outdir, want)
    print(f"make_offload_fixture: {NAME} in {time.time() - started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
