# Sourced by the other scripts: points RTPU_PLUGIN at the CPU plugin in .venv
# unless the caller chose a plugin already.
if [[ -z "${RTPU_PLUGIN:-}" ]]; then
  RTPU_PLUGIN=$(.venv/bin/python -c \
    'import os, xla_plugins.xla_cpu_pjrt as p; print(os.path.join(os.path.dirname(p.__file__), "xla_cpu_pjrt.so"))')
  export RTPU_PLUGIN
fi
