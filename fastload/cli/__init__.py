"""The subcommands of the ``fastload`` command, one module each (registered in fastload.cli)."""
