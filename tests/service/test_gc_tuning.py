"""A query process runs with fewer full garbage collections (service.core.gc_tuning, issue 25)."""
import subprocess
import sys

from service.core.gc_tuning import GC_THRESHOLDS


def test_tune_sets_the_thresholds_and_cycles_are_still_collected():
    code = (
        "import gc\n"
        "from service.core.gc_tuning import tune\n"
        "tune()\n"
        "print(gc.get_threshold())\n"
        "class Node:\n"
        "    pass\n"
        "import weakref\n"
        "a = Node(); a.me = a; probe = weakref.ref(a); del a\n"
        f"keep = [[] for _ in range({GC_THRESHOLDS[0] * 3})]\n"  # allocations that live on: the young generation fills
        "print(probe() is None)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0].strip("(),") == str(GC_THRESHOLDS[0]) and GC_THRESHOLDS[0] > 700
    assert out[-1] == "True"  # a cycle is collected without an explicit gc.collect()
