"""``lace`` as a ``spark-submit`` application (spark-submit runs a ``.py`` file, not the ``lace`` console script):

    spark-submit --master spark://HOST:7077 --jars ... [--py-files lace-src.zip] deploy/lace_submit.py stream ...

deploy/stream.md has the whole command. (Not ``cli/main.py`` itself: Python puts the script's folder first on
``sys.path``, and ``cli/stream.py`` would then shadow the ``stream`` package.)
"""
from cli.main import main

if __name__ == "__main__":
    main(prog_name="lace")
