"""Substitute ``fastload.DataLoader`` for torch's in every Python process that starts.

Python imports ``sitecustomize`` at start-up from the first directory on ``sys.path`` that
holds one, so putting this directory on ``PYTHONPATH`` reaches the test runner, the worker
processes torch spawns, and ``python -c`` scripts the tests launch alike. Code that does
``from torch.utils.data import DataLoader`` or ``torch.utils.data.DataLoader(...)``
afterwards gets fastload's loader, with fastload's "auto" defaults in force.

Used by ``benchmarks/torch_compat/run.py``; see docs/torch_compat.md. Example::

    PYTHONPATH=benchmarks/torch_compat python -c \\
        "import torch.utils.data as d; print(d.DataLoader.__module__)"   # fastload.loader.dataloader
"""

import torch.utils.data

import fastload

torch.utils.data.DataLoader = fastload.DataLoader
