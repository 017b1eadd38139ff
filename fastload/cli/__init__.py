"""The ``fastload`` command: :func:`main` runs it, :data:`cli` is its click group.

One module per subcommand (:mod:`~fastload.cli.cache`, :mod:`~fastload.cli.bench`, with
:mod:`~fastload.cli.render` printing the bench report), registered in
:mod:`fastload.cli.main`. The console script is ``fastload = "fastload.cli:main"``::

    from fastload.cli import main
    sys.exit(main(["cache", "stats", "/nvme/fastload"]))
"""

from fastload.cli.main import cli, main

__all__ = ["cli", "main"]
