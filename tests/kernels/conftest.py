"""GPU tests (marked `gpu`) run only where cupy sees a CUDA device; everything else runs in CI."""

import functools

import pytest


@functools.lru_cache(maxsize=1)
def _gpu_visible() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is not None and not _gpu_visible():
        pytest.skip("needs an NVIDIA GPU visible to cupy")
