"""Install neo_train; the top-level kernels/ folder is installed as neo_train.kernels.

CPU:  ./install.sh            (pins torch==2.13.0 CPU, fbgemm-gpu-cpu==1.8.0, torchrec 1.8 --no-deps)
GPU:  see README "Install on a GPU machine" (CUDA torch + triton; fbgemm-gpu optional)
"""
from setuptools import setup

PACKAGES = [
    "neo_train",
    "neo_train.data",
    "neo_train.modules",
    "neo_train.train",
    "neo_train.comm",
    "neo_train.sharding",
    "neo_train.parallel",
    "neo_train.topology",
    "neo_train.kernels",
]

setup(
    name="neo_train",
    version="0.1.0",
    description="Neo-style distributed DLRM training: 4D sharding, fused embedding kernels, "
    "topology-aware collectives",
    python_requires=">=3.11",
    packages=PACKAGES,
    package_dir={"neo_train.kernels": "kernels"},
    # torch is pinned by requirements/*.txt + constraints (CPU: 2.13.0); here only a floor, so a
    # CUDA torch already on a GPU machine is kept.
    install_requires=["torch>=2.11", "numpy", "tensorboard", "matplotlib", "tqdm", "tomli-w"],
    extras_require={
        # torchrec is NOT listed: its metadata pulls the CUDA fbgemm-gpu over the CPU build.
        "cpu": ["fbgemm-gpu-cpu==1.8.0"],
        "triton": ["triton==3.7.1"],
        "dev": ["pytest", "pytest-timeout"],
    },
    entry_points={"console_scripts": ["neo-train=neo_train.cli:main"]},
)
