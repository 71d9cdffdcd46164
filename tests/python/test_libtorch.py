"""A libtorch C++ program (no Python) uses the shim: dlopen it, run ops on
the device, catch an error."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SHIM = ROOT / "python" / "rtpu" / "lib" / "librtpu_torch.so"


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_libtorch_program_runs_ops_through_the_shim(tmp_path):
    torch_dir = Path(torch.__file__).parent
    exe = tmp_path / "libtorch_shim"
    subprocess.run(
        [
            "c++", "-std=c++20", "-D_GLIBCXX_USE_CXX11_ABI=1", "-O0",
            "-isystem", str(torch_dir / "include"),
            str(ROOT / "tests" / "cpp" / "libtorch_shim.cpp"), "-o", str(exe),
            f"-L{torch_dir / 'lib'}", f"-Wl,-rpath,{torch_dir / 'lib'}", "-ltorch_cpu", "-lc10", "-ldl",
        ],
        check=True,
    )
    # rtpu (imported by conftest) chose the plugin in RTPU_PLUGIN, which the
    # program's shim reads too.
    assert os.environ.get("RTPU_PLUGIN")
    result = subprocess.run([str(exe), str(SHIM)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "libtorch_shim: ok" in result.stdout
