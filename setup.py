"""Install neo_train (every package under neo_train/, found by find_packages).

CPU:  ./install.sh            (pins torch==2.13.0 CPU, fbgemm-gpu-cpu==1.8.0, torchrec 1.8 --no-deps)
GPU:  see README "Install on a GPU machine" (CUDA torch + triton; fbgemm-gpu optional)
"""
from setuptools import find_packages, setup

PACKAGES = find_packages(include=["neo_train", "neo_train.*"])

setup(
    name="neo_train",
    version="0.1.0",
    description="Neo-style distributed DLRM training: 4D sharding, fused embedding kernels, "
    "topology-aware collectives",
    python_requires=">=3.11",
    packages=PACKAGES,
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
