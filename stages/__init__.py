"""The pipeline's stages (`python -m stages.<name>`, dvc.yaml). This package runs first in every stage process, before
a stage module imports torch, so process-wide settings that torch reads once when it loads are made here."""

import os

# OpenMP threads that wait yield their core instead of spinning: a pinned 2-thread training step beside one busy
# process ran 2.55x slower with spinning and 1.69x with passive waiting (a fair share is 1.5x), 0.96x alone, the same
# weights (benchmarks/concurrency.py; `dvc queue start -j 2` is such a neighbour). Outputs do not depend on it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
