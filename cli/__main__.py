"""``python -m cli``: the ``lace`` command line."""
from cli.main import app

app(prog_name="lace")
