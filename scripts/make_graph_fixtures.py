#!/usr/bin/env python3
"""Builds the ResNet-18 models bench/bm_graphs.cpp runs (PERF.md T12).

    python3 scripts/make_graph_fixtures.py OUTDIR

Needs PyTorch >= 2.6, torchvision and a CUDA device. Writes, in Triton's model-repository
layout, torchvision's ResNet-18 with random weights (seeded), for 224x224 images:
  OUTDIR/resnet18_ts/1/model.pt      TorchScript (traced), float32 [batch, 3, 224, 224];
  OUTDIR/resnet18_cuda/1/model.pt2   an AOTInductor package for CUDA with a dynamic batch
                                     (1 to 64), its inputs declared in "torchloom.inputs".
Both hold the same weights. The package takes a minute or two to compile.

Cached: OUTDIR/.stamp holds a hash of this file, make_aoti_fixtures.py (whose build() it
uses) and the torch and torchvision versions; when it matches, nothing is rebuilt.
"""

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixture_stamp  # noqa: E402
import make_aoti_fixtures  # noqa: E402  (the package builder the other fixtures use)

FIXTURES = ("resnet18_ts", "resnet18_cuda")
MAX_BATCH = 64


def stamp():
    import torchvision
    return fixture_stamp.digest(
        ("make_graph_fixtures.py", "make_aoti_fixtures.py"),
        f"torch {torch.__version__} torchvision {torchvision.__version__} "
        f"cuda {torch.version.cuda}")


def main(argv):
    if len(argv) != 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        import torchvision
    except ImportError:
        print("make_graph_fixtures: torchvision is not installed", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("make_graph_fixtures: no CUDA device", file=sys.stderr)
        return 1
    outdir = os.path.abspath(argv[0])
    want = stamp()
    if fixture_stamp.up_to_date(outdir, want):
        print(f"make_graph_fixtures: {outdir} is up to date")
        return 0
    fixture_stamp.clear(outdir, FIXTURES)

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    sample = torch.randn(8, 3, 224, 224)

    started = time.time()
    directory = os.path.join(outdir, "resnet18_ts", "1")
    os.makedirs(directory, exist_ok=True)
    with torch.no_grad():
        traced = torch.jit.trace(model, sample)
    traced.save(os.path.join(directory, "model.pt"))
    print(f"make_graph_fixtures: resnet18_ts in {time.time() - started:.0f}s", flush=True)

    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    make_aoti_fixtures.build(outdir, "resnet18_cuda", model, (sample,), None,
                             {"x": {0: batch}}, "cuda", declare_in_metadata=True)
    fixture_stamp.mark(outdir, want)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
