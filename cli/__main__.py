"""``python -m cli``: the ``lace`` command line."""
from cli.main import main

main(prog_name="lace")
