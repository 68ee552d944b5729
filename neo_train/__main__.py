"""``python -m neo_train ...`` (and ``torchrun -m neo_train ...``) is the ``neo-train`` command."""
import sys

from .cli import main

sys.exit(main())
