"""medrank: filter and re-rank answers to consumer health questions."""

import os

__version__ = "0.1.0"

# OpenMP threads that wait yield their core instead of spinning: a pinned 2-thread training step beside one busy
# process ran 2.55x slower with spinning and 1.69x with passive waiting (a fair share is 1.5x), 0.96x alone, same bits
# (benchmarks/concurrency.py; `dvc queue start -j 2` is such a neighbour). Read once, when torch loads: set before it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
