"""`import torch` alone registers tpu through the torch.backends entry point."""

import os
import subprocess
import sys


def run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_import_torch_autoloads_rtpu():
    result = run(
        "import sys, torch\n"
        "print(torch.ones(2, device='tpu').cpu())\n"
        "print('rtpu' in sys.modules, torch.accelerator.current_accelerator())\n"
    )
    assert result.returncode == 0, result.stderr
    assert "tensor([1., 1.])" in result.stdout
    assert "True tpu" in result.stdout


def test_autoload_can_be_disabled():
    result = run(
        "import sys, torch\n"
        "print('rtpu' in sys.modules, hasattr(torch, 'tpu'))\n"
        "try:\n"
        "    torch.ones(2, device='tpu')\n"
        "except RuntimeError:\n"
        "    print('no tpu device')\n",
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
    )
    assert result.returncode == 0, result.stderr
    assert "False False" in result.stdout
    assert "no tpu device" in result.stdout
