"""A libtorch C++ program (no Python) uses the shim: dlopen it, run ops on
the device, catch an error. It needs no environment: the shim finds the
CPU plugin itself ($RTPU_PLUGIN, else the path recorded at build time, else
xla-cpu-pjrt beside torch), and says where it looked when it finds none."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "python" / "rtpu" / "lib"
SHIM = LIB / "librtpu_torch.so"
TORCH_LIB = Path(torch.__file__).parent / "lib"
CPU_PLUGIN = TORCH_LIB.parents[1] / "xla_plugins" / "xla_cpu_pjrt" / "xla_cpu_pjrt.so"

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    exe = tmp_path_factory.mktemp("libtorch") / "libtorch_shim"
    subprocess.run(
        [
            "c++", "-std=c++20", "-D_GLIBCXX_USE_CXX11_ABI=1", "-O0",
            "-isystem", str(TORCH_LIB.parent / "include"),
            str(ROOT / "tests" / "cpp" / "libtorch_shim.cpp"), "-o", str(exe),
            f"-L{TORCH_LIB}", f"-Wl,-rpath,{TORCH_LIB}", "-ltorch_cpu", "-lc10", "-ldl",
        ],
        check=True,
    )
    return exe


def run(program, shim, **env):
    """Runs the program on `shim` with this environment, less RTPU_PLUGIN,
    plus `env`."""
    inherited = {k: v for k, v in os.environ.items() if k != "RTPU_PLUGIN"}
    return subprocess.run([str(program), str(shim)], env={**inherited, **env}, capture_output=True, text=True, timeout=300)


def shim_copy(directory: Path, record: str | None = None) -> Path:
    """The shim and its librtpu.so in `directory`, with `record` as its
    build's plugin record (none when None)."""
    directory.mkdir()
    for name in ("librtpu_torch.so", "librtpu.so"):
        shutil.copy(LIB / name, directory / name)
    if record is not None:
        (directory / "plugin-path").write_text(record + "\n")
    return directory / "librtpu_torch.so"


@pytest.fixture
def torch_without_plugin(tmp_path):
    """LD_LIBRARY_PATH under which the process loads torch's libraries
    through links in a site-packages that has everything but the plugin
    (the shim looks beside the torch the process loaded)."""
    site_packages = TORCH_LIB.parents[1]
    fake_lib = tmp_path / "site-packages" / "torch" / "lib"
    fake_lib.mkdir(parents=True)
    for library in TORCH_LIB.iterdir():
        (fake_lib / library.name).symlink_to(library)
    for entry in site_packages.iterdir():
        if entry.name not in ("torch", "xla_plugins"):
            (tmp_path / "site-packages" / entry.name).symlink_to(entry)
    return str(fake_lib)


def test_libtorch_program_runs_ops_through_the_shim(program):
    # rtpu (imported by conftest) chose the plugin in RTPU_PLUGIN, which the
    # program's shim reads too.
    result = run(program, SHIM, RTPU_PLUGIN=os.environ["RTPU_PLUGIN"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "libtorch_shim: ok" in result.stdout


def test_the_build_s_shim_needs_no_environment(program):
    result = run(program, SHIM)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "libtorch_shim: ok" in result.stdout


def test_rtpu_plugin_wins_over_the_defaults(program):
    result = run(program, SHIM, RTPU_PLUGIN="/nonexistent/plugin.so")
    assert result.returncode == 1
    assert "/nonexistent/plugin.so" in result.stderr


def test_the_plugin_recorded_at_build_time_is_used(program, tmp_path, torch_without_plugin):
    assert (LIB / "plugin-path").read_text().strip() == os.environ["RTPU_PLUGIN"]
    shim = shim_copy(tmp_path / "lib", record=os.environ["RTPU_PLUGIN"])
    result = run(program, shim, LD_LIBRARY_PATH=torch_without_plugin)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "libtorch_shim: ok" in result.stdout


@pytest.mark.skipif(not CPU_PLUGIN.is_file(), reason="needs xla-cpu-pjrt installed beside torch")
def test_without_a_record_the_plugin_beside_torch_is_used(program, tmp_path):
    result = run(program, shim_copy(tmp_path / "lib"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "libtorch_shim: ok" in result.stdout


def test_with_no_plugin_anywhere_the_error_names_every_place_tried(program, tmp_path, torch_without_plugin):
    shim = shim_copy(tmp_path / "lib")
    result = run(program, shim, LD_LIBRARY_PATH=torch_without_plugin)
    assert result.returncode == 1, result.stdout + result.stderr
    message = result.stderr
    assert "rtpu: no PJRT plugin found. Tried, in order: $RTPU_PLUGIN (unset); " in message
    assert f"{tmp_path / 'lib' / 'plugin-path'} (no plugin recorded at build time); " in message
    beside_torch = tmp_path / "site-packages" / "xla_plugins" / "xla_cpu_pjrt" / "xla_cpu_pjrt.so"
    assert f"{beside_torch} (xla-cpu-pjrt beside torch: missing)" in message
    assert "pip install xla-cpu-pjrt" in message
    # A record naming a missing file is named too.
    shutil.rmtree(tmp_path / "lib")
    shim = shim_copy(tmp_path / "lib", record="/gone/xla_cpu_pjrt.so")
    result = run(program, shim, LD_LIBRARY_PATH=torch_without_plugin)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"/gone/xla_cpu_pjrt.so (recorded at build time in {tmp_path / 'lib' / 'plugin-path'}: missing)" in result.stderr
