#!/bin/sh
# A Python that cannot import torch, on any machine: isolated mode (-I: no PYTHONPATH, no user
# site) without site-packages (-S). ctest's test_peers_no_torch runs the peers through it, so the
# "PyTorch is not installed" path is exercised even where someone installed PyTorch by hand.
exec python3 -I -S "$@"
