"""The devices the whole-model tests (test_training.py, test_serving.py) run on: the CPU, and CUDA
where PyTorch sees a GPU. With TESSERA_REQUIRE_CUDA=1 (scripts/gpu_check.sh's test stage) the cuda
cases never skip: a GPU that PyTorch does not see fails them instead."""
import os

import pytest
import torch

REQUIRED = os.environ.get("TESSERA_REQUIRE_CUDA") == "1"

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not REQUIRED and not torch.cuda.is_available(), reason="PyTorch sees no CUDA device"))]
