"""Session-wide test setup.

Without CUDA the triton backend runs in Triton's interpreter, which must be chosen before triton
is first imported, and torchrec imports triton when it is installed. So the flag is set here,
before any test module (and so torchrec or triton) is imported.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
