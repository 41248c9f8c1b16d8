#!/usr/bin/env bash
# Usage: torch-venv.sh DIR - make (or reuse) a Python venv at DIR with PyTorch's torchrun.
# torch 2.11.0 goes in without its CUDA wheels: it uses the machine's CUDA 13.0 libraries plus
# the three it links that the toolkit lacks; where that does not import, torch's full set.
# Prints torchrun's path on the last line. Exits 77 (ctest skip) with a one-line reason when
# PyPI cannot be reached or the install fails, 2 on bad usage.
set -u

TORCH=torch==2.11.0
# Linked by torch but not part of the machine's CUDA toolkit (same pins as torch 2.11.0).
CUDA_EXTRA=(nvidia-cufile==1.15.1.6 nvidia-cusparselt-cu13==0.8.0 nvidia-nvshmem-cu13==3.4.5)
# torch's own pure-Python requirements, with theirs.
PURE=(filelock 'typing-extensions>=4.10.0' 'setuptools<82' 'sympy>=1.13.3' 'networkx>=2.5.1'
      jinja2 'fsspec>=0.8.5' 'mpmath>=1.1,<1.4' 'MarkupSafe>=2.0')
. "$(dirname "$0")/venv-lib.sh"
venv_open torch-venv "$@"

works() { [ -x "$dir/bin/torchrun" ] && "$py" -W ignore -c 'import torch.distributed.run' >/dev/null 2>&1; }

if works; then
    echo "$dir/bin/torchrun"
    exit 0
fi

venv_make
pip_ index versions torch --retries 0 || skip "PyPI cannot be reached: $(why)"
pip_ install --no-deps "$TORCH" "${CUDA_EXTRA[@]}" "${PURE[@]}" || skip "pip install failed: $(why)"
if ! works; then
    pip_ install "$TORCH" || skip "pip install of torch's dependencies failed: $(why)"
fi
works || skip "torch does not import: $("$py" -W ignore -c 'import torch.distributed.run' 2>&1 | tail -n1)"
echo "$dir/bin/torchrun"
