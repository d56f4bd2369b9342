import os

# Workers split the cores; keep the parent light so tests behave the same on 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
