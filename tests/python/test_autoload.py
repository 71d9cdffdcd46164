"""`import torch` alone registers tpu through the torch.backends entry point."""

import os
import subprocess
import sys

import pytest


def run(code: str, unset: tuple = (), **env: str) -> subprocess.CompletedProcess:
    """Runs `code` in a new Python with this environment, less `unset`, plus `env`."""
    inherited = {k: v for k, v in os.environ.items() if k not in unset}
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**inherited, **env},
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


def test_import_and_first_use_print_no_warning():
    # e.g. an op-table entry the shim cannot register warns at import.
    result = run("import torch\nprint(torch.ones(2, device='tpu').cpu())\n")
    assert result.returncode == 0, result.stderr
    noise = [line for line in result.stderr.splitlines() if "arning" in line]
    assert not noise, result.stderr


def test_import_rtpu_first_works_as_well():
    # torch, imported by rtpu, autoloads rtpu while it is half initialised.
    result = run("import rtpu, torch\nprint(torch.ones(2, device='tpu').cpu())\n")
    assert result.returncode == 0, result.stderr
    assert "tensor([1., 1.])" in result.stdout


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


def test_pjrt_device_chooses_the_plugin_when_rtpu_plugin_is_unset():
    import rtpu._plugin as plugin

    cpu = plugin.plugin_path("CPU")
    code = "import os, torch\nprint(os.environ['RTPU_PLUGIN'])\nprint((torch.ones(2, device='tpu') + 1).cpu())\n"
    # (importing rtpu here set RTPU_PLUGIN, which would win)
    chosen = run(code, unset=("RTPU_PLUGIN",), PJRT_DEVICE="cpu")
    assert chosen.returncode == 0, chosen.stderr
    assert chosen.stdout.splitlines()[0] == cpu and "tensor([2., 2.])" in chosen.stdout
    # A kind rtpu does not know warns and falls back to the default choice.
    unknown = run(code, unset=("RTPU_PLUGIN",), PJRT_DEVICE="QPU")
    assert unknown.returncode == 0, unknown.stderr
    assert "PJRT_DEVICE=QPU is not one of CPU, TPU, CUDA; ignoring it" in unknown.stderr
    assert unknown.stdout.splitlines()[0] == cpu


def test_pjrt_device_naming_a_missing_plugin_says_how_to_install_it(monkeypatch):
    import rtpu._plugin as plugin

    missing = [kind for kind in plugin.PLUGINS if plugin.plugin_path(kind) is None]
    if not missing:
        pytest.skip("every plugin kind is installed here")
    kind = missing[0]
    monkeypatch.delenv("RTPU_PLUGIN", raising=False)
    monkeypatch.setenv("PJRT_DEVICE", kind)
    with pytest.warns(UserWarning, match=rf"PJRT_DEVICE={kind} but its plugin is not installed \({plugin.PLUGINS[kind][2]}\)"):
        assert plugin.resolve() is None


def test_the_default_cpu_plugin_gets_its_isa_capped_only_on_bf16_hosts_without_amx():
    import rtpu._plugin as plugin

    default = "/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so"
    bf16_host = {"avx512f", "avx512_vnni", "avx512_bf16"}
    assert plugin.xla_flags_for(default, "", bf16_host) == plugin.DOT_ISA_CAP
    kept = plugin.xla_flags_for(default, "--xla_cpu_enable_fast_math=false", bf16_host)
    assert kept == f"--xla_cpu_enable_fast_math=false {plugin.DOT_ISA_CAP}"
    # The user's own ISA choice wins; other hosts and plugins are left alone.
    assert plugin.xla_flags_for(default, "--xla_cpu_max_isa=AVX2", bf16_host) == "--xla_cpu_max_isa=AVX2"
    assert plugin.xla_flags_for(default, "", {"avx512f", "avx2"}) == ""
    assert plugin.xla_flags_for(default, "", bf16_host | {"amx_tile", "amx_bf16"}) == ""
    assert plugin.xla_flags_for("/x/pjrt_c_api_cpu_plugin.so", "", bf16_host) == ""


def test_a_child_process_sees_the_flags_rtpu_chose_and_keeps_the_users():
    import rtpu._plugin as plugin

    code = "import os, torch\nprint(os.environ.get('XLA_FLAGS', ''))\nprint(torch.ones(2, device='tpu').sum().item())\n"
    expected = plugin.xla_flags_for(os.environ["RTPU_PLUGIN"], "", plugin.cpu_flags())
    default = run(code, unset=("XLA_FLAGS",))
    assert default.returncode == 0, default.stderr
    assert default.stdout.splitlines() == [expected, "2.0"]
    chosen = run(code, XLA_FLAGS="--xla_cpu_max_isa=AVX2")
    assert chosen.returncode == 0, chosen.stderr
    assert chosen.stdout.splitlines() == ["--xla_cpu_max_isa=AVX2", "2.0"]
    kept = run(code, unset=("XLA_FLAGS",), RTPU_CPU_ISA_CAP="0")
    assert kept.returncode == 0, kept.stderr
    assert kept.stdout.splitlines() == ["", "2.0"]
