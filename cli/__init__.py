"""The ``lace`` command line: one module per command, all mounted on ``cli.app.app`` (see :mod:`cli.main`)."""
