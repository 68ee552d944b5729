"""neo_train: Neo-style distributed DLRM training on PyTorch.

``import neo_train`` needs only torch; fbgemm_gpu, triton and torchrec are optional and imported
lazily. ``neo_train.kernels.backend_report()`` says which kernel backends import here.
"""
__version__ = "0.1.0"
__all__ = ["__version__"]
