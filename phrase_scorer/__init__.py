"""phrase-scorer: the RNN Encoder-Decoder of Cho et al. (2014) and RNNsearch as features for Moses.

The packages (docs/layout.md): ``training``, ``scoring``, ``generation`` and ``runtime`` beside
``io`` (file formats), ``moses`` (Moses' programs), ``models``, ``data``, ``analysis``,
``experiments`` and ``cli``; at this level only what all of them share. Using the package from
Python: docs/python.md.

Importing any part of the package sets the process settings below (unless the user set them),
so that a Python caller runs as fast as the command line: they take effect when torch loads
after this import (the OpenMP runtime reads its policy once, as torch loads).
"""

import os

__version__ = "0.1.0"

# PyTorch's OpenMP threads spin while they wait for work by default. Beside other busy processes
# a spinning thread holds a core that the thread it waits for needs: with sleeping threads a
# `small` model annotated 1.7 and 8.1 times faster (two measurements) on a 2-core machine kept
# busy by 2 other processes, and about 10% slower on the idle machine (docs/benchmarks.md,
# "Annotate on a busy machine").
# So waiting threads sleep, unless the user chose a policy (OMP_WAIT_POLICY=ACTIVE for a machine
# of its own). The OpenMP runtime reads this when torch loads, which is after this line for the
# command line and for a caller that imports phrase_scorer before torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# On a CPU, torch frees a scored depth's states with the C library, which hands buffers of more
# than a few MB back to the kernel at once (and takes them again, page by page, at the next depth):
# on the main thread between a batch's operators, most of the `paper` network's host work per pair
# (8.7 against 3.5 µs with huge pages: docs/benchmarks.md, "The batch scorer's stages"). With
# THP_MEM_ALLOC_ENABLE torch's CPU allocator asks for 2 MB pages for such buffers (where the
# kernel's transparent huge pages allow it: "madvise" or "always"), a page fault per 2 MB instead
# of per 4 kB. No score changes.
# Read at torch's first allocation, after this line; THP_MEM_ALLOC_ENABLE=0 turns it off.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
