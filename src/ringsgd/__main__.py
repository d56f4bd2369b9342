"""`python -m ringsgd ...` (and `torchrun -m ringsgd ...`) run the CLI."""
import sys

from .cli import main

sys.exit(main())
